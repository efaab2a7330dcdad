// Package broker is the runtime's only door to RabbitMQ: a reconnecting
// connection, the topology every saga needs (exchanges, quorum work queues,
// TTL retry tiers, parking lots) and a confirmed publisher.
//
// # Connections
//
// [Dial] returns a [Conn] that survives broker restarts and network cuts: it
// watches the connection's NotifyClose and dials again with exponential,
// jittered backoff. Channels die with their connection; callers take a new
// one from [Conn.Channel], which waits until the connection is back. Use
// separate Conns for publishing and consuming, so that flow control on a
// publishing connection never stalls consumers' acks. URLs may be amqps://
// (TLS from [ConnConfig]) and come from the environment ([URLFromEnv]);
// the password never appears in errors or logs ([Redact]). For a cluster,
// the URL is every node's URL, comma-separated: Conn dials them in turn
// and, when its connection is lost, moves to the next node.
//
// # Topology
//
// [WorkQueue] expands one logical queue into the queue, one TTL tier queue
// per retry delay and a parking lot. Retries never sleep in a consumer and
// never requeue (no hot loop): a failed delivery is republished into the
// tier for its attempt and acked; the tier's x-message-ttl and
// x-dead-letter-* arguments bring it back to the work queue. Queues are
// quorum queues unless told otherwise; a quorum work queue dead-letters
// into its parking lot what the broker gives up on (its delivery limit).
// [Declare] is idempotent;
// [Topology.DefinitionsJSON] renders the same topology for review and
// import.
//
// # Publishing
//
// [Publisher] is at-least-once: the channel is in confirm mode, a bounded
// window of publishes awaits its confirms, every publish is mandatory and
// returns are matched to messages by message id. A message counts as
// published only when the broker acked it and did not return it. A nack,
// return, confirm timeout or lost channel is reported per message, and the
// caller publishes those again — possibly creating duplicates, which
// consumers drop by message id (the inbox).
package broker
