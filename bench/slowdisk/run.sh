#!/usr/bin/env bash
# run.sh US [sagabench flags...] — sagabench on a simulated slower disk.
#
# Starts a private PostgreSQL and RabbitMQ whose every fsync and fdatasync
# takes US microseconds longer (slowsync.c, loaded with LD_PRELOAD), runs
# sagabench against them with the given flags, and stops them. Everything
# else is the machine's own: the same CPUs, the same page cache. Needs a C
# compiler (installed with apt-get when missing).
#
#	bench/slowdisk/run.sh 1000 -runs 3 -only pg,watermill,ours -workers 2
set -euo pipefail

us=${1:?usage: run.sh US [sagabench flags...]}
shift
case $us in '' | *[!0-9]*) echo "run.sh: US must be a whole number of microseconds, got '$us'" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

if ! command -v cc >/dev/null; then
	sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	echo "slowdisk: installing a C compiler (gcc)" >&2
	"${sudo[@]}" apt-get update -qq >/dev/null
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
fi
lib=$(mktemp -d "${TMPDIR:-/tmp}/slowsync.XXXXXX")
trap 'rm -rf "$lib"' EXIT
cc -shared -fPIC -O2 -o "$lib/slowsync.so" "$here/slowsync.c" -ldl
chmod 755 "$lib" "$lib/slowsync.so" # the servers run as other users

# Private services only: with-services.sh would reuse running ones that SAGA_SERVICES_DIR names.
unset SAGA_SERVICES_DIR
export SAGA_SERVICES_PRELOAD=$lib/slowsync.so SLOWSYNC_US=$us
"$root/scripts/with-services.sh" sh -c 'cd "$0/bench" && go run ./cmd/sagabench "$@"' "$root" "$@"
