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
# A RabbitMQ cluster, with a PostgreSQL as above:
#   scripts/services.sh cluster-start DIR [N]       N RabbitMQ nodes (default 3) joined in one cluster, node i
#                                                   in DIR/node<i>; DIR/env.sh's SAGA_AMQP_URL lists every
#                                                   node's URL, comma-separated, SAGA_RABBIT_APIS every
#                                                   node's management API (SAGA_RABBIT_API is node 1's)
#   scripts/services.sh cluster-node DIR I kill|start|stop   SIGKILL node I, start it again, or stop it
#   scripts/services.sh cluster-stop DIR            stop every node and PostgreSQL
#
# A PostgreSQL with a streaming replica, with a RabbitMQ as above:
#   scripts/services.sh replica-start DIR [sync|async]   start, plus a replica (default synchronous);
#                                                   SAGA_PG_URL names both, target_session_attrs=read-write
#   scripts/services.sh replica-failover DIR        crash the primary, promote the replica
#   scripts/services.sh replica-stop DIR            stop everything
#
# PostgreSQL and RabbitMQ in network namespaces of their own, as on separate hosts:
#   scripts/services.sh netns-start DIR PG_NS PG_ADDR RABBIT_NS RABBIT_ADDR
#                                                   PostgreSQL in namespace PG_NS listening on PG_ADDR,
#                                                   RabbitMQ in RABBIT_NS on RABBIT_ADDR (each also on its
#                                                   namespace's loopback, for its own tools); DIR/env.sh
#                                                   names those addresses. The namespaces and the links
#                                                   between them are the caller's (scripts/hosts.sh).
#   scripts/services.sh netns-stop DIR              stop them
#
# Versions: by default Debian 12's PostgreSQL 15 and RabbitMQ 3.10. With SAGA_SERVICES_VERSIONS=new at
# start, PostgreSQL 17 and RabbitMQ 4.x from Debian 13, run inside a Debian 13 root
# (scripts/trixie-root.sh makes it once per machine) on the same loopback; DIR remembers the choice
# (DIR/versions), so restart and stop need no variable, and env.sh exports it, so servers a test or
# the soak starts for itself from that environment are of the same versions.
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
# The servers run on the host unless use_versions points these at the Debian 13 root.
ROOT_DIR=            # the root the servers run in; empty: the host
IN_ROOT=()           # the prefix that runs a command in it (chroot ROOT_DIR)
PG_OWNER=postgres:postgres # the owner of PostgreSQL's files, as the servers see it
here=$(cd "$(dirname "$0")" && pwd)
# The servers listen on loopback in the host's network namespace unless use_netns puts them in
# namespaces of their own (netns-start).
PG_NS=()             # the prefix that runs a command in PostgreSQL's namespace (ip netns exec NS)
RMQ_NS=()            # the same for RabbitMQ's
PG_LISTEN=127.0.0.1  # PostgreSQL's listen_addresses
PG_HBA_EXTRA=        # a pg_hba.conf line for clients outside loopback
RMQ_EXTRA_ADDR=      # an address RabbitMQ listens on besides loopback
RMQ_MGMT_IP=127.0.0.1
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
	[ -z "$ROOT_DIR" ] || return 0 # trixie-root.sh installed and checked them
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
	export RABBITMQ_ADVANCED_CONFIG_FILE="$dir/rabbit/advanced.config"
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
	if [ -n "$ROOT_DIR" ]; then chroot --userspec="$PG_OWNER" "$ROOT_DIR" "$@"
	elif [ "$(id -u)" -eq 0 ]; then "${PG_NS[@]}" runuser -u postgres -- "$@"; else "${PG_NS[@]}" "$@"; fi
}

