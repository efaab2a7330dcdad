#!/usr/bin/env bash
# gotest.sh [go test flags and packages] — run `go test -v`, print the usual per-package lines
# (and the full output of failures), then one summary line. A skipped test is not a passing
# test: under CI=true any skip fails the run, and outside CI every skip is listed with its reason.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
go test -v "$@" >"$log" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
	# Everything but the noise of passing tests, so failures show with their messages.
	grep -v -E '^\s*(=== (RUN|PAUSE|CONT|NAME)|--- PASS)' "$log"
else
	grep -E '^(ok|FAIL|\?|panic:)' "$log" | grep -v 'no test files'
fi
passed=$(grep -c -E '^\s*--- PASS' "$log")
failed=$(grep -c -E '^\s*--- FAIL' "$log")
skipped=$(grep -c -E '^\s*--- SKIP' "$log")
if [ "$skipped" -gt 0 ]; then
	echo "skipped tests (and skip reasons logged near them; parallel tests interleave):"
	awk '/^[[:space:]]*--- SKIP/ { print; n = 4; next }
	     n > 0 && /^[[:space:]]+[^[:space:]]+\.go:[0-9]+:/ { print; n = 0; next }
	     n > 0 { n-- }' "$log"
	if [ "${CI:-}" = "true" ]; then
		echo "gotest: $skipped test(s) skipped under CI=true; a skipped test is not a passing test" >&2
		[ "$rc" -eq 0 ] && rc=1
	fi
fi
echo "$passed passed, $failed failed, $skipped skipped"
exit "$rc"
