#!/usr/bin/env bash
# bench.sh runs `k7 bench lifecycle` (default) or `k7 bench scaling`
# against a temporary k7d of its own (state dir and socket under a temp dir,
# removed afterwards) and writes the raw samples (JSON) and the Markdown
# table to out/bench/ (--out DIR to change).
#   ./scripts/bench.sh [lifecycle] [--engine E] [--reps N] [--warmup N]
#   ./scripts/bench.sh scaling [--engine E] [--sizes MIB,...] [--running N,...]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

tmp=$(mktemp -d)
sock="$tmp/k7.sock"
./bin/k7d --state-dir "$tmp/state" --socket "$sock" >"$tmp/k7d.log" 2>&1 &
pid=$!
cleanup() {
	kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	./bin/k7d --cleanup --state-dir "$tmp/state" --socket "$sock" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
export K7_HOST="unix://$sock"
for _ in $(seq 100); do ./bin/k7 info >/dev/null 2>&1 && break; sleep 0.1; done

case "${1:-}" in
scaling)
	shift
	./bin/k7 bench scaling --out out/bench "$@"
	;;
*)
	[ "${1:-}" = lifecycle ] && shift
	./bin/k7 bench lifecycle --out out/bench --runsc "$(pwd)/bin/runsc" "$@"
	;;
esac
