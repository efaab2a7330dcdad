#!/usr/bin/env bash
# ensure-tools.sh — install the Debian tools some tests drive when they are missing: Chromium
# (the console's browser tests) and protoc (the plugin under plain protoc). Without root (and
# not in CI) it only says what to install: those tests then skip, and fail under CI=true.
set -euo pipefail
missing=()
if ! { [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ]; } && ! command -v chromium >/dev/null 2>&1; then
	missing+=(chromium)
fi
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "ensure-tools: missing ${missing[*]}; install with: sudo apt-get install -y ${missing[*]}" >&2
	[ "${CI:-}" = "true" ] && exit 1
	exit 0
fi
echo "ensure-tools: installing ${missing[*]}" >&2
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
command -v chromium >/dev/null && command -v protoc >/dev/null ||
	{ echo "ensure-tools: still missing after install: ${missing[*]}" >&2; exit 1; }
