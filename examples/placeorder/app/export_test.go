package app

// PassCrashPoint records one passage of p, for tests.
func PassCrashPoint(c *Crashes, p CrashPoint) { c.pass(p) }
