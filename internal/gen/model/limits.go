package model

import (
	"fmt"
	"math"
	"strings"
	"time"

	"google.golang.org/protobuf/compiler/protogen"

	"github.com/protosaga/saga/runtime/broker"
)

// Name limits of PostgreSQL and RabbitMQ. Both refuse or silently change
// longer names, so the review refuses contracts whose generated names
// would not fit (rule name-length).
const (
	// maxPGIdentifier is PostgreSQL's identifier limit (NAMEDATALEN-1);
	// longer identifiers are truncated without error, so "<table>_state"
	// and "<table>_state_check" would become one name.
	maxPGIdentifier = 63
	// maxAMQPName is the AMQP 0-9-1 limit of queue and exchange names and
	// routing keys (a short string).
	maxAMQPName = 255
)

// tableSuffixes are appended to a saga's instance table name to form the
// identifiers its migrations declare (templates/saga_*.sql.tmpl).
// TestTableIdentifiersFit checks this list against the rendered SQL.
// PostgreSQL derives two more names itself (<table>_pkey and
// <table>_business_key_key); it shortens the table part of those to fit,
// so they never collide.
var tableSuffixes = []string{"_state", "_timeout_at", "_updated_at", "_state_check"}

// maxTable is the longest instance table name whose declared identifiers
// stay distinct once PostgreSQL has cut them to 63 bytes: it cuts them the
// same way wherever they are used, so a cut name works as long as it names
// one thing. "<table>_state" and "<table>_state_check" become one name
// first, at 57 bytes.
var maxTable = func() int {
	for n := maxPGIdentifier; ; n-- {
		table := strings.Repeat("t", n)
		seen := map[string]bool{truncateIdentifier(table): true}
		distinct := true
		for _, s := range tableSuffixes {
			id := truncateIdentifier(table + s)
			distinct = distinct && !seen[id]
			seen[id] = true
		}
		if distinct {
			return n
		}
	}
}()

// truncateIdentifier cuts s as PostgreSQL cuts an identifier (the names
// here are ASCII).
func truncateIdentifier(s string) string {
	if len(s) > maxPGIdentifier {
		return s[:maxPGIdentifier]
	}
	return s
}

// maxWorkQueue is the longest work queue name whose retry tier queues
// ("<queue>.retry.<ttl>", for any ttl a retry policy can hold) and parking
// lot fit AMQP's limit.
var maxWorkQueue = maxAMQPName - max(
	len(broker.TierQueue("", time.Duration(math.MaxInt64))),
	len(broker.ParkingQueue("")),
)

// checkTable reports a saga whose instance table name leaves no room for
// the identifiers derived from it.
func (b *builder) checkTable(f *protogen.File, p []int32, s *Saga) {
	if len(s.Table) <= maxTable {
		return
	}
	b.errorf(f, p, "name-length", fmt.Sprintf("shorten the saga name (name: \"...\"): \"saga_\" and its snake_case form may have at most %d bytes", maxTable),
		"saga %s: table name %s (%d bytes) is too long: PostgreSQL truncates identifiers to %d bytes, so %s_state and %s_state_check would be cut to one name",
		s.FullName, s.Table, len(s.Table), maxPGIdentifier, s.Table, s.Table)
}

// checkQueue reports a work queue name that leaves no room for its retry
// tier and parking queues; owner says whose queue it is.
func (b *builder) checkQueue(f *protogen.File, p []int32, owner, queue, hint string) {
	if len(queue) <= maxWorkQueue {
		return
	}
	b.errorf(f, p, "name-length", hint,
		"%s: queue %s (%d bytes) is too long: with a retry tier suffix (\".retry.<ttl>\") it would exceed AMQP's %d-byte limit; at most %d bytes",
		owner, queue, len(queue), maxAMQPName, maxWorkQueue)
}

// checkAMQPName reports a derived exchange name or routing key longer than
// AMQP allows (explicit ones are checked with their syntax).
func (b *builder) checkAMQPName(f *protogen.File, p []int32, msg, what, name string) {
	if len(name) <= maxAMQPName {
		return
	}
	b.errorf(f, p, "name-length", "set a shorter "+what+" explicitly, or shorten the proto package or message name",
		"%s: default %s %q (%d bytes) exceeds AMQP's %d-byte limit", msg, what, name, len(name), maxAMQPName)
}