start_pg() {
	local dir=$1 port
	port=$(free_port)
	mkdir -p "$dir/pg"
	echo "$port" >"$dir/pg/port"
	chown -R "$PG_OWNER" "$dir/pg" 2>/dev/null || true
	chmod 700 "$dir/pg"
	as_pg "$PG_BIN/initdb" -D "$dir/pg/data" -U postgres --auth=trust -E UTF8 --no-sync >"$dir/pg/initdb.log" 2>&1 ||
		{ cat "$dir/pg/initdb.log" >&2; die "initdb failed (log: $dir/pg/initdb.log)"; }
	cat >>"$dir/pg/data/postgresql.conf" <<EOF
listen_addresses = '$PG_LISTEN'
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
	[ -z "$PG_HBA_EXTRA" ] || echo "$PG_HBA_EXTRA" >>"$dir/pg/data/pg_hba.conf"
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
${RMQ_EXTRA_ADDR:+listeners.tcp.other = $RMQ_EXTRA_ADDR:$port}
listeners.ssl.default = 127.0.0.1:$tport
ssl_options.cacertfile = $dir/tls/ca.pem
ssl_options.certfile = $dir/tls/server.pem
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
management.tcp.ip = $RMQ_MGMT_IP
management.tcp.port = $mport
management.rates_mode = none
collect_statistics_interval = 1000
disk_free_limit.absolute = 50MB
loopback_users = none
log.console = false
log.file.level = warning
EOF
	# A quorum queue dead-letters at-least-once through a worker that waits
	# this long for the target queue's confirm before it republishes; the
	# default (180 s) holds retry-tier messages that expire while the work
	# queue recovers from a restart for three minutes (docs/operators.md).
	echo '[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].' >"$dir/rabbit/advanced.config"
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
		setsid "${RMQ_NS[@]}" "${IN_ROOT[@]}" "$RMQ_SERVER" >>"$dir/rabbit/log/stdout.log" 2>&1 </dev/null &
	)
	# await_startup fails at once while the node is not yet reachable: retry until it answers.
	local i ok=
	for i in $(seq 1 90); do
		if (rmq_env "$dir" && "${RMQ_NS[@]}" "${IN_ROOT[@]}" "$RMQ_CTL" -q await_startup --timeout 60 >/dev/null 2>&1); then ok=1; break; fi
		sleep 1
	done
	if [ -z "$ok" ]; then
		tail -30 "$dir/rabbit/log/stdout.log" >&2 || true
		die "RabbitMQ did not start within 90 s (logs: $dir/rabbit/log)"
	fi
	for i in $(seq 1 60); do
		if "${RMQ_NS[@]}" curl -fsS -u guest:guest "http://127.0.0.1:$mport/api/overview" >/dev/null 2>&1; then break; fi
		sleep 0.5
	done
	"${RMQ_NS[@]}" curl -fsS -u guest:guest "http://127.0.0.1:$mport/api/overview" >/dev/null ||
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
		timeout 30 "${RMQ_NS[@]}" "${IN_ROOT[@]}" "$RMQ_CTL" -q stop "$RABBITMQ_PID_FILE" >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
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

# choose_versions DIR: record in DIR/versions the versions SAGA_SERVICES_VERSIONS asks for:
# "debian12" (empty or unset: PostgreSQL 15, RabbitMQ 3.10) or "new" (PostgreSQL 17, RabbitMQ 4.x).
choose_versions() {
	local dir=$1 v=${SAGA_SERVICES_VERSIONS:-debian12}
	case $v in debian12 | new) ;; *) die "SAGA_SERVICES_VERSIONS=$v: want debian12 or new" ;; esac
	echo "$v" >"$dir/versions"
}

# use_versions DIR [make]: point the server paths at the installation DIR/versions names. For "new",
# the Debian 13 root (made first when the second argument is "make"), with /proc mounted in it and
# DIR bind-mounted at the same path inside, so every path in the servers' configuration and on
# their command lines means the same inside the root and out.
use_versions() {
	local dir=$1 make=${2:-} uid gid
	[ "$(cat "$dir/versions" 2>/dev/null || echo debian12)" = new ] || return 0
	if [ "$make" = make ]; then
		ROOT_DIR=$("$here/trixie-root.sh") || die "could not make the Debian 13 root (scripts/trixie-root.sh)"
	else
		ROOT_DIR=${SAGA_TRIXIE_ROOT:-$HOME/.cache/protosaga/trixie-root}
		[ -f "$ROOT_DIR/.protosaga-ready" ] || die "the Debian 13 root $ROOT_DIR is missing (services in $dir use it)"
	fi
	IN_ROOT=(chroot "$ROOT_DIR")
	PG_VERSION=17
	PG_BIN=/usr/lib/postgresql/17/bin
	RMQ_BIN=/usr/lib/rabbitmq/bin
	RMQ_SERVER=$RMQ_BIN/rabbitmq-server
	RMQ_CTL=$RMQ_BIN/rabbitmqctl
	uid=$(awk -F: '$1 == "postgres" { print $3 }' "$ROOT_DIR/etc/passwd")
	gid=$(awk -F: '$1 == "postgres" { print $4 }' "$ROOT_DIR/etc/passwd")
	[ -n "$uid" ] && [ -n "$gid" ] || die "no postgres user in $ROOT_DIR/etc/passwd"
	PG_OWNER=$uid:$gid
	mountpoint -q "$ROOT_DIR/proc" || mount -t proc proc "$ROOT_DIR/proc" || die "mount /proc in $ROOT_DIR"
	mkdir -p "$ROOT_DIR/dev/shm" "$ROOT_DIR$dir"
	chmod 1777 "$ROOT_DIR/dev/shm"
	mountpoint -q "$ROOT_DIR$dir" || mount --bind "$dir" "$ROOT_DIR$dir" || die "bind-mount $dir into $ROOT_DIR"
}

