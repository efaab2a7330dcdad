# protoc-gen-saga — every target works on a fresh Debian 12 machine with Go installed.
# `make demo` and `make test` install and start their own PostgreSQL and RabbitMQ
# (scripts/services.sh) and stop them afterwards.

GO        ?= go
CACHE     := $(CURDIR)/.cache
BIN       := $(CACHE)/bin
# buf is pinned by tools/go.mod and built once per machine (about 5 minutes), outside the clone.
BUF_VERSION := $(shell sed -n 's/^\tgithub.com\/bufbuild\/buf \(v[^ ]*\).*/\1/p' tools/go.mod)
BUF       := $(HOME)/.cache/protosaga/buf-$(BUF_VERSION)/buf
# staticcheck (its default checks plus unused-code detection, U1000) runs in `make vet`; built once
# per machine from the module proxy, outside the clone.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(HOME)/.cache/protosaga/staticcheck-$(STATICCHECK_VERSION)/staticcheck
TESTFLAGS ?= -count=1 -timeout 15m
PKGS      ?= ./...

.PHONY: all build plugin generate check-generated fmt-check vet test test-matrix test-unit demo bench bench-hosts bench-peers bench-slowdisk soak buf-plugins buf-generate check-buf check-bufplugin services-start services-stop clean

all: build

## build: compile every package and the plugin.
build:
	$(GO) build ./...

## plugin: build protoc-gen-saga into .cache/bin.
plugin:
	GOBIN=$(BIN) $(GO) install ./cmd/protoc-gen-saga

## generate: regenerate every generated file in the repository (in-process; no buf needed).
generate:
	$(GO) run ./internal/gen/cmd/regen

## check-generated: fail when committed generated files differ from a fresh generation.
check-generated: generate
	@git diff --exit-code --stat -- options examples testdata bench/internal/progresspb || \
		{ echo "generated files are stale: run 'make generate' and commit the result" >&2; exit 1; }
	@test -z "$$(git status --porcelain -- options examples testdata bench/internal/progresspb)" || \
		{ git status --porcelain -- options examples testdata bench/internal/progresspb; echo "untracked generated files: run 'make generate' and commit them" >&2; exit 1; }

$(BUF): tools/go.mod tools/go.sum
	cd tools && GOBIN=$(dir $(BUF)) $(GO) install github.com/bufbuild/buf/cmd/buf

## buf-plugins: the plugins buf.gen.yaml and buf.yaml run, built into .cache/bin.
buf-plugins:
	$(GO) build -o $(BIN)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o $(BIN)/protoc-gen-saga ./cmd/protoc-gen-saga
	$(GO) build -o $(BIN)/buf-plugin-saga ./cmd/buf-plugin-saga

## buf-generate: the same generation through `buf generate` (buf is built once per machine, ~5 min).
buf-generate: $(BUF) buf-plugins
	$(BUF) generate

## check-buf: `buf generate` into a temporary directory must reproduce every committed generated file.
check-buf: $(BUF) buf-plugins
	scripts/check-buf.sh $(BUF)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$out" || { echo "gofmt needed:"; echo "$$out"; exit 1; }

$(STATICCHECK):
	GOBIN=$(dir $(STATICCHECK)) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## vet: go vet and staticcheck (staticcheck.conf) on both modules.
vet: $(STATICCHECK)
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	$(STATICCHECK) ./...
	cd bench && $(STATICCHECK) ./...

## check-bufplugin: `buf lint` and `buf breaking` (against internal/bufcheck/testdata/baseline) with buf-plugin-saga.
check-bufplugin: $(BUF) buf-plugins
	scripts/check-bufplugin.sh $(BUF)

## test: every test — unit, golden and integration against a real PostgreSQL 15 and RabbitMQ 3.10 —
## then test-matrix.
test: fmt-check vet check-buf check-bufplugin
	scripts/ensure-tools.sh
	scripts/with-services.sh sh -c 'scripts/gotest.sh $(TESTFLAGS) $(PKGS) && cd bench && ../scripts/gotest.sh $(TESTFLAGS) ./...'
	$(MAKE) test-matrix

