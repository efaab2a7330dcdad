package model

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/compiler/protogen"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
	"github.com/protosaga/saga/runtime/retry"
)

// RetryPolicy returns the retry policy the review assumes for a work queue
// whose messages declare none: the one the generated Topology function
// declares tier queues for (retry.Default()). A host that configures its
// own for such queues (host.Config.Retry) is not seen by the review.
func RetryPolicy() retry.Policy { return retry.Default() }

// RetryDelay returns how long after its first delivery p may deliver a
// message again: the sum of the waits before every further delivery
// (1s + 10s + 1m + 1m = 2m11s for retry.Default()).
func RetryDelay(p retry.Policy) time.Duration {
	var sum time.Duration
	for attempt := 1; ; attempt++ {
		d, ok := p.TierFor(attempt)
		if !ok {
			return sum
		}
		sum = saturatingAdd(sum, d)
	}
}

// tierList prints the waits of p in order ("1s, 10s, 1m0s, 1m0s").
func tierList(p retry.Policy) string {
	var waits []string
	for attempt := 1; ; attempt++ {
		d, ok := p.TierFor(attempt)
		if !ok {
			return strings.Join(waits, ", ")
		}
		waits = append(waits, d.String())
	}
}

// QueueRetry returns the retry policy of the queue that consumes m when the
// contract declares it (m.Retry), else the one the review assumes
// ([RetryPolicy]).
func QueueRetry(m *Message) retry.Policy {
	if m != nil && m.Retry != nil {
		return *m.Retry
	}
	return RetryPolicy()
}

// retryPolicy reads a message's declared retry policy. It reports what is
// invalid (rule retry-policy) and returns nil then; retry on a message no
// generated queue consumes by it is an option-misuse finding.
func (b *builder) retryPolicy(f *protogen.File, p []int32, m *Message, o *sagav1.Retry) *retry.Policy {
	switch {
	case m.Kind == sagav1.Kind_KIND_COMMAND && m.Owner == "":
		b.errorf(f, p, "option-misuse", "remove retry; it declares the policy of a participant's queue, and a command without owner is consumed by its saga's queue",
			"%s is a command without owner; retry applies to the queue of a command's owner", m.FullName)
		return nil
	case m.Kind == sagav1.Kind_KIND_EVENT && len(m.Subscribers) == 0:
		b.errorf(f, p, "option-misuse", "remove retry, or name the event's subscribers; retry declares the policy of their queues",
			"%s is an event without subscribers; retry applies to its subscribers' queues", m.FullName)
		return nil
	case m.Kind != sagav1.Kind_KIND_COMMAND && m.Kind != sagav1.Kind_KIND_EVENT:
		b.errorf(f, p, "option-misuse", "remove retry; a reply is consumed by its saga's queue, whose policy is the host's",
			"%s is %s; only commands with an owner and events with subscribers declare a retry policy", m.FullName, article(kindName(m.Kind)))
		return nil
	}
	pol := retry.Policy{MaxAttempts: int(o.GetMaxAttempts())}
	ok := true
	for i, s := range o.GetTiers() {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			b.errorf(f, path(p, retryTiers, int32(i)), "retry-policy", "write a positive Go duration such as \"500ms\", \"5s\" or \"1m\"",
				"%s: invalid retry tier %q", m.FullName, s)
			ok = false
			continue
		}
		pol.Tiers = append(pol.Tiers, d)
	}
	if !ok {
		return nil
	}
	var bad []string
	if pol.MaxAttempts < 1 {
		bad = append(bad, fmt.Sprintf("max_attempts is %d, want at least 1", pol.MaxAttempts))
	}
	if pol.MaxAttempts > 1 && len(pol.Tiers) == 0 {
		bad = append(bad, fmt.Sprintf("max_attempts %d needs at least one tier", pol.MaxAttempts))
	}
	for i, d := range pol.Tiers {
		switch {
		case d%time.Millisecond != 0:
			bad = append(bad, fmt.Sprintf("tier %s is not a whole number of milliseconds", d))
		case i > 0 && d <= pol.Tiers[i-1]:
			bad = append(bad, fmt.Sprintf("tier %s is not longer than the tier before it (%s)", d, pol.Tiers[i-1]))
		}
	}
	if len(bad) > 0 || pol.Validate() != nil {
		b.errorf(f, p, "retry-policy", "set max_attempts to at least 1 and tiers in whole milliseconds, each longer than the one before; e.g. {tiers: [\"1s\", \"30s\"], max_attempts: 4}",
			"%s: invalid retry: %s", m.FullName, strings.Join(bad, "; "))
		return nil
	}
	return &pol
}

