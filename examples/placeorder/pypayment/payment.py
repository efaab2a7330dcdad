#!/usr/bin/python3
"""The Place Order saga's payment service, written without the Go runtime.

It implements the participant's side of docs/wire.md with Debian's
python3-pika, python3-psycopg2 and python3-protobuf, and message classes
that protoc's Python plugin generates from the same .proto files the Go
services use:

    protoc -I examples/placeorder -I options --python_out=OUT \\
        saga/v1/saga.proto shop/common/v1/common.proto shop/payment/v1/payment.proto
    PYTHONPATH=OUT python3 examples/placeorder/pypayment/payment.py

Environment: SAGA_PY_PG_DSN (a libpq connection string), SAGA_AMQP_URL, and
SAGA_PY_TOPOLOGY (the package's generated topology.saga.json, from which it
declares its queue, retry tiers, parking lot and binding). It prints one JSON
line per event on stdout ("ready" once it consumes).
"""

import datetime
import json
import os
import signal
import sys
import uuid

import pika
import psycopg2
from google.protobuf.message import DecodeError

from saga.v1 import saga_pb2
from shop.payment.v1 import payment_pb2

SERVICE = "payment"
QUEUE = "payment.commands"
MAX_ATTEMPTS = 5  # the runtime's retry.Default(): 5 deliveries
DECLINED_CARD = "tok_declined"
KINDS = {saga_pb2.KIND_COMMAND: ("command", "commands"), saga_pb2.KIND_EVENT: ("event", "events"),
         saga_pb2.KIND_REPLY: ("reply", "replies")}


class Permanent(Exception):
    """A message no retry can help: parked at once."""


def say(event, **fields):
    print(json.dumps(dict(event=event, **fields)), flush=True)


def words(name):
    """Split a message name as the generator does: "HTTPServerV2" -> http, server, v2."""
    out, cur = [], ""
    for i, r in enumerate(name):
        if r in "_-. ":
            out, cur = out + [cur] if cur else out, ""
            continue
        if r.isupper():
            prev_lower = i > 0 and (name[i - 1].islower() or name[i - 1].isdigit())
            prev_upper = i > 0 and name[i - 1].isupper()
            next_lower = i + 1 < len(name) and name[i + 1].islower()
            if cur and (prev_lower or (prev_upper and next_lower)):
                out, cur = out + [cur], ""
        cur += r
    return [w.lower() for w in out + ([cur] if cur else [])]


def contract(cls):
    """A message's exchange, routing key and schema version: its (saga.v1.message)
    option, or the defaults docs/wire.md gives."""
    desc = cls.DESCRIPTOR
    opt = desc.GetOptions().Extensions[saga_pb2.message]
    (kind, kinds), pkg = KINDS[opt.kind], desc.file.package
    rel = desc.full_name[len(pkg) + 1:]
    exchange = opt.exchange or "%s.%s" % (pkg, kinds)
    key = opt.routing_key or ".".join([kind, pkg.lower(), "-".join(words(rel))])
    return exchange, key, opt.schema_version or 1


REPLIES = {c.DESCRIPTOR.full_name: c for c in (payment_pb2.PaymentAuthorized, payment_pb2.PaymentAuthorizationFailed)}


def authorize(cur, cmd):
    """The business effect: authorize the amount, or decline it (a reply, not an error)."""
    amount = cmd.amount

    def journal(effect, detail):
        cur.execute("INSERT INTO shop_ledger (order_id, service, effect, detail) VALUES (%s, %s, %s, %s)",
                    (cmd.order_id, SERVICE, effect, detail))

    if cmd.card_token == DECLINED_CARD or amount.minor_units <= 0 or not amount.currency:
        reason = "card declined" if cmd.card_token == DECLINED_CARD else \
            "invalid amount %d %r" % (amount.minor_units, amount.currency)
        journal("declined", reason)
        return payment_pb2.PaymentAuthorizationFailed(order_id=cmd.order_id, reason=reason)
    auth = "auth_" + str(uuid.uuid4())
    cur.execute("INSERT INTO payment_authorizations (order_id, authorization_id, currency, minor_units) "
                "VALUES (%s, %s, %s, %s)", (cmd.order_id, auth, amount.currency, amount.minor_units))
    journal("authorized", "%d %s" % (amount.minor_units, amount.currency))
    return payment_pb2.PaymentAuthorized(order_id=cmd.order_id, authorization_id=auth)


COMMANDS = {payment_pb2.AuthorizePayment.DESCRIPTOR.full_name: (payment_pb2.AuthorizePayment, authorize)}