# unmount_root DIR: undo use_versions' bind mount of DIR (the root's /proc stays for other runs).
unmount_root() {
	local dir=$1
	[ -n "$ROOT_DIR" ] || return 0
	if mountpoint -q "$ROOT_DIR$dir"; then umount "$ROOT_DIR$dir" || log "could not unmount $ROOT_DIR$dir"; fi
	rmdir "$ROOT_DIR$dir" 2>/dev/null || true
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
	choose_versions "$dir"
	use_versions "$dir" make
	ensure_installed
	ensure_redis
	command -v curl >/dev/null || apt_install curl
	make_tls "$dir"
	chown -R "$PG_OWNER" "$dir/pg" 2>/dev/null || true
	start_pg "$dir"
	start_rabbit "$dir"
	start_redis "$dir"
	cat >"$dir/env.sh" <<EOF
export SAGA_SERVICES_DIR='$dir'
export SAGA_SERVICES_VERSIONS='$(cat "$dir/versions")'
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
	use_versions "$dir"
	case $which in pg | all) restart_pg "$dir" ;; esac
	case $which in rabbit | all) restart_rabbit "$dir" ;; esac
	case $which in redis | all) restart_redis "$dir" ;; esac
}

cmd_stop() {
	local dir=${1:?usage: services.sh stop DIR}
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	use_versions "$dir"
	if [ -f "$dir/rabbit/port" ]; then
		stop_rabbit "$dir"
		# epmd outlives the node; kill it only when no node is left on it.
		if command -v epmd >/dev/null && ! ERL_EPMD_ADDRESS=127.0.0.1 epmd -names 2>/dev/null | grep -q '^name '; then
			ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 || true
		fi
	fi
	stop_pg "$dir"
	unmount_root "$dir"
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

# cluster_nodes DIR: the node directories of the cluster in DIR, in order.
cluster_nodes() {
	local dir=$1 i
	for i in $(seq 1 "$(cat "$dir/cluster-size")"); do echo "$dir/node$i"; done
}

# rabbit_name NODEDIR: the Erlang node name of the node start_rabbit made in NODEDIR.
rabbit_name() { echo "saga$(cat "$1/rabbit/port")@localhost"; }

# cmd_cluster_start DIR [N]: PostgreSQL and N RabbitMQ nodes clustered with the first one. Each
# node is a private node as start_rabbit makes it, in DIR/node<i> (its own ports, data and
# management API), all with one Erlang cookie.
cmd_cluster_start() {
	local dir=${1:?usage: services.sh cluster-start DIR [N]} n=${2:-3} i node first cookie urls= apis
	[ "$n" -ge 1 ] 2>/dev/null || die "cluster-start: want a number of nodes, got '$n'"
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	chmod 755 "$dir"
	trap 'cmd_cluster_stop "$dir" >/dev/null 2>&1 || true' EXIT
	echo debian12 >"$dir/versions"
	echo "$n" >"$dir/cluster-size"
	ensure_installed
	command -v curl >/dev/null || apt_install curl
	make_tls "$dir"
	chown -R "$PG_OWNER" "$dir/pg" 2>/dev/null || true
	start_pg "$dir"
	cookie=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
	for i in $(seq 1 "$n"); do
		node=$dir/node$i
		mkdir -p "$node/rabbit/home"
		ln -sfn ../tls "$node/tls"
		printf '%s' "$cookie" >"$node/rabbit/home/.erlang.cookie"
		chmod 400 "$node/rabbit/home/.erlang.cookie"
		start_rabbit "$node"
		if [ "$i" -gt 1 ]; then
			first=$(rabbit_name "$dir/node1")
			(
				rmq_env "$node"
				"$RMQ_CTL" -q stop_app >/dev/null &&
					"$RMQ_CTL" -q join_cluster "$first" >/dev/null &&
					"$RMQ_CTL" -q start_app >/dev/null
			) || die "node $i did not join $first (logs: $node/rabbit/log)"
			log "node $i joined $first"
		fi
		urls="${urls:+$urls,}amqp://guest:guest@127.0.0.1:$(cat "$node/rabbit/port")/"
	done
	{
		echo "export SAGA_SERVICES_DIR='$dir'"
		echo "export SAGA_SERVICES_VERSIONS='debian12'"
		echo "export SAGA_PG_URL='postgres://postgres@127.0.0.1:$(cat "$dir/pg/port")/saga?sslmode=disable'"
		echo "export SAGA_AMQP_URL='$urls'"
		echo "export SAGA_RABBIT_API='http://guest:guest@127.0.0.1:$(cat "$dir/node1/rabbit/mgmt-port")/api'"
		apis=
		for i in $(seq 1 "$n"); do
			apis="${apis:+$apis,}http://guest:guest@127.0.0.1:$(cat "$dir/node$i/rabbit/mgmt-port")/api"
		done
		echo "export SAGA_RABBIT_APIS='$apis'"
	} >"$dir/env.sh"
	trap - EXIT
	log "cluster of $n nodes ready: source $dir/env.sh"
}

# cmd_cluster_node DIR I kill|start|stop: SIGKILL node I (its Erlang VM, like a machine that
# dies), start it again on its ports and data (it rejoins the cluster; its quorum queue members
# catch up), or stop it cleanly.
cmd_cluster_node() {
	local dir=${1:?usage: services.sh cluster-node DIR I kill|start|stop} i=${2:?node number} what=${3:?kill, start or stop} node pid
	dir=$(cd "$dir" && pwd)
	node=$dir/node$i
	[ -f "$node/rabbit/port" ] || die "no node $i in $dir"
	case $what in
	kill)
		pid=$(rabbit_pid "$node") || die "node $i in $dir is not running"
		kill -9 "$pid"
		wait_port_free "$(cat "$node/rabbit/port")" || die "node $i: port still taken after SIGKILL"
		log "node $i killed"
		;;
	start)
		! rabbit_running "$node" || die "node $i in $dir runs already"
		launch_rabbit "$node"
		log "node $i started on 127.0.0.1:$(cat "$node/rabbit/port")"
		;;
	stop)
		stop_rabbit "$node"
		log "node $i stopped"
		;;
	*) die "cluster-node: want kill, start or stop, got '$what'" ;;
	esac
}