// samePolicy reports whether two declared policies (nil: none) are equal.
func samePolicy(a, b *retry.Policy) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.MaxAttempts == b.MaxAttempts && slices.Equal(a.Tiers, b.Tiers)
}

// policyString prints a declared policy as the contract writes it.
func policyString(p *retry.Policy) string {
	if p == nil {
		return "no retry"
	}
	var tiers []string
	for _, d := range p.Tiers {
		tiers = append(tiers, strconv.Quote(d.String()))
	}
	return fmt.Sprintf("retry {tiers: [%s], max_attempts: %d}", strings.Join(tiers, ", "), p.MaxAttempts)
}

// queueRetries checks that the messages of each generated queue declare
// one retry policy (or none): a queue has one set of retry tier queues.
// The queues are a command owner's per Go package and a subscriber's per
// Go package.
func (b *builder) queueRetries(msgs []*Message) {
	first := map[string]*Message{}
	check := func(key, queue string, m *Message) {
		prev, ok := first[key]
		if !ok {
			first[key] = m
			return
		}
		if samePolicy(prev.Retry, m.Retry) {
			return
		}
		at := m
		if !m.File.Generate {
			at, prev = prev, m
		}
		optPath := func(x *Message) []int32 { return path(x.Proto.Location.Path, fieldMessageOptions, extMessage) }
		b.errorf(at.File, optPath(at), "retry-policy", "declare the same retry on every message of the queue, or on none",
			"%s declares %s, but %s (%s), consumed by the same queue %s, declares %s; a queue has one retry policy",
			at.FullName, policyString(at.Retry), prev.FullName, locate(prev.File, optPath(prev)), queue, policyString(prev.Retry))
	}
	for _, m := range msgs {
		if m.Kind == sagav1.Kind_KIND_COMMAND && m.Owner != "" {
			check(string(m.File.GoImportPath)+" owner "+m.Owner, ParticipantQueue(m.Owner), m)
		}
	}
	for _, m := range msgs {
		for _, svc := range m.Subscribers {
			check(string(m.File.GoImportPath)+" subscriber "+svc, "of subscriber "+svc, m)
		}
	}
}

// expiryRetries reports a message whose time to be received ends before its
// queue's retry tiers do: a delivery that failed and waits in a tier past
// the expiry is parked as expired when it comes back, so the later tiers
// never retry anything.
func (b *builder) expiryRetries(msgs []*Message) {
	for _, m := range msgs {
		consumed := (m.Kind == sagav1.Kind_KIND_COMMAND && m.Owner != "") || (m.Kind == sagav1.Kind_KIND_EVENT && len(m.Subscribers) > 0)
		if m.TimeToBeReceived <= 0 || !consumed {
			continue
		}
		pol := QueueRetry(m)
		delay := RetryDelay(pol)
		if delay < m.TimeToBeReceived {
			continue
		}
		source := "retry.Default(), which its queue uses when it declares no retry"
		if m.Retry != nil {
			source = "its declared retry"
		}
		b.report(m.File, path(m.Proto.Location.Path, fieldMessageOptions, extMessage, msgTimeToReceive), true, "expiry-retry",
			fmt.Sprintf("raise time_to_be_received above %s or declare shorter retry tiers (the review assumes %s)", delay, source),
			"%s expires %s after it is sent, but its queue's retry tiers (%s) deliver it again up to %s later: a retry past the expiry parks it as expired",
			m.FullName, m.TimeToBeReceived, tierList(pol), delay)
	}
}
