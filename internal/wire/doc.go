// Package wire holds no code: its tests check docs/wire.md, the wire
// protocol a participant in any language implements, against the runtime.
//
// TestWireExamples runs the Place Order saga's engine, relay, consumers and
// a participant against a real PostgreSQL and RabbitMQ and compares every
// derived section of docs/wire.md with what they put on the wire: a command
// as a participant receives it, a compensating command after a timeout, a
// reply as it must be published, a retry copy in its tier queue, a parked
// copy, and the reason each broken message is parked with.
// `go test ./internal/wire -update` rewrites those sections.
package wire
