// Command exchangecost measures what RabbitMQ spends per persistent publish
// (300-byte body, pipelined confirms, one quorum queue) depending on how the
// message is routed and dressed: the default exchange, a direct exchange, a
// topic exchange, the mandatory flag, envelope-sized headers and properties,
// the same header values packed into one header, and all of those together
// as the relay sends them. It reports msgs/s and the broker's CPU per message
// (from /proc of every beam.smp process, so run it against a broker of its
// own).
//
//	source DIR/env.sh   # scripts/services.sh start DIR
//	go run ./cmd/exchangecost -n 30000 -rounds 2
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	n := flag.Int("n", 30000, "messages per measurement")
	window := flag.Int("window", 1024, "most unconfirmed publishes")
	rounds := flag.Int("rounds", 2, "rounds over every variant")
	channels := flag.Int("channels", 1, "publish each measurement's messages on this many channels at once (n/channels each, window each)")
	flag.Parse()
	if *channels < 1 {
		fmt.Fprintln(os.Stderr, "exchangecost: -channels must be 1 or more")
		os.Exit(2)
	}
	if err := run(os.Getenv("SAGA_AMQP_URL"), *n, *window, *rounds, *channels); err != nil {
		fmt.Fprintln(os.Stderr, "exchangecost:", err)
		os.Exit(1)
	}
}

// variant is one way of publishing the same body.
type variant struct {
	name, exchange, key string
	mandatory           bool
	headers             amqp.Table
	props               bool // message id, correlation id, type, timestamp, app id
}

const queue = "exchangecost.q"

