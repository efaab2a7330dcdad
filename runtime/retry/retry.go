package retry

import (
	"errors"
	"fmt"
	"time"
)

// Policy is a bounded retry schedule.
type Policy struct {
	// Tiers are the delays before the second, third, ... delivery. When
	// there are more retries than tiers, the last tier is reused.
	Tiers []time.Duration
	// MaxAttempts is the total number of deliveries allowed, the first one
	// included. 1 means no retries.
	MaxAttempts int
}

// Default returns the default policy: waits of 1s, 10s and 60s (60s reused)
// and at most 5 deliveries.
func Default() Policy {
	return Policy{
		Tiers:       []time.Duration{time.Second, 10 * time.Second, time.Minute},
		MaxAttempts: 5,
	}
}

// IsZero reports whether p is the zero policy (callers usually replace it
// with [Default]).
func (p Policy) IsZero() bool {
	return len(p.Tiers) == 0 && p.MaxAttempts == 0
}

// Validate reports whether p can be declared and applied: MaxAttempts is at
// least 1; when retries are allowed there is at least one tier; every tier
// is positive, a whole number of milliseconds, and longer than the one
// before.
func (p Policy) Validate() error {
	var errs []error
	if p.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("retry policy: MaxAttempts is %d, want at least 1", p.MaxAttempts))
	}
	if p.MaxAttempts > 1 && len(p.Tiers) == 0 {
		errs = append(errs, fmt.Errorf("retry policy: MaxAttempts %d needs at least one tier", p.MaxAttempts))
	}
	for i, d := range p.Tiers {
		switch {
		case d <= 0:
			errs = append(errs, fmt.Errorf("retry policy: tier %d is %v, want a positive duration", i, d))
		case d%time.Millisecond != 0:
			errs = append(errs, fmt.Errorf("retry policy: tier %d is %v, want whole milliseconds", i, d))
		case i > 0 && d <= p.Tiers[i-1]:
			errs = append(errs, fmt.Errorf("retry policy: tier %d (%v) is not longer than tier %d (%v)", i, d, i-1, p.Tiers[i-1]))
		}
	}
	return errors.Join(errs...)
}

// TierFor returns the delay before the delivery that follows failed attempt
// attempt (1 = the first delivery), and false when no further delivery is
// allowed: attempt has reached MaxAttempts, attempt is below 1, or the
// policy has no tiers.
func (p Policy) TierFor(attempt int) (time.Duration, bool) {
	if attempt < 1 || attempt >= p.MaxAttempts || len(p.Tiers) == 0 {
		return 0, false
	}
	i := min(attempt-1, len(p.Tiers)-1)
	return p.Tiers[i], true
}
