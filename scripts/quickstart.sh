#!/usr/bin/env bash
# quickstart.sh: set up the machine, start k7d on its embedded defaults and
# walk through the product: create a sandbox, run commands, start a
# background counter, fork it and show that the children carry the parent's
# memory (tmpfs file and the running process), then clean up.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

K7="$(pwd)/bin/k7"
state=${K7_STATE_DIR:-/var/lib/k7}
sock=${K7_SOCKET:-/run/k7/k7.sock}
export K7_HOST="unix://$sock"

started=
if "$K7" info >/dev/null 2>&1; then
	echo "== using the k7d already running at $K7_HOST"
else
	echo "== starting k7d (state $state, socket $sock, log /tmp/k7d-quickstart.log)"
	./bin/k7d --state-dir "$state" --socket "$sock" >/tmp/k7d-quickstart.log 2>&1 &
	started=$!
	for _ in $(seq 100); do
		"$K7" info >/dev/null 2>&1 && break
		sleep 0.1
	done
fi

ids=()
cleanup() {
	for id in "${ids[@]}"; do "$K7" rm -f "$id" >/dev/null 2>&1 || true; done
	if [ -n "$started" ]; then kill "$started" 2>/dev/null && wait "$started" 2>/dev/null || true; fi
}
trap cleanup EXIT

run() {
	printf '\n$'
	printf ' %q' "$@"
	printf '\n'
	"$@"
}

"$K7" info
run "$K7" create --name quickstart busybox
ids+=(quickstart)
run "$K7" exec quickstart -- sh -c 'echo "hello from $(hostname), kernel $(uname -r)"'
set +e
run "$K7" exec quickstart -- sh -c 'echo exiting with 3; exit 3'
echo "(exit code $?)"
set -e
run "$K7" exec quickstart -- sh -c 'echo "written before the fork" > /tmp/marker'
run "$K7" exec -d quickstart -- sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done'
sleep 1
run "$K7" exec quickstart -- cat /tmp/counter
printf '\n$ %s\n' "$K7 fork -q -n 2 quickstart"
mapfile -t children < <("$K7" fork -q -n 2 quickstart)
ids+=("${children[@]}")
printf '%s\n' "${children[@]}"
run "$K7" ls
for c in "${children[@]}"; do
	run "$K7" exec "$c" -- cat /tmp/marker
	a=$("$K7" exec "$c" -- cat /tmp/counter)
	sleep 0.5
	b=$("$K7" exec "$c" -- cat /tmp/counter)
	echo "child $c: counter $a, half a second later $b (the parent's loop keeps running in the child)"
done
run "$K7" tree quickstart
echo
echo "== done; removing the sandboxes"
