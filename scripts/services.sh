#!/usr/bin/env bash
# services.sh — start, restart and stop a private PostgreSQL, RabbitMQ and Redis for tests and the demo.
#
#   scripts/services.sh start DIR                   install if missing, start both on loopback, write DIR/env.sh
#   scripts/services.sh restart DIR [pg|rabbit|redis|all]
#                                                   stop and start one server (default: all) on the same
#                                                   ports with the same data, and wait until it answers
#   scripts/services.sh stop DIR                    stop them and leave DIR for inspection
#   scripts/services.sh status DIR                  print DIR/env.sh and what runs; exit 0 only when all run
#
# A Redis server runs next to them (Debian's redis-server, loopback only, append-only file
# with fsync every second), for the Redis lock implementation's tests.
#
# Everything lives under DIR: data directories, sockets, logs, the Erlang cookie. Ports are
# chosen free at start and kept by restarts. No systemd, no Docker: the servers run as plain
# processes (PostgreSQL as the `postgres` user, because initdb refuses root). DIR/env.sh exports
# the names every reader in the repository uses (the runtime's examples, internal/testenv, bench/):
#   SAGA_SERVICES_DIR   DIR (scripts/with-services.sh reuses the servers only when it names a live DIR)
#   SAGA_PG_URL         postgres://postgres@127.0.0.1:PORT/saga?sslmode=disable
#   SAGA_AMQP_URL       amqp://guest:guest@127.0.0.1:PORT/
#   SAGA_RABBIT_API     http://guest:guest@127.0.0.1:PORT/api (management API)
#   SAGA_TLS_CA         PEM of the throwaway CA that signed both servers' certificates
#   SAGA_PG_TLS_URL     the PostgreSQL URL with sslmode=verify-full against that CA
#   SAGA_AMQPS_URL      amqps://guest:guest@localhost:PORT/ (TLS listener)
#   SAGA_REDIS_URL      redis://127.0.0.1:PORT/0 (Redis, for runtime/lock/redislock)
set -euo pipefail

die() { echo "services: $*" >&2; exit 1; }
log() { echo "services: $*" >&2; }

