package model

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
)

// TestSourcePathFieldNumbers: the field numbers the review uses to find an
// option's file:line:col are the options' own, so a renumbered or added
// field cannot point diagnostics at another option.
func TestSourcePathFieldNumbers(t *testing.T) {
	t.Parallel()
	check := func(m protoreflect.ProtoMessage, want map[string]int32) {
		t.Helper()
		fields := m.ProtoReflect().Descriptor().Fields()
		for name, n := range want {
			f := fields.ByName(protoreflect.Name(name))
			if f == nil {
				t.Errorf("%s has no field %s", m.ProtoReflect().Descriptor().FullName(), name)
				continue
			}
			if got := int32(f.Number()); got != n {
				t.Errorf("%s.%s is field %d, the review's constant says %d", m.ProtoReflect().Descriptor().FullName(), name, got, n)
			}
		}
	}
	check(&sagav1.Message{}, map[string]int32{
		"kind": msgKind, "routing_key": msgRoutingKey, "exchange": msgExchange, "idempotency_key": msgIdempotencyKey,
		"correlation_field": msgCorrelation, "sensitive_fields": msgSensitive, "schema_version": msgSchemaVersion,
		"owner": msgOwner, "answers": msgAnswers, "subscribers": msgSubscribers, "retry": msgRetry,
		"time_to_be_received": msgTimeToReceive,
	})
	check(&sagav1.Retry{}, map[string]int32{"tiers": retryTiers, "max_attempts": retryMaxAttempts})
	check(&sagav1.Saga{}, map[string]int32{
		"name": sagaName, "start": sagaStart, "business_key": sagaBusinessKey, "deadline": sagaDeadline,
		"steps": sagaSteps, "service": sagaService, "cancel": sagaCancel, "callback": sagaCallback,
		"groups": sagaGroups, "replies": sagaReplies,
	})
	check(&sagav1.Cancel{}, map[string]int32{"message": cancelMessage, "requested_by": cancelRequestedBy, "reason": cancelReason})
	check(&sagav1.Callback{}, map[string]int32{"outcomes": callbackOutcomes, "url_field": callbackURLField, "client_field": callbackClientField})
	check(&sagav1.Replies{}, map[string]int32{"completed": repliesCompleted, "failed": repliesFailed, "cancelled": repliesCancelled})
	check(&sagav1.Group{}, map[string]int32{"name": groupName, "timeout": groupTimeout})
	check(&sagav1.Step{}, map[string]int32{
		"name": stepName, "role": stepRole, "command": stepCommand, "success": stepSuccess, "failure": stepFailure,
		"compensation": stepCompensation, "compensation_reply": stepCompensationReply,
		"compensation_failure": stepCompensationFailure, "timeout": stepTimeout, "on_timeout": stepOnTimeout,
		"max_attempts": stepMaxAttempts, "late_reply": stepLateReply, "external": stepExternal,
		"conditional": stepConditional, "group": stepGroup, "child": stepChild,
	})
	if got := int32(sagav1.E_Message.TypeDescriptor().Number()); got != extMessage {
		t.Errorf("extension saga.v1.message is %d, the review's constant says %d", got, extMessage)
	}
	if got := int32(sagav1.E_Saga.TypeDescriptor().Number()); got != extSaga {
		t.Errorf("extension saga.v1.saga is %d, the review's constant says %d", got, extSaga)
	}
}
