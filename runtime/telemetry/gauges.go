package telemetry

import "time"

// GaugeOption tunes the database gauges (saga.RegisterGauges,
// outbox.RegisterGauges).
type GaugeOption func(*gaugeConfig)

type gaugeConfig struct {
	queryTimeout    time.Duration
	stuckGrace      time.Duration
	includeTerminal bool
}

// WithQueryTimeout bounds the queries of one collection; default 5 s.
func WithQueryTimeout(d time.Duration) GaugeOption {
	return func(c *gaugeConfig) { c.queryTimeout = d }
}

// WithStuckGrace is how far past due an instance must be to count as stuck
// (see saga.StuckRule): 0 keeps the default saga.DefaultStuckGrace, a negative
// value means none, as for the admin server's Config.StuckGrace. Give both
// the same value, so that the console lists what the gauge counts.
func WithStuckGrace(d time.Duration) GaugeOption {
	return func(c *gaugeConfig) {
		if d != 0 {
			c.stuckGrace = d
		}
	}
}

// WithDefaultSLA does nothing.
//
// Deprecated: it was described as the limit for steps without a timeout,
// but every step has one (sagadef.Definition.Compile refuses a step
// without), so it never applied; stuck instances follow saga.StuckRule.
func WithDefaultSLA(time.Duration) GaugeOption {
	return func(*gaugeConfig) {}
}

// WithTerminalStates makes saga.instances count terminal states (COMPLETED,
// FAILED, CANCELLED) too. Off by default: those rows only grow, and counting
// them on every scrape costs a scan of the table; the saga.transitions
// counter gives their rates.
func WithTerminalStates() GaugeOption {
	return func(c *gaugeConfig) { c.includeTerminal = true }
}

// GaugeConfig is the database gauges' settings the options give, read by
// the packages that own the gauges' tables (saga.RegisterGauges,
// outbox.RegisterGauges).
type GaugeConfig struct {
	// QueryTimeout bounds the queries of one collection.
	QueryTimeout time.Duration
	// StuckGrace is WithStuckGrace's value: 0 for the default
	// (saga.DefaultStuckGrace), negative for none.
	StuckGrace time.Duration
	// IncludeTerminal is WithTerminalStates.
	IncludeTerminal bool
}

// NewGaugeConfig returns the settings opts give.
func NewGaugeConfig(opts ...GaugeOption) GaugeConfig {
	c := gaugeConfig{queryTimeout: 5 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	return GaugeConfig{QueryTimeout: c.queryTimeout, StuckGrace: c.stuckGrace, IncludeTerminal: c.includeTerminal}
}
