#!/usr/bin/env bash
# check-bufplugin.sh BUF [-update-baseline] — run `buf lint` and `buf breaking` with buf-plugin-saga
# (built by `make buf-plugins`) over the workspace of buf.yaml: the examples and the options must
# pass every lint rule buf.yaml uses (STANDARD and the saga design review), and must not break
# what internal/bufcheck/testdata/baseline, the last accepted version of the workspace's
# contracts, declared (FILE and SAGA_BREAKING: sagas in flight).
#
# -update-baseline copies the workspace's current .proto files into the baseline instead: run it
# when a breaking change is intended, and commit the result.
set -euo pipefail
buf=${1:?usage: check-bufplugin.sh PATH-TO-BUF [-update-baseline]}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
baseline=internal/bufcheck/testdata/baseline
modules=$(sed -n 's/^  - path: //p' buf.yaml)

if [ "${2:-}" = "-update-baseline" ]; then
	rm -rf "$baseline"
	mkdir -p "$baseline"
	{
		echo "# The last accepted version of the workspace's contracts (buf.yaml's modules): make test runs"
		echo "# buf breaking against it. Written by scripts/check-bufplugin.sh BUF -update-baseline."
		echo "version: v2"
		echo "modules:"
		for m in $modules; do echo "  - path: $m"; done
	} >"$baseline/buf.yaml"
	for m in $modules; do
		(cd "$m" && find . -name '*.proto' -print0) | while IFS= read -r -d '' f; do
			mkdir -p "$baseline/$m/$(dirname "$f")"
			cp "$m/$f" "$baseline/$m/$f"
		done
	done
	echo "check-bufplugin: $baseline now holds the contracts of: $(echo $modules)"
	exit 0
fi

if [ ! -x "$buf" ]; then
	echo "check-bufplugin: buf is not built at $buf (make check-buf builds it)" >&2
	exit 1
fi
if [ ! -x .cache/bin/buf-plugin-saga ]; then
	echo "check-bufplugin: .cache/bin/buf-plugin-saga is not built (make buf-plugins builds it)" >&2
	exit 1
fi
# The plugin's rules must be configured, or both checks would pass without running them.
for m in $modules; do
	lint=$("$buf" config ls-lint-rules --configured-only --module-path "$m")
	breaking=$("$buf" config ls-breaking-rules --configured-only --module-path "$m")
	grep -q '^SAGA_COMMAND_IDEMPOTENCY ' <<<"$lint" ||
		{ echo "check-bufplugin: buf.yaml does not run the saga lint rules on $m (lint.use: SAGA)" >&2; exit 1; }
	grep -q '^SAGA_STEP_NO_DELETE ' <<<"$breaking" ||
		{ echo "check-bufplugin: buf.yaml does not run the saga breaking rules on $m (breaking.use: SAGA_BREAKING)" >&2; exit 1; }
done

if ! "$buf" lint; then
	echo "check-bufplugin: buf lint failed (findings above)" >&2
	exit 1
fi
echo "check-bufplugin: buf lint passes with the saga design review"
if ! "$buf" breaking --against "$baseline"; then
	echo "check-bufplugin: buf breaking against $baseline failed (findings above); if the break is intended," >&2
	echo "  run scripts/check-bufplugin.sh $buf -update-baseline and commit $baseline" >&2
	exit 1
fi
echo "check-bufplugin: buf breaking against $baseline passes (FILE, SAGA_BREAKING)"
