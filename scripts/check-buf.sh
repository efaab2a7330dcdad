#!/usr/bin/env bash
# check-buf.sh BUF — run `buf generate` for the workspace into a temporary directory and fail
# when any file it writes differs from the committed one (or is not committed). This proves
# the README's `buf generate` path produces exactly what is in the repository.
set -euo pipefail
buf=${1:?usage: check-buf.sh PATH-TO-BUF}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$buf" generate -o "$out"
n=0 bad=0
while IFS= read -r -d '' f; do
	rel=${f#"$out"/}
	n=$((n + 1))
	if ! cmp -s "$f" "$rel"; then
		echo "check-buf: $rel differs from what buf generate writes (run 'make generate' and commit)" >&2
		bad=$((bad + 1))
	fi
done < <(find "$out" -type f -print0)
if [ "$n" -eq 0 ]; then
	echo "check-buf: buf generate wrote no files" >&2
	exit 1
fi
if [ "$bad" -ne 0 ]; then exit 1; fi
echo "check-buf: buf generate reproduces all $n committed generated files"