# SAGA_PG_BIN and SAGA_RABBITMQ_BIN point at other installations (Debian's layout by default).
PG_VERSION=15
PG_BIN=${SAGA_PG_BIN:-/usr/lib/postgresql/$PG_VERSION/bin}
RMQ_BIN=${SAGA_RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
RMQ_SERVER=$RMQ_BIN/rabbitmq-server
RMQ_CTL=$RMQ_BIN/rabbitmqctl
REDIS_SERVER=${SAGA_REDIS_SERVER:-/usr/bin/redis-server}
REDIS_CLI=${SAGA_REDIS_CLI:-/usr/bin/redis-cli}

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

# as_pg CMD [ARGS...]: a PostgreSQL tool, as the postgres user when we are root (the server refuses root).
as_pg() {
	if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start_pg() {
	local dir=$1 port
	port=$(free_port)
	mkdir -p "$dir/pg"
	echo "$port" >"$dir/pg/port"
	chown -R postgres:postgres "$dir/pg" 2>/dev/null || true
	chmod 700 "$dir/pg"
	as_pg "$PG_BIN/initdb" -D "$dir/pg/data" -U postgres --auth=trust -E UTF8 --no-sync >"$dir/pg/initdb.log" 2>&1 ||
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
	launch_pg "$dir"
	as_pg psql -h 127.0.0.1 -p "$port" -U postgres -qc 'CREATE DATABASE saga' >/dev/null ||
		die "create database failed"
	log "PostgreSQL on 127.0.0.1:$port"
}

# launch_pg DIR: start the cluster of DIR (configured by start_pg) and wait until it takes
# connections. SAGA_SERVICES_PRELOAD names a library both servers load, at start and at restart
# (bench/slowdisk/run.sh slows their flushes with it).
launch_pg() {
	local dir=$1 preload=()
	[ -z "${SAGA_SERVICES_PRELOAD:-}" ] || preload=(env "LD_PRELOAD=$SAGA_SERVICES_PRELOAD")
	as_pg "${preload[@]}" "$PG_BIN/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/postgres.log" -w -t 60 start >/dev/null ||
		{ tail -20 "$dir/pg/postgres.log" >&2; die "PostgreSQL did not start (log: $dir/pg/postgres.log)"; }
}

# pg_running DIR: the postmaster of DIR is alive and its port is taken.
pg_running() {
	local dir=$1 pid
	[ -f "$dir/pg/data/postmaster.pid" ] && [ -f "$dir/pg/port" ] || return 1
	pid=$(head -1 "$dir/pg/data/postmaster.pid")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && ! port_free "$(cat "$dir/pg/port")"
}

# stop_pg DIR: fast shutdown (clients disconnected, work checkpointed); waits for the server to exit.
stop_pg() {
	local dir=$1
	[ -f "$dir/pg/data/postmaster.pid" ] || return 0
	as_pg "$PG_BIN/pg_ctl" -D "$dir/pg/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
}

restart_pg() {
	local dir=$1 port
	[ -f "$dir/pg/port" ] || die "no PostgreSQL in $dir"
	port=$(cat "$dir/pg/port")
	stop_pg "$dir"
	! pg_running "$dir" || die "PostgreSQL in $dir did not stop"
	wait_port_free "$port" || die "port $port is still taken after PostgreSQL in $dir stopped"
	launch_pg "$dir"
	as_pg psql -h 127.0.0.1 -p "$port" -U postgres -d saga -Atqc 'SELECT 1' >/dev/null ||
		die "PostgreSQL in $dir started but does not answer on 127.0.0.1:$port"
	log "PostgreSQL restarted on 127.0.0.1:$port"
}

# wait_port_free PORT: wait up to 30 s until nothing listens on 127.0.0.1:PORT.
wait_port_free() {
	local i
	for i in $(seq 1 60); do
		port_free "$1" && return 0
		sleep 0.5
	done
	return 1
}

start_rabbit() {
	local dir=$1 port mport tport
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
	launch_rabbit "$dir"
	log "RabbitMQ on 127.0.0.1:$port (TLS :$tport, management :$mport)"
}

# launch_rabbit DIR: start the node of DIR (configured by start_rabbit) detached, in a session of
# its own, and wait until it and its management API answer.
launch_rabbit() {
	local dir=$1 mport
	mport=$(cat "$dir/rabbit/mgmt-port")
	(
		rmq_env "$dir"
		[ -z "${SAGA_SERVICES_PRELOAD:-}" ] || export LD_PRELOAD=$SAGA_SERVICES_PRELOAD
		setsid "$RMQ_SERVER" >>"$dir/rabbit/log/stdout.log" 2>&1 </dev/null &
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
}

# rabbit_pid DIR: the PID of DIR's node while its Erlang VM runs (a PID file left by a stopped
# node, whose number another process may have taken since, prints nothing).
rabbit_pid() {
	local dir=$1 pid
	[ -f "$dir/rabbit/rabbit.pid" ] && [ -f "$dir/rabbit/port" ] || return 1
	pid=$(cat "$dir/rabbit/rabbit.pid")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-home $dir/rabbit/home " || return 1
	echo "$pid"
}

# rabbit_running DIR: the node of DIR is alive and its AMQP port is taken.
rabbit_running() {
	rabbit_pid "$1" >/dev/null && ! port_free "$(cat "$1/rabbit/port")"
}

# stop_rabbit DIR: stop the node (rabbitmqctl stop waits for its Erlang VM to exit).
stop_rabbit() {
	local dir=$1 pid
	pid=$(rabbit_pid "$dir") || return 0
	(
		rmq_env "$dir"
		timeout 30 "$RMQ_CTL" -q stop "$RABBITMQ_PID_FILE" >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
	)
}

restart_rabbit() {
	local dir=$1 port
	[ -f "$dir/rabbit/port" ] || die "no RabbitMQ in $dir"
	port=$(cat "$dir/rabbit/port")
	stop_rabbit "$dir"
	! rabbit_running "$dir" || die "RabbitMQ in $dir did not stop"
	wait_port_free "$port" || die "port $port is still taken after RabbitMQ in $dir stopped"
	launch_rabbit "$dir"
	log "RabbitMQ restarted on 127.0.0.1:$port"
}

# ensure_redis: Debian's redis-server (and redis-cli, from redis-tools).
ensure_redis() {
	[ -x "$REDIS_SERVER" ] && [ -x "$REDIS_CLI" ] || apt_install redis-server
	[ -x "$REDIS_SERVER" ] || die "redis-server not found at $REDIS_SERVER after install"
	[ -x "$REDIS_CLI" ] || die "redis-cli not found at $REDIS_CLI after install"
}

# start_redis DIR: a Redis server on a free loopback port, its data and log in DIR/redis.
start_redis() {
	local dir=$1 port
	port=$(free_port)
	mkdir -p "$dir/redis"
	echo "$port" >"$dir/redis/port"
	cat >"$dir/redis/redis.conf" <<EOF
bind 127.0.0.1
port $port
dir $dir/redis
pidfile $dir/redis/redis.pid
logfile $dir/redis/redis.log
daemonize yes
save ""
appendonly yes
appendfsync everysec
EOF
	launch_redis "$dir"
	log "Redis on 127.0.0.1:$port"
}

# launch_redis DIR: start the server of DIR (configured by start_redis) and wait until it answers.
launch_redis() {
	local dir=$1 port i
	port=$(cat "$dir/redis/port")
	"$REDIS_SERVER" "$dir/redis/redis.conf" >>"$dir/redis/stdout.log" 2>&1 </dev/null ||
		{ tail -20 "$dir/redis/redis.log" >&2 || true; die "Redis did not start (log: $dir/redis/redis.log)"; }
	for i in $(seq 1 100); do
		if [ "$("$REDIS_CLI" -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; then return 0; fi
		sleep 0.1
	done
	tail -20 "$dir/redis/redis.log" >&2 || true
	die "Redis did not answer on 127.0.0.1:$port within 10 s (log: $dir/redis/redis.log)"
}

# redis_pid DIR: the PID of DIR's Redis server while it runs.
redis_pid() {
	local dir=$1 pid
	[ -f "$dir/redis/redis.pid" ] && [ -f "$dir/redis/port" ] || return 1
	pid=$(cat "$dir/redis/redis.pid")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "127.0.0.1:$(cat "$dir/redis/port")" || return 1
	echo "$pid"
}

# redis_running DIR: the server of DIR is alive and its port is taken.
redis_running() {
	redis_pid "$1" >/dev/null && ! port_free "$(cat "$1/redis/port")"
}

# stop_redis DIR: SHUTDOWN (which flushes the append-only file), or TERM; waits for the exit.
stop_redis() {
	local dir=$1 pid i
	pid=$(redis_pid "$dir") || return 0
	"$REDIS_CLI" -h 127.0.0.1 -p "$(cat "$dir/redis/port")" shutdown >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
	for i in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -9 "$pid" 2>/dev/null || true
}

restart_redis() {
	local dir=$1 port
	[ -f "$dir/redis/port" ] || die "no Redis in $dir"
	port=$(cat "$dir/redis/port")
	stop_redis "$dir"
	! redis_running "$dir" || die "Redis in $dir did not stop"
	wait_port_free "$port" || die "port $port is still taken after Redis in $dir stopped"
	launch_redis "$dir"
	log "Redis restarted on 127.0.0.1:$port"
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
	ensure_redis
	command -v curl >/dev/null || apt_install curl
	make_tls "$dir"
	chown -R postgres:postgres "$dir/pg" 2>/dev/null || true
	start_pg "$dir"
	start_rabbit "$dir"
	start_redis "$dir"
	cat >"$dir/env.sh" <<EOF
export SAGA_SERVICES_DIR='$dir'
export SAGA_PG_URL='postgres://postgres@127.0.0.1:$(cat "$dir/pg/port")/saga?sslmode=disable'
export SAGA_AMQP_URL='amqp://guest:guest@127.0.0.1:$(cat "$dir/rabbit/port")/'
export SAGA_RABBIT_API='http://guest:guest@127.0.0.1:$(cat "$dir/rabbit/mgmt-port")/api'
export SAGA_TLS_CA='$dir/tls/ca.pem'
export SAGA_PG_TLS_URL='postgres://postgres@localhost:$(cat "$dir/pg/port")/saga?sslmode=verify-full&sslrootcert=$dir/tls/ca.pem'
export SAGA_AMQPS_URL='amqps://guest:guest@localhost:$(cat "$dir/rabbit/tls-port")/'
export SAGA_REDIS_URL='redis://127.0.0.1:$(cat "$dir/redis/port")/0'
EOF
	trap - EXIT
	log "ready: source $dir/env.sh"
}

# cmd_restart DIR [pg|rabbit|all]: the servers keep their ports, data directories, durable queues
# and persistent messages; every client connection drops.
cmd_restart() {
	local dir=${1:?usage: services.sh restart DIR [pg|rabbit|redis|all]} which=${2:-all}
	case $which in pg | rabbit | redis | all) ;; *) die "restart: unknown service '$which' (pg, rabbit, redis or all)" ;; esac
	[ -f "$dir/env.sh" ] || die "no services in $dir (start them with: services.sh start $dir)"
	dir=$(cd "$dir" && pwd)
	case $which in pg | all) restart_pg "$dir" ;; esac
	case $which in rabbit | all) restart_rabbit "$dir" ;; esac
	case $which in redis | all) restart_redis "$dir" ;; esac
}