# cmd_cluster_stop DIR: stop every node of the cluster and PostgreSQL; DIR stays for inspection.
cmd_cluster_stop() {
	local dir=${1:?usage: services.sh cluster-stop DIR} node
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	if [ -f "$dir/cluster-size" ]; then
		for node in $(cluster_nodes "$dir"); do
			if [ -f "$node/rabbit/port" ]; then stop_rabbit "$node"; fi
		done
	fi
	if command -v epmd >/dev/null && ! ERL_EPMD_ADDRESS=127.0.0.1 epmd -names 2>/dev/null | grep -q '^name '; then
		ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 || true
	fi
	stop_pg "$dir"
	log "stopped the cluster in $dir"
}

# cmd_replica_start DIR [sync|async]: RabbitMQ and PostgreSQL as start does, plus a streaming
# replica of that PostgreSQL (DIR/pg2, its own port), synchronous by default: a commit returns once
# the replica has flushed it (synchronous_commit on, synchronous_standby_names = the replica).
# DIR/env.sh's SAGA_PG_URL names both servers with target_session_attrs=read-write, so clients
# reach whichever is the primary; SAGA_PG_PRIMARY_URL and SAGA_PG_REPLICA_URL name each.
cmd_replica_start() {
	local dir=${1:?usage: services.sh replica-start DIR [sync|async]} mode=${2:-sync} p1 p2
	case $mode in sync | async) ;; *) die "replica-start: want sync or async, got '$mode'" ;; esac
	cmd_start "$dir"
	dir=$(cd "$dir" && pwd)
	trap 'cmd_replica_stop "$dir" >/dev/null 2>&1 || true' EXIT
	p1=$(cat "$dir/pg/port")
	p2=$(free_port)
	mkdir -p "$dir/pg2"
	echo "$p2" >"$dir/pg2/port"
	echo "$mode" >"$dir/pg2/mode"
	chown -R "$PG_OWNER" "$dir/pg2"
	chmod 700 "$dir/pg2"
	as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$p1" -U postgres -D "$dir/pg2/data" -R -X stream -c fast \
		>"$dir/pg2/basebackup.log" 2>&1 || { cat "$dir/pg2/basebackup.log" >&2; die "pg_basebackup failed"; }
	cat >>"$dir/pg2/data/postgresql.conf" <<EOF
