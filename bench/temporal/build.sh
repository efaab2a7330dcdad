#!/usr/bin/env bash
# build.sh — build the Temporal server and its SQL schema tool for sagabench's Temporal peer, once per
# machine, and print the directory that holds them (sagabench -temporal DIR).
#
# Both come from the Go module proxy at the pinned version (go install MODULE/cmd/...@VERSION, with
# the server's own go.mod and go.sum), into a cache outside the clone: nothing of Temporal's is
# committed or vendored. The build takes about 10 minutes of CPU (25 minutes of wall time on a
# 2-core machine shared with other work).
#
#   TEMPORAL_CACHE   where to build (default ~/.cache/protosaga/temporal-VERSION)
set -euo pipefail

version=v1.32.1 # the newest go.temporal.io/server whose go.mod accepts this machine's Go (1.26.8)
dir=${TEMPORAL_CACHE:-${HOME}/.cache/protosaga/temporal-$version}

if [ -x "$dir/server" ] && [ -x "$dir/sql" ]; then
	echo "$dir"
	exit 0
fi
echo "temporal: building go.temporal.io/server $version (cmd/server, cmd/tools/sql) into $dir (about 10 minutes, once)" >&2
tmp="$dir.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
GOBIN="$tmp" GOFLAGS=-buildvcs=false go install \
	"go.temporal.io/server/cmd/server@$version" \
	"go.temporal.io/server/cmd/tools/sql@$version" >&2
rm -rf "$dir"
mv "$tmp" "$dir"
echo "$dir"