cmd_stop() {
	local dir=${1:?usage: services.sh stop DIR}
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	if [ -f "$dir/rabbit/port" ]; then
		stop_rabbit "$dir"
		# epmd outlives the node; kill it only when no node is left on it.
		if command -v epmd >/dev/null && ! ERL_EPMD_ADDRESS=127.0.0.1 epmd -names 2>/dev/null | grep -q '^name '; then
			ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 || true
		fi
	fi
	stop_pg "$dir"
	stop_redis "$dir"
	log "stopped services in $dir"
}

# cmd_status DIR: env.sh and each server's state; success only when both run.
cmd_status() {
	local dir=${1:?usage: services.sh status DIR} rc=0
	[ -f "$dir/env.sh" ] || { echo "no services in $dir"; return 1; }
	dir=$(cd "$dir" && pwd)
	cat "$dir/env.sh"
	if pg_running "$dir"; then
		echo "# PostgreSQL: running on 127.0.0.1:$(cat "$dir/pg/port")"
	else
		echo "# PostgreSQL: not running"
		rc=1
	fi
	if rabbit_running "$dir"; then
		echo "# RabbitMQ: running on 127.0.0.1:$(cat "$dir/rabbit/port")"
	else
		echo "# RabbitMQ: not running"
		rc=1
	fi
	if redis_running "$dir"; then
		echo "# Redis: running on 127.0.0.1:$(cat "$dir/redis/port")"
	else
		echo "# Redis: not running"
		rc=1
	fi
	return "$rc"
}

case "${1:-}" in
start) shift; cmd_start "$@" ;;
restart) shift; cmd_restart "$@" ;;
stop) shift; cmd_stop "$@" ;;
status) shift; cmd_status "$@" ;;
*) die "usage: services.sh start|stop|status DIR, or services.sh restart DIR [pg|rabbit|redis|all]" ;;
esac
