package retry

import (
	"math/rand/v2"
	"time"
)

// Backoff returns the wait before retry attempt (0-based): min doubled per
// attempt, capped at max, with "equal jitter" (a uniformly random value in
// [d/2, d]) so that many clients losing the broker at once do not return in
// lockstep.
func Backoff(attempt int, min, max time.Duration) time.Duration {
	d := min
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max || d <= 0 {
		d = max
	}
	half := d / 2
	return half + rand.N(d-half+1)
}