def header_int(headers, name, default=None):
    v = headers.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, str, bytes)):
        raise Permanent("envelope %s: value of type %s is not an integer" % (name, type(v).__name__))
    try:
        return int(v)
    except ValueError:
        raise Permanent('envelope %s: "%s" is not an integer' % (name, v))


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def rfc3339(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Participant:
    def __init__(self, dsn, amqp_url, topology):
        self.db = psycopg2.connect(dsn)
        with self.db, self.db.cursor() as cur:
            cur.execute(open(os.path.join(os.path.dirname(__file__), "schema.sql")).read())
        self.conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        self.consume_ch = self.conn.channel()
        self.publish_ch = self.conn.channel()
        self.publish_ch.confirm_delivery()
        self.tiers = self.declare(topology)

    def declare(self, path):
        """Declare what the generated topology file lists; return the retry
        tiers of QUEUE as (name, ttl ms), shortest first."""
        top = json.load(open(path))
        ch = self.consume_ch
        for x in top["exchanges"]:
            ch.exchange_declare(x["name"], exchange_type=x["type"], durable=x["durable"],
                                auto_delete=x["auto_delete"], internal=x["internal"], arguments=x["arguments"])
        for q in top["queues"]:
            ch.queue_declare(q["name"], durable=q["durable"], auto_delete=q["auto_delete"], arguments=q["arguments"])
        for b in top["bindings"]:
            ch.queue_bind(b["destination"], b["source"], routing_key=b["routing_key"], arguments=b["arguments"])
        tiers = [(q["name"], q["arguments"]["x-message-ttl"]) for q in top["queues"]
                 if q["name"].startswith(QUEUE + ".retry.")]
        return sorted(tiers, key=lambda t: t[1])

    def run(self):
        self.publish_pending()
        self.consume_ch.basic_qos(prefetch_count=16)
        self.consume_ch.basic_consume(QUEUE, self.on_message)
        say("ready", queue=QUEUE)
        try:
            self.consume_ch.start_consuming()
        except KeyboardInterrupt:
            pass
        self.conn.close()
        self.db.close()

    def on_message(self, ch, method, props, body):
        headers = dict(props.headers or {})
        try:
            cmd, handler = self.read(props, headers, body)
            outcome = self.apply(props, headers, cmd, handler)
        except Permanent as e:
            self.db.rollback()
            self.park(method, props, headers, body, "permanent", "permanent: " + str(e))
        except Exception as e:  # the database, a bug: unknown, retried through the tiers
            self.db.rollback()
            self.retry(method, props, headers, body, "unknown: %s: %s" % (type(e).__name__, e))
        else:
            self.publish_pending()
            say(outcome, message_id=props.message_id, type=props.type)
        ch.basic_ack(method.delivery_tag)

    def read(self, props, headers, body):
        """The envelope checks of docs/wire.md: a message failing them is parked."""
        if not props.message_id:
            raise Permanent("invalid envelope: envelope message id: missing")
        if not props.type:
            raise Permanent("invalid envelope: message %s: envelope type: missing" % props.message_id)
        try:
            version = header_int(headers, "x-schema-version")
        except Permanent as e:
            raise Permanent("invalid envelope: message %s: %s" % (props.message_id, e))
        if version is None:
            raise Permanent("invalid envelope: message %s: envelope x-schema-version: missing" % props.message_id)
        if not 1 <= version <= 2**31 - 1:
            raise Permanent("invalid envelope: message %s: envelope x-schema-version: %d is out of range [1, 2147483647]"
                            % (props.message_id, version))
        if props.type not in COMMANDS:
            raise Permanent('unknown message type "%s"' % props.type)
        cls, handler = COMMANDS[props.type]
        known = contract(cls)[2]
        if version > known:
            raise Permanent("schema version mismatch: %s version %d is newer than this consumer's version %d"
                            % (props.type, version, known))
        try:
            return cls.FromString(body), handler
        except DecodeError as e:
            raise Permanent("undecodable body: %s" % e)

    def apply(self, props, headers, cmd, handler):
        """One transaction: inbox, once record, effect, stored reply, outbox row."""
        with self.db, self.db.cursor() as cur:
            cur.execute("INSERT INTO payment_py_inbox (message_id) VALUES (%s) ON CONFLICT DO NOTHING", (props.message_id,))
            if cur.rowcount == 0:
                return "duplicate"  # this very message was handled: nothing again
            key = headers.get("x-idempotency-key")
            if not key:
                raise Permanent("participant %s: command %s has no idempotency key" % (SERVICE, props.type))
            once = "%s/%s" % (props.type, key)
            retry = header_int(headers, "x-saga-operator-retry", 0)
            if retry > 0:
                once += "#operator-retry-%d" % retry
            undoes = headers.get("x-saga-compensates")
            if undoes:  # the command this one compensates must not run after it
                cur.execute("INSERT INTO payment_py_once (once_key) VALUES (%s) ON CONFLICT DO NOTHING", (undoes,))
            cur.execute("INSERT INTO payment_py_once (once_key) VALUES (%s) ON CONFLICT DO NOTHING", (once,))
            if cur.rowcount == 1:
                reply, outcome = handler(cur, cmd), "handled"
                cur.execute("UPDATE payment_py_once SET reply_type = %s, reply_body = %s WHERE once_key = %s",
                            (reply.DESCRIPTOR.full_name, reply.SerializeToString(deterministic=True), once))
            else:  # a resend: answer with the first reply, or not at all
                cur.execute("SELECT reply_type, reply_body FROM payment_py_once WHERE once_key = %s", (once,))
                typ, stored = cur.fetchone()
                reply = REPLIES[typ].FromString(bytes(stored)) if typ else None
                outcome = "replayed" if reply else "done-before"
            if reply is not None:
                self.enqueue(cur, props, headers, reply)
            return outcome

    def enqueue(self, cur, props, headers, reply):
        """The reply's outbox row: what docs/wire.md says a reply carries."""
        exchange, key, version = contract(type(reply))
        at = now()
        h = {"x-schema-version": version, "x-causation-id": props.message_id, "x-occurred-at": rfc3339(at),
             "x-saga-once": SERVICE}
        for name in ("x-saga-id", "x-saga-type", "traceparent", "tracestate"):
            if headers.get(name):
                h[name] = headers[name]
        cur.execute("INSERT INTO payment_py_outbox (message_id, exchange, routing_key, message_type, correlation, "
                    "headers, occurred_at, body) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (str(uuid.uuid4()), exchange, key, reply.DESCRIPTOR.full_name, props.correlation_id or "",
                     json.dumps(h), at, reply.SerializeToString(deterministic=True)))

    def publish_pending(self):
        """Publish committed replies, each confirmed and routed, then mark it.
        A reply the broker does not take stays unpublished for the next call."""
        with self.db, self.db.cursor() as cur:
            cur.execute("SELECT id, message_id, exchange, routing_key, message_type, correlation, headers, occurred_at, body "
                        "FROM payment_py_outbox WHERE published_at IS NULL ORDER BY id")
            rows = cur.fetchall()
        for row_id, msg_id, exchange, key, typ, corr, h, at, body in rows:
            try:
                self.publish_ch.basic_publish(exchange, key, bytes(body), pika.BasicProperties(
                    content_type="application/x-protobuf", delivery_mode=2, message_id=msg_id, correlation_id=corr,
                    type=typ, timestamp=int(at.timestamp()), headers=h), mandatory=True)
            except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as e:
                say("unpublished", message_id=msg_id, error=str(e))
                return
            with self.db, self.db.cursor() as cur:
                cur.execute("UPDATE payment_py_outbox SET published_at = now() WHERE id = %s", (row_id,))

    def copy(self, method, props, headers, body, queue):
        """Publish the delivery again, through the default exchange to queue,
        with the retry or park headers; confirmed before the original is acked."""
        headers.pop("x-delivery-count", None)  # the broker's count of the original
        headers.setdefault("x-first-failure-at", rfc3339(now()))
        headers.setdefault("x-original-exchange", method.exchange)
        headers.setdefault("x-original-routing-key", method.routing_key)
        self.publish_ch.basic_publish("", queue, body, pika.BasicProperties(
            content_type=props.content_type, delivery_mode=2, message_id=props.message_id,
            correlation_id=props.correlation_id, type=props.type, timestamp=props.timestamp, headers=headers),
            mandatory=True)

    def retry(self, method, props, headers, body, error):
        try:
            attempt = header_int(headers, "x-attempt", 1)
        except Permanent:
            attempt = 1
        if attempt >= MAX_ATTEMPTS or not self.tiers:
            self.park(method, props, headers, body, "exhausted", error)
            return
        tier = self.tiers[min(attempt - 1, len(self.tiers) - 1)][0]
        headers["x-attempt"] = attempt + 1
        headers["x-last-error"] = error[:1024]
        self.copy(method, props, headers, body, tier)
        say("retry", message_id=props.message_id, type=props.type, tier=tier, error=error)

    def park(self, method, props, headers, body, cls, reason):
        headers.pop("x-last-error", None)
        headers.setdefault("x-attempt", 1)
        headers["x-park-class"] = cls
        headers["x-park-reason"] = reason[:1024]
        headers["x-original-queue"] = QUEUE
        self.copy(method, props, headers, body, QUEUE + ".parking")
        say("parked", message_id=props.message_id, type=props.type, park_class=cls, reason=reason)


def main():
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C: finish, close
    Participant(os.environ["SAGA_PY_PG_DSN"], os.environ["SAGA_AMQP_URL"], os.environ["SAGA_PY_TOPOLOGY"]).run()


if __name__ == "__main__":
    sys.exit(main())