## test-matrix: the integration packages of the runtime and the short chaos soak again, against
## PostgreSQL 17 and RabbitMQ 4.x (Debian 13's, in a root scripts/trixie-root.sh makes once per machine,
## about 5 minutes; the run itself about 5 minutes).
MATRIX_PKGS ?= ./runtime/broker ./runtime/consumer ./runtime/outbox ./runtime/saga ./runtime/host ./runtime/participant ./runtime/inbox ./internal/chaos
test-matrix:
	SAGA_SERVICES_VERSIONS=new scripts/with-services.sh scripts/gotest.sh $(TESTFLAGS) $(MATRIX_PKGS)

## test-unit: only the tests that need no services (integration tests skip, or fail under CI=true).
test-unit:
	$(GO) test $(TESTFLAGS) $(PKGS)

## demo: build the plugin, regenerate the examples, start the services, run the Place Order and Book Trip fleets.
demo: plugin generate
	scripts/with-services.sh $(GO) run ./examples/placeorder/cmd/demo

## bench: performance measurements, each side by side with its peer in the same run (bench/ is its own module),
## then bench-hosts.
bench:
	cd bench && $(GO) run ./cmd/genbench -sagas 40 -runs 9
	mkdir -p $(CACHE)
	scripts/with-services.sh sh -c '$(GO) test -run "^$$" -bench BenchmarkTransition -benchmem -count 6 ./runtime/telemetry/ && cd bench && $(GO) run ./cmd/sagabench -out $(CACHE)/bench.md'
	$(MAKE) bench-hosts

## bench-hosts: the saga comparison again as on separate hosts — PostgreSQL, RabbitMQ and sagabench each
## in a network namespace of its own, every packet between them delayed so that a round trip takes
## HOSTS_RTT_MS (default 0.5) ms more (scripts/hosts.sh; needs root): raw RabbitMQ, Watermill, the runtime,
## the relay and its same-shape baseline, latency. Table in .cache/bench-hosts.md.
HOSTS_RTT_MS ?= 0.5
HOSTS_FLAGS ?= -only raw,watermill,ours,relay,latency
bench-hosts:
	mkdir -p $(BIN)
	cd bench && $(GO) build -o $(BIN)/sagabench ./cmd/sagabench
	scripts/hosts.sh $(CACHE)/hosts $(HOSTS_RTT_MS) $(BIN)/sagabench $(HOSTS_FLAGS) -out $(CACHE)/bench-hosts.md

## bench-peers: the saga comparison with the engines a Go team would pick instead — Temporal on PostgreSQL
## and DBOS — next to the runtime and Watermill, in one run (about 20 minutes). The Temporal server is
## built once per machine from the Go module proxy into ~/.cache/protosaga (bench/temporal/build.sh).
bench-peers:
	mkdir -p $(CACHE)
	dir=$$(bench/temporal/build.sh) && scripts/with-services.sh sh -c 'cd bench && $(GO) run ./cmd/sagabench -only watermill,ours,temporal,dbos,latency -temporal "$$0" -out $(CACHE)/bench-peers.md' "$$dir"

## bench-slowdisk: the saga throughput comparison and pgbench ceiling again, on private servers whose
## every fsync takes SLOWSYNC_US (default 1000) microseconds longer: a disk that flushes like network block storage.
SLOWSYNC_US ?= 1000
bench-slowdisk:
	mkdir -p $(CACHE)
	bench/slowdisk/run.sh $(SLOWSYNC_US) -only pg,watermill,ours -workers 2 -out $(CACHE)/bench-slowdisk.md

## soak: long chaos soak (3 runs x 2000 Place Order and 1000 Book Trip sagas; SIGKILLs at every crash point and at random; 2 RabbitMQ
## and 2 PostgreSQL restarts per run), a run on a 3-node RabbitMQ cluster whose node leading the queues is
## SIGKILLed twice, a run on a PostgreSQL whose primary crashes and whose synchronous replica is promoted,
## then a 12,000-saga load run with memory watched. Private servers; ~30 min.
soak:
	$(GO) build -o $(BIN)/soak ./examples/placeorder/cmd/soak
	$(BIN)/soak -runs 3 -sagas 2000 -rate 30
	$(BIN)/soak -cluster 3 -node-kills 2 -sagas 1000 -rate 30
	$(BIN)/soak -replica sync -sagas 1000 -rate 30
	$(BIN)/soak -load -sagas 12000 -rate 40

## services-start / services-stop: long-lived services for development in /tmp/saga-services.
services-start:
	scripts/services.sh start /tmp/saga-services
	@echo "now: source /tmp/saga-services/env.sh"

services-stop:
	scripts/services.sh stop /tmp/saga-services

clean:
	rm -rf $(CACHE)
