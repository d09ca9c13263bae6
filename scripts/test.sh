#!/usr/bin/env bash
# test.sh sets up the machine (scripts/setup.sh, idempotent), checks
# formatting and vet, and runs every test. Tests that need root, runsc or the
# built binaries fail instead of skipping here (K7_REQUIRE_ALL=1), so a broken
# setup cannot pass as skipped tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOFLAGS=${GOFLAGS:--buildvcs=false}

./scripts/setup.sh

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi
go vet ./...

export K7_REQUIRE_ALL=1
export K7_RUNSC="$(pwd)/bin/runsc"
# One package at a time (-p 1): the integration tests check latency budgets
# (internal/budget), which parallel packages (TCG guests, runsc suites) on
# two cores would only turn into noise.
go test -p 1 -count=1 -timeout 25m "$@" ./...
