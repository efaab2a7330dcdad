package consumer

import "errors"

// SetAfterCommit installs a hook that runs after a batch committed and
// before anything of it is acknowledged or routed; a non-nil error simulates
// a crash at that point (Run returns it).
func SetAfterCommit(c *Consumer, f func(messageIDs []string) error) { c.afterCommit = f }

// SetBeforeCommit installs a hook that runs once a batch's writes are all
// sent (staged ones too), just before its COMMIT.
func SetBeforeCommit(c *Consumer, f func()) { c.beforeCommit = f }

// SetOnSettle installs a hook told about every acknowledged delivery and
// its outcome ("done", "duplicate", "retry", "park").
func SetOnSettle(c *Consumer, f func(messageID, outcome string)) { c.onSettle = f }

// Buffered returns how many deliveries wait for a worker in the running
// session.
func Buffered(c *Consumer) int {
	s := c.current.Load()
	if s == nil {
		return 0
	}
	return len(s.work)
}

// Paths returns how many batch transactions committed on the fast path and
// how many fast-path attempts fell back to a savepoint per delivery.
func Paths(c *Consumer) (fast, fallBack int64) { return c.fast.Load(), c.fallBack.Load() }

// Pruned is how many inbox claims c deleted (KeepClaims).
func Pruned(c *Consumer) int64 { return c.pruned.Load() }

// Interrupted records that c saw the suspect handling of messageID end
// with an error (see interruptedSet).
func Interrupted(c *Consumer, messageID string) {
	c.interrupted.add(messageID, errors.New("seen failing"))
}
