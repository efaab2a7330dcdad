// Package service is the seam between generated code and what runs it:
// generated Register functions describe a contract package's participants
// and sagas to a [Registrar] (runtime/host's Host implements it), so that
// contract packages do not depend on the host and what it links (the admin
// console, the metrics exporter).
package service

import (
	"context"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/subscriber"
)

// Registrar takes a service's registrations. Errors are kept by the
// registrar too, so a registration whose error the caller dropped still
// stops the service from starting.
type Registrar interface {
	// AddParticipant registers a participant service.
	AddParticipant(Participant) error
	// AddSubscriber registers an event subscriber service.
	AddSubscriber(Subscriber) error
	// AddSaga registers a saga.
	AddSaga(Saga) error
	// SagaConfig is the engine configuration for saga fullName (pool,
	// clock, logger, telemetry, step timeouts).
	SagaConfig(fullName string) saga.Config
	// Fail records a registration that could not be made (a nil
	// implementation, a definition the runtime refuses) and returns err.
	Fail(err error) error
}

// Package is what generated code declares for one Go package of contracts
// (its SagaPackage function): the package's message types and its broker
// topology.
type Package struct {
	// Path is the Go import path of the package.
	Path string
	// Messages are the package's annotated message types.
	Messages []*message.Info
	// Topology returns the package's exchanges, work queues (with tier
	// queues for the policy and parking lots) and bindings.
	Topology func(broker.QueueType, retry.Policy) broker.Topology
	// Retry holds the retry policies the contract declares, by work
	// queue; the consumer of a queue without one uses the host's policy.
	Retry map[string]retry.Policy
}

// Participant is one service's command handling, as a generated
// Register<Service>Participant function adds it.
type Participant struct {
	// Service is the owner the contract names; it scopes the records that
	// make the service's effects happen once per command.
	Service string
	// Queue is the service's command queue.
	Queue string
	// Package declares the service's commands and their replies.
	Package Package
	// Func dispatches a command to the user's implementation.
	Func participant.Func
}

// SubscriberFunc is [subscriber.Func]: what a generated
// <Service>SubscriberFunc returns, named here so that generated code reaches
// it through this package.
type SubscriberFunc = subscriber.Func

// UnexpectedEvent is [subscriber.UnexpectedEvent]: the permanent error a
// generated subscriber returns for an event type it does not handle.
func UnexpectedEvent(service string, event message.Message) error {
	return subscriber.UnexpectedEvent(service, event)
}

// Subscriber is one service's event handling for one package's events, as
// a generated Register<Service>Subscriber function adds it.
type Subscriber struct {
	// Service is the subscribing service the contract names.
	Service string
	// Queue is the service's queue for the package's events; the consumer
	// of it dedupes deliveries by message id under this name.
	Queue string
	// Package declares the events and the queue's bindings.
	Package Package
	// Func dispatches an event to the user's implementation.
	Func subscriber.Func
}

// Saga is one saga type, as a generated Register<Saga> function adds it.
type Saga struct {
	// Engine runs the saga (built from Registrar.SagaConfig).
	Engine *saga.Engine
	// Queue is the saga's queue (replies, events, its start message).
	Queue string
	// Snake is the saga's snake_case name: its HTTP paths are
	// /sagas/<Snake>.
	Snake string
	// Package declares the saga.
	Package Package
	// Migrations create and evolve the saga's instance table.
	Migrations schema.Source
	// NewStart returns an empty start message (the start endpoint decodes
	// requests into it).
	NewStart func() message.Message
}

// Publish is what generated Publish<Msg> functions call: it writes m to the
// outbox in tx (see outbox.Publish) and returns its message id.
func Publish(ctx context.Context, tx pgx.Tx, m message.Message, meta message.Meta) (string, error) {
	return outbox.Publish(ctx, tx, m, meta)
}

// Schedule is what generated Schedule<Msg> functions call: it writes m in
// tx to be published at or after at (see outbox.Schedule) and returns its
// message id.
func Schedule(ctx context.Context, tx pgx.Tx, m message.Message, meta message.Meta, at time.Time) (string, error) {
	return outbox.Schedule(ctx, tx, m, meta, at)
}

// Migrations returns what a generated <Saga>Migrations function returns:
// the migrations of table in directory dir of fsys, the saga's embedded
// files, as a schema source (schema.Migrate applies them in file-name
// order, each once). dir must exist in fsys.
func Migrations(fsys fs.FS, dir, table string) func() schema.Source {
	// Sub fails only for a path that is not valid; generated code names a
	// directory of its own embedded tree.
	sub, _ := fs.Sub(fsys, dir)
	return func() schema.Source { return schema.Source{Name: table, FS: sub} }
}
