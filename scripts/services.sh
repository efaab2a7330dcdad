#!/usr/bin/env bash
# services.sh — start and stop a private PostgreSQL and RabbitMQ for tests and the demo.
#
#   scripts/services.sh start DIR   install if missing, start both on loopback, write DIR/env.sh
#   scripts/services.sh stop DIR    stop both and leave DIR for inspection
#   scripts/services.sh status DIR  print what runs
#
# Everything lives under DIR: data directories, sockets, logs, the Erlang cookie. Ports are
# chosen free at start. No systemd, no Docker: the servers run as plain processes (PostgreSQL as
# the `postgres` user, because initdb refuses root). DIR/env.sh exports:
#   SAGA_TEST_PG_URL     postgres://postgres@127.0.0.1:PORT/saga?sslmode=disable
#   SAGA_TEST_AMQP_URL   amqp://guest:guest@127.0.0.1:PORT/
#   SAGA_TEST_RABBIT_API http://guest:guest@127.0.0.1:PORT/api
#   SAGA_TEST_TLS_CA     PEM of the throwaway CA that signed both servers' certificates
#   SAGA_TEST_PG_TLS_URL the PostgreSQL URL with sslmode=verify-full against that CA
#   SAGA_TEST_AMQPS_URL  amqps://guest:guest@localhost:PORT/ (TLS listener)
set -euo pipefail

die() { echo "services: $*" >&2; exit 1; }
log() { echo "services: $*" >&2; }

# SAGA_PG_BIN and SAGA_RABBITMQ_BIN point at other installations (Debian's layout by default).
PG_VERSION=15
PG_BIN=${SAGA_PG_BIN:-/usr/lib/postgresql/$PG_VERSION/bin}
RMQ_BIN=${SAGA_RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
RMQ_SERVER=$RMQ_BIN/rabbitmq-server
RMQ_CTL=$RMQ_BIN/rabbitmqctl

as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
		die "need root to run: $* (install the packages by hand or run as root)"
	fi
}

apt_updated=
apt_install() {
	if [ -z "$apt_updated" ]; then
		log "apt-get update"
		as_root apt-get update -qq >/dev/null || die "apt-get update failed"
		apt_updated=1
	fi
	log "installing $*"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null ||
		die "apt-get install $* failed"
}

ensure_installed() {
	[ -x "$PG_BIN/postgres" ] || apt_install postgresql-$PG_VERSION
	[ -x "$RMQ_SERVER" ] || apt_install rabbitmq-server
	[ -x "$PG_BIN/postgres" ] || die "PostgreSQL $PG_VERSION not found at $PG_BIN after install"
	[ -x "$RMQ_SERVER" ] || die "rabbitmq-server not found at $RMQ_SERVER after install"
}

# port_free PORT: nothing listens on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port: a free port whose +20000 (Erlang distribution) is free too, both below the kernel's
# ephemeral range: a port in that range can be taken by any outgoing connection (tests open
# thousands) between the check here and the server's bind, which then fails with eaddrinuse.
free_port() {
	local p i lo top
	lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
	top=$((lo - 20000)) # p + 20000 < lo
	[ "$top" -gt 10100 ] || die "the ephemeral port range starts at $lo: no room below it for fixed ports (and +20000)"
	for i in $(seq 1 200); do
		p=$((10000 + RANDOM % (top - 10000)))
		if port_free "$p" && port_free $((p + 20000)); then echo "$p"; return; fi
	done
	die "no free port found"
}