port = $p2
unix_socket_directories = '$dir/pg2'
cluster_name = 'replica'
EOF
	as_pg "$PG_BIN/pg_ctl" -D "$dir/pg2/data" -l "$dir/pg2/postgres.log" -w -t 60 start >/dev/null ||
		{ tail -20 "$dir/pg2/postgres.log" >&2; die "the replica did not start (log: $dir/pg2/postgres.log)"; }
	if [ "$mode" = sync ]; then
		as_pg psql -h 127.0.0.1 -p "$p1" -U postgres -qc "ALTER SYSTEM SET synchronous_standby_names = 'replica'" >/dev/null &&
			as_pg psql -h 127.0.0.1 -p "$p1" -U postgres -qc "SELECT pg_reload_conf()" >/dev/null ||
			die "could not make the replica synchronous"
	fi
	local i state=
	for i in $(seq 1 60); do
		state=$(as_pg psql -h 127.0.0.1 -p "$p1" -U postgres -Atqc \
			"SELECT sync_state FROM pg_stat_replication WHERE application_name = 'replica' AND state = 'streaming'")
		[ "$state" = "$mode" ] && break
		sleep 0.5
	done
	[ "$state" = "$mode" ] || die "the replica does not stream as $mode (state '$state'; log: $dir/pg2/postgres.log)"
	sed -i '/^export SAGA_PG_URL=/d' "$dir/env.sh"
	{
		echo "export SAGA_PG_URL='postgres://postgres@127.0.0.1:$p1,127.0.0.1:$p2/saga?sslmode=disable&target_session_attrs=read-write'"
		echo "export SAGA_PG_PRIMARY_URL='postgres://postgres@127.0.0.1:$p1/saga?sslmode=disable'"
		echo "export SAGA_PG_REPLICA_URL='postgres://postgres@127.0.0.1:$p2/saga?sslmode=disable'"
	} >>"$dir/env.sh"
	trap - EXIT
	log "PostgreSQL replica ($mode) on 127.0.0.1:$p2, streaming from 127.0.0.1:$p1"
}

# cmd_replica_failover DIR: the primary crashes (immediate stop: no checkpoint, clients cut) and
# the replica is promoted; it takes writes as soon as the promotion returns. The old primary stays
# down (it would need pg_rewind to follow the new one).
cmd_replica_failover() {
	local dir=${1:?usage: services.sh replica-failover DIR}
	dir=$(cd "$dir" && pwd)
	[ -f "$dir/pg2/port" ] || die "no replica in $dir"
	as_pg "$PG_BIN/pg_ctl" -D "$dir/pg/data" -m immediate -w -t 60 stop >/dev/null ||
		die "the primary in $dir did not stop"
	as_pg "$PG_BIN/pg_ctl" -D "$dir/pg2/data" -w -t 60 promote >/dev/null ||
		{ tail -20 "$dir/pg2/postgres.log" >&2; die "the replica in $dir was not promoted"; }
	log "primary stopped, replica promoted on 127.0.0.1:$(cat "$dir/pg2/port")"
}

# cmd_replica_stop DIR: stop what replica-start started.
cmd_replica_stop() {
	local dir=${1:?usage: services.sh replica-stop DIR}
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	if [ -f "$dir/pg2/data/postmaster.pid" ]; then
		as_pg "$PG_BIN/pg_ctl" -D "$dir/pg2/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
	fi
	cmd_stop "$dir"
}

