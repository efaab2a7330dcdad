#!/usr/bin/env bash
# with-services.sh CMD [ARGS...] — run CMD with a private PostgreSQL, RabbitMQ and Redis.
#
# CMD runs with the variables of scripts/services.sh's env.sh (SAGA_PG_URL, SAGA_AMQP_URL,
# SAGA_RABBIT_API, the TLS ones, SAGA_REDIS_URL and SAGA_SERVICES_DIR), always taken from an env.sh, never from
# the caller's environment: a SAGA_PG_URL that names the user's own database is overridden, so
# `make test` and `make demo` never touch it. When SAGA_SERVICES_DIR names a directory where
# services.sh started servers that still run (`scripts/services.sh start DIR` and
# `source DIR/env.sh`) and they are of the versions SAGA_SERVICES_VERSIONS asks for (services.sh:
# debian12 by default, or new), CMD runs against those. Otherwise the services are started in a
# temporary directory and stopped when CMD ends — also when it fails or the run is interrupted.
# With CI=true, a service that cannot start fails the run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

# The running services are reused only when they are of the versions asked for
# (SAGA_SERVICES_VERSIONS, see services.sh).
if [ -n "${SAGA_SERVICES_DIR:-}" ] && "$here/services.sh" status "$SAGA_SERVICES_DIR" >/dev/null 2>&1 &&
	[ "$(cat "$SAGA_SERVICES_DIR/versions" 2>/dev/null || echo debian12)" = "${SAGA_SERVICES_VERSIONS:-debian12}" ]; then
	echo "services: using the running services in $SAGA_SERVICES_DIR" >&2
	# shellcheck disable=SC1091
	source "$SAGA_SERVICES_DIR/env.sh"
	exec "$@"
fi
if [ -n "${SAGA_SERVICES_DIR:-}" ]; then
	echo "services: $SAGA_SERVICES_DIR holds no running services of the versions asked for; starting private ones" >&2
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/saga-services.XXXXXX")
cleanup() {
	local rc=$?
	"$here/services.sh" stop "$dir" || true
	if [ "$rc" -eq 0 ]; then rm -rf "$dir"; else echo "services: logs kept in $dir" >&2; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! "$here/services.sh" start "$dir"; then
	echo "services: could not start PostgreSQL and RabbitMQ (see above; logs in $dir)." >&2
	exit 1
fi
# shellcheck disable=SC1091
source "$dir/env.sh"
"$@"
