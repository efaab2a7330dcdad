package callback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/protosaga/saga/runtime/internal/txq"
)

// Payload is the JSON body of a callback (docs/callbacks.md documents it).
type Payload struct {
	// CallbackID is the delivery's stable id, also sent as Saga-Callback-Id.
	CallbackID string `json:"callbackId"`
	// Event is "saga.completed", "saga.failed", "saga.cancelled" or
	// "saga.manual_review".
	Event       string    `json:"event"`
	SagaType    string    `json:"sagaType"`
	SagaID      string    `json:"sagaId"`
	BusinessKey string    `json:"businessKey"`
	State       string    `json:"state"`
	OccurredAt  time.Time `json:"occurredAt"`
	// Reason says why a saga failed or waits in manual review.
	Reason string `json:"reason,omitempty"`
	// Data is the saga data as protobuf JSON, when the contract includes it.
	Data json.RawMessage `json:"data,omitempty"`
}

// EventFor returns the payload event of a saga state ("COMPLETED" →
// "saga.completed").
func EventFor(state string) string { return "saga." + strings.ToLower(state) }

// Delivery is one callback to write.
type Delivery struct {
	// Payload is the body; its CallbackID is the row's id (a UUID).
	Payload Payload
	// URL is the target the request registered; Client names a client
	// whose endpoint the dispatcher looks up. Exactly one is set.
	URL, Client string
}

// ErrNoTarget is matched by the error EnqueueTx returns for a delivery with
// neither or both of URL and Client.
var ErrNoTarget = errors.New("callback needs exactly one of a URL and a client")

const insertSQL = `INSERT INTO saga_callback (id, saga_id, saga_type, event, url, client, endpoint_key, body, parked_at, park_reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $9 <> '' THEN now() END, $9)`

// EnqueueTx writes d in tx, to be delivered once tx commits. A URL that
// cannot be delivered to (not absolute http or https) is written parked,
// with the reason, so operators see it; it does not fail the transaction.
func EnqueueTx(ctx context.Context, tx pgx.Tx, d Delivery) error {
	p := d.Payload
	if (d.URL == "") == (d.Client == "") {
		return fmt.Errorf("callback %s for saga %s: %w", p.CallbackID, p.SagaID, ErrNoTarget)
	}
	body, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("callback %s for saga %s: encode payload: %w", p.CallbackID, p.SagaID, err)
	}
	key, parkReason := "client:"+d.Client, ""
	if d.URL != "" {
		key, err = endpointKey(d.URL)
		if err != nil {
			key, parkReason = "invalid", err.Error()
		}
	}
	return txq.Exec(ctx, tx, func(_ pgconn.CommandTag, err error) error {
		if err != nil {
			return fmt.Errorf("write callback %s (%s) for saga %s: %w", p.CallbackID, p.Event, p.SagaID, err)
		}
		return nil
	}, insertSQL, p.CallbackID, p.SagaID, p.SagaType, p.Event, d.URL, d.Client, key, body, parkReason)
}

// endpointKey returns the concurrency key of a URL: its scheme and host.
func endpointKey(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("callback URL %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("callback URL %q: want an absolute http or https URL", raw)
	}
	if u.User != nil {
		return "", fmt.Errorf("callback URL %q: credentials in the URL are refused", u.Redacted())
	}
	return u.Scheme + "://" + strings.ToLower(u.Host), nil
}
