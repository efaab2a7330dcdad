package consumer

// SetAfterCommit installs a hook that runs after a batch committed and
// before anything of it is acknowledged or routed; a non-nil error simulates
// a crash at that point (Run returns it).
func SetAfterCommit(c *Consumer, f func(messageIDs []string) error) { c.afterCommit = f }

// SetOnSettle installs a hook told about every acknowledged delivery and
// its outcome ("done", "duplicate", "retry", "park").
func SetOnSettle(c *Consumer, f func(messageID, outcome string)) { c.onSettle = f }
