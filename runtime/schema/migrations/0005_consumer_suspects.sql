-- Messages the broker delivered many times without an acknowledgement
-- (consumer.Config.MaxRedeliveries) that a consumer is handling alone: the
-- row is committed before the handler runs and deleted in the handler's
-- transaction, so a row still here when the message comes again means
-- handling it stopped the consumer (a crash, a hang), and it is parked.
CREATE TABLE saga_consumer_suspect (
  consumer text NOT NULL, message_id text NOT NULL,
  redeliveries integer NOT NULL,
  since timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id)
);
