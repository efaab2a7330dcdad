package raw

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Shaped is one message as a publisher sends it: exchange, routing key and
// the AMQP message with its properties and headers.
type Shaped struct {
	Exchange, RoutingKey string
	Publishing           amqp.Publishing
}

// PublishShaped publishes msgs on one confirm-mode channel of a new
// connection to amqpURL, keeping at most window confirms outstanding, with
// the mandatory flag as given (returns are drained and counted as failures,
// as the relay counts them), and returns how many were confirmed and how
// long it took from the first publish to the last confirm. It is the
// relay's publishing without the relay's database work: the baseline the
// relay is compared with when msgs are the relay's own messages.
func PublishShaped(ctx context.Context, amqpURL string, msgs []Shaped, window int, mandatory bool) (Rate, error) {
	if window < 1 {
		return Rate{}, fmt.Errorf("window %d: want at least 1", window)
	}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return Rate{}, fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return Rate{}, fmt.Errorf("channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return Rate{}, fmt.Errorf("confirm mode: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window+1))
	returns := ch.NotifyReturn(make(chan amqp.Return, window+1))
	returned := 0
	start := time.Now()
	acked, outstanding := 0, 0
	wait := func() error {
		for {
			select {
			case <-returns:
				returned++
			case c, ok := <-confirms:
				if !ok {
					return errors.New("channel closed while waiting for confirms")
				}
				outstanding--
				if !c.Ack {
					return fmt.Errorf("publish %d nacked", c.DeliveryTag)
				}
				acked++
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	for i := range msgs {
		for outstanding >= window {
			if err := wait(); err != nil {
				return Rate{}, err
			}
		}
		m := &msgs[i]
		if err := ch.PublishWithContext(ctx, m.Exchange, m.RoutingKey, mandatory, false, m.Publishing); err != nil {
			return Rate{}, fmt.Errorf("publish message %d (%s): %w", i, m.Publishing.MessageId, err)
		}
		outstanding++
	}
	for outstanding > 0 {
		if err := wait(); err != nil {
			return Rate{}, err
		}
	}
	elapsed := time.Since(start)
	// A return precedes its message's confirm on the channel; drain what
	// is buffered.
	for len(returns) > 0 {
		<-returns
		returned++
	}
	if returned > 0 {
		return Rate{}, fmt.Errorf("%d of %d mandatory publishes returned unroutable", returned, len(msgs))
	}
	return Rate{N: acked, Elapsed: elapsed}, nil
}
