#!/usr/bin/env bash
# ensure-tools.sh — install the Debian tools some tests drive when they are missing: Chromium
# (the console's browser tests), protoc (the plugin under plain protoc, and
# the Python classes of examples/placeorder/pypayment) and Debian's Python with python3-pika,
# python3-psycopg2 and python3-protobuf (the Python participant). Without root (and not in CI) it
# only says what to install: those tests then skip, and fail under CI=true.
set -euo pipefail
missing=()
if ! { [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ]; } && ! command -v chromium >/dev/null 2>&1; then
	missing+=(chromium)
fi
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# Debian's interpreter, which the python3-* packages install into (another python3 may come first
# on PATH): examples/placeorder/pypayment runs /usr/bin/python3.
python_ok() { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import pika, psycopg2, google.protobuf' >/dev/null 2>&1; }
python_ok || missing+=(python3 python3-pika python3-psycopg2 python3-protobuf)
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "ensure-tools: missing ${missing[*]}; install with: sudo apt-get install -y ${missing[*]}" >&2
	[ "${CI:-}" = "true" ] && exit 1
	exit 0
fi
echo "ensure-tools: installing ${missing[*]}" >&2
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
command -v chromium >/dev/null && command -v protoc >/dev/null && python_ok ||
	{ echo "ensure-tools: still missing after install: ${missing[*]}" >&2; exit 1; }