rmq_env() {
	local dir=$1
	export HOME="$dir/rabbit/home"
	export RABBITMQ_NODENAME="saga$(cat "$dir/rabbit/port")@localhost"
	export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	export RABBITMQ_NODE_PORT="$(cat "$dir/rabbit/port")"
	export RABBITMQ_DIST_PORT=$((RABBITMQ_NODE_PORT + 20000))
	export RABBITMQ_MNESIA_BASE="$dir/rabbit/mnesia"
	export RABBITMQ_LOG_BASE="$dir/rabbit/log"
	export RABBITMQ_PID_FILE="$dir/rabbit/rabbit.pid"
	export RABBITMQ_CONFIG_FILE="$dir/rabbit/rabbitmq"
	export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/rabbit/enabled_plugins"
	export RABBITMQ_CONF_ENV_FILE="$dir/rabbit/empty-env"
	export ERL_EPMD_ADDRESS=127.0.0.1
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

# make_tls DIR: a throwaway CA and a server certificate for localhost and 127.0.0.1.
make_tls() {
	local dir=$1 t=$1/tls
	command -v openssl >/dev/null || apt_install openssl
	mkdir -p "$t"
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=saga test CA" \
		-keyout "$t/ca.key" -out "$t/ca.pem" >/dev/null 2>&1 || die "openssl: CA"
	openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
		-keyout "$t/server.key" -out "$t/server.csr" >/dev/null 2>&1 || die "openssl: server key"
	printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$t/san.ext"
	openssl x509 -req -in "$t/server.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" -CAcreateserial -days 2 \
		-extfile "$t/san.ext" -out "$t/server.pem" >/dev/null 2>&1 || die "openssl: server certificate"
	mkdir -p "$dir/pg"
	cp "$t/server.pem" "$dir/pg/server.pem"
	cp "$t/server.key" "$dir/pg/server.key"
	chmod 644 "$t"/*.pem
	chmod 600 "$dir/pg/server.key"
	chmod 644 "$t/server.key" # RabbitMQ runs as this user; the directory is private to the run
}

start_pg() {
	local dir=$1 port
	port=$(free_port)
	mkdir -p "$dir/pg"
	echo "$port" >"$dir/pg/port"
	chown -R postgres:postgres "$dir/pg" 2>/dev/null || true
	chmod 700 "$dir/pg"
	local run=(runuser -u postgres --)
	[ "$(id -u)" -eq 0 ] || run=()
	"${run[@]}" "$PG_BIN/initdb" -D "$dir/pg/data" -U postgres --auth=trust -E UTF8 --no-sync >"$dir/pg/initdb.log" 2>&1 ||
		{ cat "$dir/pg/initdb.log" >&2; die "initdb failed (log: $dir/pg/initdb.log)"; }
	cat >>"$dir/pg/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir/pg'
max_connections = 300
shared_buffers = 128MB
fsync = on
synchronous_commit = on
log_min_messages = warning
ssl = on
ssl_cert_file = '$dir/pg/server.pem'
ssl_key_file = '$dir/pg/server.key'
EOF
	# SAGA_SERVICES_PRELOAD: a library both servers load (bench/slowdisk/run.sh slows their flushes with it).
	local preload=()
	[ -z "${SAGA_SERVICES_PRELOAD:-}" ] || preload=(env "LD_PRELOAD=$SAGA_SERVICES_PRELOAD")
	"${run[@]}" "${preload[@]}" "$PG_BIN/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/postgres.log" -w -t 60 start >/dev/null ||
		{ tail -20 "$dir/pg/postgres.log" >&2; die "PostgreSQL did not start (log: $dir/pg/postgres.log)"; }
	"${run[@]}" psql -h 127.0.0.1 -p "$port" -U postgres -qc 'CREATE DATABASE saga' >/dev/null ||
		die "create database failed"
	log "PostgreSQL on 127.0.0.1:$port"
}

start_rabbit() {
	local dir=$1 port mport
	port=$(free_port)
	mport=$(free_port)
	tport=$(free_port)
	mkdir -p "$dir/rabbit/home" "$dir/rabbit/mnesia" "$dir/rabbit/log"
	echo "$port" >"$dir/rabbit/port"
	echo "$mport" >"$dir/rabbit/mgmt-port"
	echo "$tport" >"$dir/rabbit/tls-port"
	: >"$dir/rabbit/empty-env"
	echo '[rabbitmq_management].' >"$dir/rabbit/enabled_plugins"
	cat >"$dir/rabbit/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$port
listeners.ssl.default = 127.0.0.1:$tport
ssl_options.cacertfile = $dir/tls/ca.pem
ssl_options.certfile = $dir/tls/server.pem
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
management.tcp.ip = 127.0.0.1
management.tcp.port = $mport
management.rates_mode = none
collect_statistics_interval = 1000
disk_free_limit.absolute = 50MB
loopback_users = none
log.console = false
log.file.level = warning
EOF
	(
		rmq_env "$dir"
		[ -z "${SAGA_SERVICES_PRELOAD:-}" ] || export LD_PRELOAD=$SAGA_SERVICES_PRELOAD
		setsid "$RMQ_SERVER" >"$dir/rabbit/log/stdout.log" 2>&1 </dev/null &
	)
	# await_startup fails at once while the node is not yet reachable: retry until it answers.
	local i ok=
	for i in $(seq 1 90); do
		if (rmq_env "$dir" && "$RMQ_CTL" -q await_startup --timeout 60 >/dev/null 2>&1); then ok=1; break; fi
		sleep 1
	done
	if [ -z "$ok" ]; then
		tail -30 "$dir/rabbit/log/stdout.log" >&2 || true
		die "RabbitMQ did not start within 90 s (logs: $dir/rabbit/log)"
	fi
	for i in $(seq 1 60); do
		if curl -fsS -u guest:guest "http://127.0.0.1:$mport/api/overview" >/dev/null 2>&1; then break; fi
		sleep 0.5
	done
	curl -fsS -u guest:guest "http://127.0.0.1:$mport/api/overview" >/dev/null ||
		die "RabbitMQ management API did not answer on 127.0.0.1:$mport"
	log "RabbitMQ on 127.0.0.1:$port (TLS :$tport, management :$mport)"
}

cmd_start() {
	local dir=${1:?usage: services.sh start DIR}
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	chmod 755 "$dir"
	# A failed start (die exits) stops what did start, so that no server is
	# left running: PostgreSQL, when RabbitMQ fails.
	trap 'cmd_stop "$dir" >/dev/null 2>&1 || true' EXIT
	ensure_installed
	command -v curl >/dev/null || apt_install curl
	make_tls "$dir"
	chown -R postgres:postgres "$dir/pg" 2>/dev/null || true
	start_pg "$dir"
	start_rabbit "$dir"
	cat >"$dir/env.sh" <<EOF
export SAGA_SERVICES_DIR='$dir'
export SAGA_TEST_PG_URL='postgres://postgres@127.0.0.1:$(cat "$dir/pg/port")/saga?sslmode=disable'
export SAGA_TEST_AMQP_URL='amqp://guest:guest@127.0.0.1:$(cat "$dir/rabbit/port")/'
export SAGA_TEST_RABBIT_API='http://guest:guest@127.0.0.1:$(cat "$dir/rabbit/mgmt-port")/api'
export SAGA_TEST_TLS_CA='$dir/tls/ca.pem'
export SAGA_TEST_PG_TLS_URL='postgres://postgres@localhost:$(cat "$dir/pg/port")/saga?sslmode=verify-full&sslrootcert=$dir/tls/ca.pem'
export SAGA_TEST_AMQPS_URL='amqps://guest:guest@localhost:$(cat "$dir/rabbit/tls-port")/'
EOF
	trap - EXIT
	log "ready: source $dir/env.sh"
}

cmd_stop() {
	local dir=${1:?usage: services.sh stop DIR}
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	if [ -f "$dir/rabbit/port" ]; then
		(
			rmq_env "$dir"
			if [ -f "$RABBITMQ_PID_FILE" ]; then
				timeout 30 "$RMQ_CTL" -q stop "$RABBITMQ_PID_FILE" >/dev/null 2>&1 ||
					kill "$(cat "$RABBITMQ_PID_FILE")" 2>/dev/null || true
			fi
		)
		# epmd outlives the node; kill it only when no node is left on it.
		if command -v epmd >/dev/null && ! ERL_EPMD_ADDRESS=127.0.0.1 epmd -names 2>/dev/null | grep -q '^name '; then
			ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 || true
		fi
	fi
	if [ -f "$dir/pg/data/postmaster.pid" ]; then
		local run=(runuser -u postgres --)
		[ "$(id -u)" -eq 0 ] || run=()
		"${run[@]}" "$PG_BIN/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null 2>&1 || true
	fi
	log "stopped services in $dir"
}

cmd_status() {
	local dir=${1:?usage: services.sh status DIR}
	[ -f "$dir/env.sh" ] || { echo "no services in $dir"; return 1; }
	cat "$dir/env.sh"
}

case "${1:-}" in
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
status) shift; cmd_status "$@" ;;
*) die "usage: services.sh start|stop|status DIR" ;;
esac
