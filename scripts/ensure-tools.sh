#!/usr/bin/env bash
# ensure-tools.sh — install the tools some tests drive when they are missing: Chromium (the
# console's browser tests and the BPMN export's rendering), protoc (the plugin under plain protoc,
# and the Python classes of examples/placeorder/pypayment), Debian's Python with python3-pika,
# python3-psycopg2 and python3-protobuf (the Python participant), Node.js and npm, and the npm
# packages of tools/bpmn (bpmn-moddle, bpmn-js: the BPMN export's checks), installed from its
# lockfile with `npm ci` into tools/bpmn/node_modules (never committed). Without root (and not in
# CI) it only says what to install: those tests then skip, and fail under CI=true.
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
{ command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; } || missing+=(nodejs npm)
if [ "${#missing[@]}" -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "ensure-tools: missing ${missing[*]}; install with: sudo apt-get install -y ${missing[*]}" >&2
		[ "${CI:-}" = "true" ] && exit 1
		exit 0
	fi
	echo "ensure-tools: installing ${missing[*]}" >&2
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	command -v chromium >/dev/null && command -v protoc >/dev/null && python_ok && command -v npm >/dev/null ||
		{ echo "ensure-tools: still missing after install: ${missing[*]}" >&2; exit 1; }
fi
# tools/bpmn's packages, exactly as its lockfile pins them; again when the lockfile changed.
bpmn=$(cd "$(dirname "$0")/../tools/bpmn" && pwd)
if [ ! -f "$bpmn/node_modules/.package-lock.json" ] || [ "$bpmn/package-lock.json" -nt "$bpmn/node_modules/.package-lock.json" ]; then
	echo "ensure-tools: npm ci in tools/bpmn" >&2
	npm ci --prefix "$bpmn" --no-audit --no-fund --loglevel=error >/dev/null ||
		{ echo "ensure-tools: npm ci in tools/bpmn failed" >&2; exit 1; }
fi