func run(url string, n, window, rounds, channels int) error {
	if url == "" {
		return errors.New("SAGA_AMQP_URL is not set (source the env.sh of scripts/services.sh start DIR)")
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	steps := []func() error{
		func() error { return ch.ExchangeDeclare("exchangecost.topic", "topic", true, false, false, false, nil) },
		func() error {
			return ch.ExchangeDeclare("exchangecost.direct", "direct", true, false, false, false, nil)
		},
		func() error {
			_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
			return err
		},
		func() error {
			return ch.QueueBind(queue, "command.shop.inventory.v1.#", "exchangecost.topic", false, nil)
		},
		func() error {
			return ch.QueueBind(queue, "command.shop.inventory.v1.reserve", "exchangecost.direct", false, nil)
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	}
	defer func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete("exchangecost.topic", false, false)
		_ = ch.ExchangeDelete("exchangecost.direct", false, false)
	}()
	headers := amqp.Table{
		"x-schema-version": int32(1), "x-saga-id": "0193a0c4-5b7e-7c4e-8f1a-0b7d2f7e9c11",
		"x-saga-type": "shop.order.v1.PlaceOrder", "x-causation-id": "0193a0c4-5b7e-7c4e-8f1a-0b7d2f7e9c12",
		"x-idempotency-key": "0193a0c4-5b7e-7c4e-8f1a-0b7d2f7e9c11", "x-occurred-at": time.Now().UTC().Format(time.RFC3339Nano),
	}
	// The same six values packed into one header, and into one header plus
	// the W3C traceparent: what the broker spends per header, not per byte.
	packed := fmt.Sprintf("1 %s %s %s %s %s", headers["x-saga-id"], headers["x-saga-type"],
		headers["x-causation-id"], headers["x-idempotency-key"], headers["x-occurred-at"])
	const key = "command.shop.inventory.v1.reserve"
	variants := []variant{
		{name: "default exchange", key: queue},
		{name: "direct exchange", exchange: "exchangecost.direct", key: key},
		{name: "topic exchange", exchange: "exchangecost.topic", key: key},
		{name: "mandatory", key: queue, mandatory: true},
		{name: "6 headers", key: queue, headers: headers},
		{name: "5 properties", key: queue, props: true},
		{name: "the 6 headers' values in 1 header", key: queue, headers: amqp.Table{"x-envelope": packed}},
		{name: "1 packed header + traceparent", key: queue, headers: amqp.Table{
			"x-envelope": packed, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		}},
		{name: "relay, direct", exchange: "exchangecost.direct", key: key, mandatory: true, headers: headers, props: true},
		{name: "relay, topic", exchange: "exchangecost.topic", key: key, mandatory: true, headers: headers, props: true},
	}
	pubs := make([]*publisher, channels)
	for i := range pubs {
		c, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("channel: %w", err)
		}
		if err := c.Confirm(false); err != nil {
			return fmt.Errorf("confirm mode: %w", err)
		}
		returns := c.NotifyReturn(make(chan amqp.Return, 16))
		go func() {
			for range returns {
			}
		}()
		pubs[i] = &publisher{ch: c, confirms: c.NotifyPublish(make(chan amqp.Confirmation, window+1))}
	}
	body := make([]byte, 300)
	fmt.Printf("%d channel(s), window %d each\n\n", channels, window)
	fmt.Printf("| round | variant | msgs/s | broker CPU µs/msg |\n|---|---|---:|---:|\n")
	for r := 1; r <= rounds; r++ {
		for _, v := range variants {
			if _, err := ch.QueuePurge(queue, false); err != nil {
				return fmt.Errorf("purge: %w", err)
			}
			pub := amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/octet-stream", Body: body, Headers: v.headers}
			if v.props {
				pub.MessageId, pub.CorrelationId = "0193a0c4-5b7e-7c4e-8f1a-0b7d2f7e9c13", "0193a0c4-5b7e-7c4e-8f1a-0b7d2f7e9c11"
				pub.Type, pub.Timestamp, pub.AppId = "shop.inventory.v1.ReserveInventory", time.Now(), "orders"
			}
			cpu0, err := brokerCPU()
			if err != nil {
				return err
			}
			start := time.Now()
			errs := make(chan error, channels)
			for i, p := range pubs {
				count := n / channels
				if i < n%channels {
					count++
				}
				go func() { errs <- p.publish(v, pub, count, window) }()
			}
			for range pubs {
				if err := <-errs; err != nil {
					return err
				}
			}
			elapsed := time.Since(start)
			cpu1, err := brokerCPU()
			if err != nil {
				return err
			}
			fmt.Printf("| %d | %s | %.0f | %.1f |\n", r, v.name, float64(n)/elapsed.Seconds(), (cpu1-cpu0).Seconds()*1e6/float64(n))
		}
	}
	return nil
}

// publisher is one channel in confirm mode.
type publisher struct {
	ch       *amqp.Channel
	confirms <-chan amqp.Confirmation
}

// publish sends n copies of pub as v says, with at most window unconfirmed.
func (p *publisher) publish(v variant, pub amqp.Publishing, n, window int) error {
	sent, out := 0, 0
	for sent < n || out > 0 {
		for out < window && sent < n {
			if err := p.ch.Publish(v.exchange, v.key, v.mandatory, false, pub); err != nil {
				return fmt.Errorf("%s: publish: %w", v.name, err)
			}
			sent++
			out++
		}
		c, ok := <-p.confirms
		if !ok {
			return fmt.Errorf("%s: channel closed", v.name)
		}
		if !c.Ack {
			return fmt.Errorf("%s: publish %d nacked", v.name, c.DeliveryTag)
		}
		out--
	}
	return nil
}

// brokerCPU is the user+system CPU time of every beam.smp process.
func brokerCPU() (time.Duration, error) {
	out, err := exec.Command("pgrep", "-f", "beam.smp").Output()
	if err != nil {
		return 0, fmt.Errorf("find the broker (pgrep beam.smp): %w", err)
	}
	var ticks float64
	for _, pid := range strings.Fields(string(out)) {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			continue // gone
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
		u, _ := strconv.ParseFloat(f[11], 64)
		k, _ := strconv.ParseFloat(f[12], 64)
		ticks += u + k
	}
	return time.Duration(ticks / 100 * float64(time.Second)), nil // USER_HZ is 100 on Linux
}