# use_netns DIR: run the servers of DIR in the namespaces netns-start recorded in DIR/netns.
use_netns() {
	local dir=$1 pgns pgaddr mqns mqaddr
	read -r pgns pgaddr mqns mqaddr <"$dir/netns" || die "no namespaces recorded in $dir/netns"
	PG_NS=(ip netns exec "$pgns")
	RMQ_NS=(ip netns exec "$mqns")
	PG_LISTEN="127.0.0.1,$pgaddr"
	# The namespace is private to the run: any client that reaches it over its link may connect.
	PG_HBA_EXTRA="host all all 0.0.0.0/0 trust"
	RMQ_EXTRA_ADDR=$mqaddr
	RMQ_MGMT_IP=0.0.0.0
}

# cmd_netns_start DIR PG_NS PG_ADDR RABBIT_NS RABBIT_ADDR: PostgreSQL and RabbitMQ as start makes
# them (no Redis), each in the given network namespace (which must exist, with its address up)
# listening on its address as well as on the namespace's loopback, as separate hosts would run
# them. DIR/env.sh names the namespace addresses.
cmd_netns_start() {
	local usage="usage: services.sh netns-start DIR PG_NS PG_ADDR RABBIT_NS RABBIT_ADDR"
	local dir=${1:?$usage} pgns=${2:?$usage} pgaddr=${3:?$usage} mqns=${4:?$usage} mqaddr=${5:?$usage} ns
	[ "$(id -u)" -eq 0 ] || die "netns-start: entering network namespaces needs root"
	for ns in "$pgns" "$mqns"; do
		[ -e "/run/netns/$ns" ] || die "netns-start: no network namespace $ns (ip netns add $ns)"
	done
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	chmod 755 "$dir"
	trap 'cmd_netns_stop "$dir" >/dev/null 2>&1 || true' EXIT
	echo debian12 >"$dir/versions"
	echo "$pgns $pgaddr $mqns $mqaddr" >"$dir/netns"
	use_netns "$dir"
	ensure_installed
	command -v curl >/dev/null || apt_install curl
	make_tls "$dir"
	chown -R "$PG_OWNER" "$dir/pg" 2>/dev/null || true
	start_pg "$dir"
	start_rabbit "$dir"
	cat >"$dir/env.sh" <<EOF
export SAGA_SERVICES_DIR='$dir'
export SAGA_SERVICES_VERSIONS='debian12'
export SAGA_PG_URL='postgres://postgres@$pgaddr:$(cat "$dir/pg/port")/saga?sslmode=disable'
export SAGA_AMQP_URL='amqp://guest:guest@$mqaddr:$(cat "$dir/rabbit/port")/'
export SAGA_RABBIT_API='http://guest:guest@$mqaddr:$(cat "$dir/rabbit/mgmt-port")/api'
EOF
	trap - EXIT
	log "PostgreSQL on $pgaddr:$(cat "$dir/pg/port") in namespace $pgns, RabbitMQ on $mqaddr:$(cat "$dir/rabbit/port") in $mqns: source $dir/env.sh"
}

# cmd_netns_stop DIR: stop what netns-start started, and the epmd left in RabbitMQ's namespace.
cmd_netns_stop() {
	local dir=${1:?usage: services.sh netns-stop DIR}
	[ -f "$dir/netns" ] || return 0
	dir=$(cd "$dir" && pwd)
	use_netns "$dir"
	if [ -f "$dir/rabbit/port" ]; then
		stop_rabbit "$dir"
		"${RMQ_NS[@]}" env ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 || true
	fi
	stop_pg "$dir"
	log "stopped the services in $dir"
}

case "${1:-}" in
netns-start) shift; cmd_netns_start "$@" ;;
netns-stop) shift; cmd_netns_stop "$@" ;;
replica-start) shift; cmd_replica_start "$@" ;;
replica-failover) shift; cmd_replica_failover "$@" ;;
replica-stop) shift; cmd_replica_stop "$@" ;;
cluster-start) shift; cmd_cluster_start "$@" ;;
cluster-node) shift; cmd_cluster_node "$@" ;;
cluster-stop) shift; cmd_cluster_stop "$@" ;;
start) shift; cmd_start "$@" ;;
restart) shift; cmd_restart "$@" ;;
stop) shift; cmd_stop "$@" ;;
status) shift; cmd_status "$@" ;;
*) die "usage: services.sh start|stop|status DIR, services.sh netns-start DIR PG_NS PG_ADDR RABBIT_NS RABBIT_ADDR, services.sh netns-stop DIR, services.sh restart DIR [pg|rabbit|redis|all], services.sh cluster-start|cluster-node|cluster-stop DIR ..., or services.sh replica-start|replica-failover|replica-stop DIR ..." ;;
esac
