// Command exchangecost measures what RabbitMQ spends per persistent publish
// (300-byte body, pipelined confirms, one quorum queue) depending on how the
// message is routed and dressed: the default exchange, a direct exchange, a
// topic exchange, the mandatory flag, an alternate exchange on the direct
// exchange instead of the mandatory flag, envelope-sized headers and
// properties, the same header values packed into one header, and all of
// those together as the relay sends them. It reports msgs/s and the broker's
// CPU per message for every round and their medians with min–max. The
// broker's CPU is read from /proc for the node the management API at
// SAGA_RABBIT_API names, or for every beam.smp process when that is not set
// (then run it against a broker of its own).
//
//	source DIR/env.sh   # scripts/services.sh start DIR
//	go run ./cmd/exchangecost -n 30000 -rounds 2
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	n := flag.Int("n", 30000, "messages per measurement")
	window := flag.Int("window", 1024, "most unconfirmed publishes")
	rounds := flag.Int("rounds", 2, "rounds over every variant")
	match := flag.String("match", "", "measure only the variants whose name contains this")
	channels := flag.Int("channels", 1, "publish each measurement's messages on this many channels at once (n/channels each, window each)")
	flag.Parse()
	if *channels < 1 {
		fmt.Fprintln(os.Stderr, "exchangecost: -channels must be 1 or more")
		os.Exit(2)
	}
	if err := run(os.Getenv("SAGA_AMQP_URL"), os.Getenv("SAGA_RABBIT_API"), *match, *n, *window, *rounds, *channels); err != nil {
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

const (
	queue = "exchangecost.q"
	// unroutable is the alternate exchange of exchangecost.direct.ae and
	// unroutableQueue the queue bound to it, as a runtime would declare them
	// to keep messages no binding matches.
	unroutable      = "exchangecost.unroutable"
	unroutableQueue = "exchangecost.unroutable.q"
)

func run(amqpURL, api, match string, n, window, rounds, channels int) error {
	if amqpURL == "" {
		return errors.New("SAGA_AMQP_URL is not set (source the env.sh of scripts/services.sh start DIR)")
	}
	brokerCPU, err := brokerCPUReader(api)
	if err != nil {
		return err
	}
	conn, err := amqp.Dial(amqpURL)
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
		func() error { return ch.ExchangeDeclare(unroutable, "fanout", true, false, false, false, nil) },
		func() error {
			return ch.ExchangeDeclare("exchangecost.direct.ae", "direct", true, false, false, false,
				amqp.Table{"alternate-exchange": unroutable})
		},
		func() error {
			_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
			return err
		},
		func() error {
			_, err := ch.QueueDeclare(unroutableQueue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
			return err
		},
		func() error { return ch.QueueBind(unroutableQueue, "", unroutable, false, nil) },
		func() error {
			return ch.QueueBind(queue, "command.shop.inventory.v1.reserve", "exchangecost.direct.ae", false, nil)
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
		_, _ = ch.QueueDelete(unroutableQueue, false, false, false)
		for _, x := range []string{"exchangecost.topic", "exchangecost.direct", "exchangecost.direct.ae", unroutable} {
			_ = ch.ExchangeDelete(x, false, false)
		}
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
		{name: "direct exchange, mandatory", exchange: "exchangecost.direct", key: key, mandatory: true},
		{name: "direct exchange with an alternate exchange", exchange: "exchangecost.direct.ae", key: key},
		{name: "6 headers", key: queue, headers: headers},
		{name: "5 properties", key: queue, props: true},
		{name: "the 6 headers' values in 1 header", key: queue, headers: amqp.Table{"x-envelope": packed}},
		{name: "1 packed header + traceparent", key: queue, headers: amqp.Table{
			"x-envelope": packed, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		}},
		{name: "relay, direct", exchange: "exchangecost.direct", key: key, mandatory: true, headers: headers, props: true},
		{name: "relay, direct, alternate exchange instead of mandatory", exchange: "exchangecost.direct.ae", key: key, headers: headers, props: true},
		{name: "relay, topic", exchange: "exchangecost.topic", key: key, mandatory: true, headers: headers, props: true},
	}
	variants = slices.DeleteFunc(variants, func(v variant) bool { return !strings.Contains(v.name, match) })
	if len(variants) == 0 {
		return fmt.Errorf("no variant's name contains %q", match)
	}
	type figures struct{ rate, cpu []float64 }
	results := make([]figures, len(variants))
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
		for vi, v := range variants {
			for _, q := range []string{queue, unroutableQueue} {
				if _, err := ch.QueuePurge(q, false); err != nil {
					return fmt.Errorf("purge %s: %w", q, err)
				}
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
			rate, cpu := float64(n)/elapsed.Seconds(), (cpu1-cpu0).Seconds()*1e6/float64(n)
			results[vi].rate = append(results[vi].rate, rate)
			results[vi].cpu = append(results[vi].cpu, cpu)
			fmt.Printf("| %d | %s | %.0f | %.1f |\n", r, v.name, rate, cpu)
		}
	}
	fmt.Printf("\nmedians (min–max) over %d rounds\n\n| variant | msgs/s | broker CPU µs/msg |\n|---|---:|---:|\n", rounds)
	for vi, v := range variants {
		fmt.Printf("| %s | %s | %s |\n", v.name, spread(results[vi].rate, "%.0f"), spread(results[vi].cpu, "%.1f"))
	}
	return nil
}

// spread formats the median of xs and its min–max.
func spread(xs []float64, format string) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", med, s[0], s[len(s)-1])
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

// brokerCPUReader returns a reader of the broker's user+system CPU time:
// of the node the management API at api names, or of every beam.smp
// process when api is empty.
func brokerCPUReader(api string) (func() (time.Duration, error), error) {
	if api == "" {
		return func() (time.Duration, error) {
			out, err := exec.Command("pgrep", "-f", "beam.smp").Output()
			if err != nil {
				return 0, fmt.Errorf("find the broker (pgrep beam.smp): %w", err)
			}
			return cpuOf(strings.Fields(string(out))), nil
		}, nil
	}
	u, err := url.Parse(api)
	if err != nil {
		return nil, fmt.Errorf("SAGA_RABBIT_API: %w", err)
	}
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(api, "/")+"/nodes?columns=os_pid", nil)
	if err != nil {
		return nil, fmt.Errorf("SAGA_RABBIT_API: %w", err)
	}
	if pw, ok := u.User.Password(); ok {
		req.SetBasicAuth(u.User.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask the management API for the node's pid: %w", err)
	}
	defer resp.Body.Close()
	var nodes []struct {
		OSPid string `json:"os_pid"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ask the management API for the node's pid: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&nodes); err != nil {
		return nil, fmt.Errorf("read the management API's node list: %w", err)
	}
	if len(nodes) != 1 {
		return nil, fmt.Errorf("the management API lists %d nodes, want 1", len(nodes))
	}
	pid := nodes[0].OSPid
	return func() (time.Duration, error) { return cpuOf([]string{pid}), nil }, nil
}

// cpuOf is the user+system CPU time of the processes pids.
func cpuOf(pids []string) time.Duration {
	var ticks float64
	for _, pid := range pids {
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
	return time.Duration(ticks / 100 * float64(time.Second)) // USER_HZ is 100 on Linux
}
