#!/usr/bin/env bash
# with-services.sh CMD [ARGS...] — run CMD with a private PostgreSQL and RabbitMQ.
#
# If SAGA_TEST_PG_URL and SAGA_TEST_AMQP_URL are already set (services you started with
# `scripts/services.sh start DIR` and `source DIR/env.sh`), CMD runs against them. Otherwise the
# services are started in a temporary directory and stopped when CMD ends — also when it fails or
# the run is interrupted. With CI=true, a service that cannot start fails the run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

if [ -n "${SAGA_TEST_PG_URL:-}" ] && [ -n "${SAGA_TEST_AMQP_URL:-}" ]; then
	exec "$@"
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
