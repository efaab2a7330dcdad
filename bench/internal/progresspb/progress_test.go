package progresspb_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/bench/internal/progresspb"
	"github.com/protosaga/saga/runtime/sagadef"
)

// samples are progress records as the instance tables hold them: a Place
// Order saga at its third step and at its end (copied from a sagabench
// run's rows), and a trip saga waiting on a parallel group of three as a
// child of another saga, with a cancel recorded.
func samples() map[string]sagadef.Progress {
	at := time.Date(2026, 12, 2, 14, 31, 7, 123456000, time.UTC)
	return map[string]sagadef.Progress{
		"placeorder-step3": {
			Completed: []string{"ReserveInventory", "AuthorizePayment"},
			Outcomes: map[string]string{
				"AuthorizePayment": "shop.payment.v1.PaymentAuthorized",
				"ReserveInventory": "shop.inventory.v1.InventoryReserved",
			},
			Sent: map[string]string{
				"01a2372b-20a2-78de-a598-2db351726a10": "ReserveInventory",
				"01a2372b-45e1-7a27-98f8-793d93091e11": "AuthorizePayment",
				"01a2372b-4a46-7476-9644-6100357f884c": "ScheduleShipping",
			},
		},
		"placeorder-completed": {
			Completed: []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping", "ApproveOrder"},
			Outcomes: map[string]string{
				"ApproveOrder":     "shop.order.v1.OrderApproved",
				"AuthorizePayment": "shop.payment.v1.PaymentAuthorized",
				"ReserveInventory": "shop.inventory.v1.InventoryReserved",
				"ScheduleShipping": "shop.shipping.v1.ShippingScheduled",
			},
			Sent: map[string]string{
				"01a2372a-b6dd-7251-b212-091eb7850554": "ReserveInventory",
				"01a2372a-cb50-7a5f-b7f8-e4413bea3b32": "AuthorizePayment",
				"01a2372a-cc99-7459-b2df-3d532cf27ca7": "ScheduleShipping",
				"01a2372a-cd4a-70d0-bd49-bab99abaedfd": "ApproveOrder",
			},
		},
		"trip-group": {
			Completed: []string{"ChargeDeposit"},
			Outcomes:  map[string]string{"ChargeDeposit": "travel.payment.v1.DepositCharged"},
			Sent: map[string]string{
				"01a2372b-20a2-78de-a598-2db351726a11": "ChargeDeposit",
				"01a2372b-45e1-7a27-98f8-793d93091e12": "BookFlight",
				"01a2372b-4a46-7476-9644-6100357f8843": "BookHotel",
				"01a2372b-4a46-7476-9644-6100357f8844": "BookCar",
			},
			OperatorRetries: map[string]int{"travel.reservation.v1.BookHotel": 1},
			Cancel:          &sagadef.Cancellation{RequestedBy: "traveller", Reason: "plans changed", MessageID: "01a2372b-4a46-7476-9644-6100357f8845"},
			Parent: &sagadef.Parent{SagaType: "travel.trip.v1.PlanHoliday", SagaID: "01a2372b-0000-7476-9644-6100357f8846",
				CorrelationID: "holiday-42", StartMessageID: "01a2372b-0000-7476-9644-6100357f8847",
				Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			Group: &sagadef.GroupProgress{Name: "Reserve", TimeoutAt: at.Add(time.Minute), Members: []sagadef.MemberProgress{
				{Step: "BookFlight", Pending: "01a2372b-45e1-7a27-98f8-793d93091e12", Attempt: 1, TimeoutAt: at.Add(30 * time.Second)},
				{Step: "BookHotel", Pending: "01a2372b-4a46-7476-9644-6100357f8843", Attempt: 2, TimeoutAt: at.Add(30 * time.Second)},
				{Step: "BookCar", Pending: "01a2372b-4a46-7476-9644-6100357f8844", Attempt: 1, TimeoutAt: at.Add(30 * time.Second)},
			}},
		},
	}
}

// toPB and fromPB convert as a protobuf-encoding store would: their cost
// is part of the encoding's.
func toPB(p sagadef.Progress) *progresspb.Progress {
	out := &progresspb.Progress{
		Completed: p.Completed, Compensated: p.Compensated, Outcomes: p.Outcomes, Sent: p.Sent,
		Skipped: p.Skipped, Stopped: p.Stopped, SentCompensations: p.SentCompensations,
		CompensationOutcomes: p.CompensationOutcomes, ReviewFrom: p.ReviewFrom, Deferrals: int64(p.Deferrals),
	}
	if len(p.OperatorRetries) > 0 {
		out.OperatorRetries = make(map[string]int64, len(p.OperatorRetries))
		for k, v := range p.OperatorRetries {
			out.OperatorRetries[k] = int64(v)
		}
	}
	if c := p.Cancel; c != nil {
		out.Cancel = &progresspb.Cancellation{RequestedBy: c.RequestedBy, Reason: c.Reason, MessageId: c.MessageID}
	}
	if r := p.Parent; r != nil {
		out.Parent = &progresspb.Parent{SagaType: r.SagaType, SagaId: r.SagaID, CorrelationId: r.CorrelationID,
			StartMessageId: r.StartMessageID, CancelMessageId: r.CancelMessageID, Traceparent: r.Traceparent, Tracestate: r.Tracestate}
	}
	if r := p.ChildReview; r != nil {
		out.ChildReview = &progresspb.ChildReview{Step: r.Step, Reason: r.Reason}
	}
	if g := p.Group; g != nil {
		out.Group = &progresspb.Group{Name: g.Name, TimeoutAtUs: g.TimeoutAt.UnixMicro()}
		for _, m := range g.Members {
			out.Group.Members = append(out.Group.Members, &progresspb.Member{Step: m.Step, Pending: m.Pending,
				Attempt: int64(m.Attempt), TimeoutAtUs: m.TimeoutAt.UnixMicro()})
		}
	}
	return out
}

func fromPB(p *progresspb.Progress) sagadef.Progress {
	out := sagadef.Progress{
		Completed: p.Completed, Compensated: p.Compensated, Outcomes: p.Outcomes, Sent: p.Sent,
		Skipped: p.Skipped, Stopped: p.Stopped, SentCompensations: p.SentCompensations,
		CompensationOutcomes: p.CompensationOutcomes, ReviewFrom: p.ReviewFrom, Deferrals: int(p.Deferrals),
	}
	if len(p.OperatorRetries) > 0 {
		out.OperatorRetries = make(map[string]int, len(p.OperatorRetries))
		for k, v := range p.OperatorRetries {
			out.OperatorRetries[k] = int(v)
		}
	}
	if c := p.Cancel; c != nil {
		out.Cancel = &sagadef.Cancellation{RequestedBy: c.RequestedBy, Reason: c.Reason, MessageID: c.MessageId}
	}
	if r := p.Parent; r != nil {
		out.Parent = &sagadef.Parent{SagaType: r.SagaType, SagaID: r.SagaId, CorrelationID: r.CorrelationId,
			StartMessageID: r.StartMessageId, CancelMessageID: r.CancelMessageId, Traceparent: r.Traceparent, Tracestate: r.Tracestate}
	}
	if r := p.ChildReview; r != nil {
		out.ChildReview = &sagadef.ChildReview{Step: r.Step, Reason: r.Reason}
	}
	if g := p.Group; g != nil {
		out.Group = &sagadef.GroupProgress{Name: g.Name, TimeoutAt: time.UnixMicro(g.TimeoutAtUs).UTC()}
		for _, m := range g.Members {
			out.Group.Members = append(out.Group.Members, sagadef.MemberProgress{Step: m.Step, Pending: m.Pending,
				Attempt: int(m.Attempt), TimeoutAt: time.UnixMicro(m.TimeoutAtUs).UTC()})
		}
	}
	return out
}

// TestRoundTrip checks that both encodings give back the same progress,
// the benchmarks' records and one with every field set, so that the
// benchmarks compare the same work.
func TestRoundTrip(t *testing.T) {
	all := samples()
	every := all["trip-group"]
	every.Compensated, every.Skipped, every.Stopped = []string{"ChargeDeposit"}, []string{"AddInsurance"}, []string{"BookCar"}
	every.SentCompensations = map[string]string{"01a2372b-4a46-7476-9644-6100357f8848": "ChargeDeposit"}
	every.CompensationOutcomes = map[string]string{"ChargeDeposit": "travel.payment.v1.DepositRefunded"}
	every.ReviewFrom, every.Deferrals = "RESERVE", 2
	parent := *every.Parent
	parent.CancelMessageID, parent.Tracestate = "01a2372b-4a46-7476-9644-6100357f8849", "vendor=1"
	every.Parent = &parent
	every.ChildReview = &sagadef.ChildReview{Step: "BookHotel", Reason: "card declined"}
	all["every-field"] = every
	for name, p := range all {
		j, err := json.Marshal(p)
		require.NoError(t, err, name)
		var fromJSON sagadef.Progress
		require.NoError(t, json.Unmarshal(j, &fromJSON), name)
		require.Equal(t, p, fromJSON, name)

		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(toPB(p))
		require.NoError(t, err, name)
		var m progresspb.Progress
		require.NoError(t, proto.Unmarshal(b, &m), name)
		require.Equal(t, p, fromPB(&m), name)
		t.Logf("%s: JSON %d bytes, protobuf %d bytes", name, len(j), len(b))
	}
}

func BenchmarkProgress(b *testing.B) {
	for name, p := range samples() {
		j, err := json.Marshal(p)
		require.NoError(b, err)
		pb, err := proto.MarshalOptions{Deterministic: true}.Marshal(toPB(p))
		require.NoError(b, err)
		b.Run(name+"/json/encode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := json.Marshal(p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/json/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var out sagadef.Progress
				if err := json.Unmarshal(j, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/proto/encode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := (proto.MarshalOptions{Deterministic: true}).Marshal(toPB(p)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/proto/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var m progresspb.Progress
				if err := proto.Unmarshal(pb, &m); err != nil {
					b.Fatal(err)
				}
				_ = fromPB(&m)
			}
		})
	}
}
