// Package pypayment runs the Place Order saga's payment service written in
// Python (payment.py, next to this file) instead of Go: a participant built
// on docs/wire.md alone, with Debian's python3-pika, python3-psycopg2 and
// python3-protobuf and message classes protoc's Python plugin generates from
// the same .proto files. It keeps its own inbox, once and outbox tables
// (schema.sql) and declares its queues from the package's generated
// topology.saga.json.
//
// The package holds only its test: TestPythonPayment generates the Python
// classes, starts a Go host with every other participant and the saga
// (examples/placeorder/app), starts payment.py, and runs orders through the
// happy path, a declined card (the reservation is compensated), the same
// command delivered twice, and a command resent after its step timed out.
package pypayment
