#!/usr/bin/env bash
# ensure-chromium.sh — install Debian's headless Chromium for the console's browser tests when
# it is missing. The tests look for $CHROMIUM, then chromium on PATH. Without root (and not in
# CI) it only says what to install: the browser tests then skip, and fail under CI=true.
set -euo pipefail
if [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ]; then exit 0; fi
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
	echo "ensure-chromium: chromium is missing; install it with: sudo apt-get install -y chromium" >&2
	[ "${CI:-}" = "true" ] && exit 1
	exit 0
fi
echo "ensure-chromium: installing Debian's chromium for the browser tests" >&2
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null || { echo "ensure-chromium: chromium still missing after install" >&2; exit 1; }
