# k7 — common tasks. `make help` lists them.
export GOFLAGS ?= -buildvcs=false
GOLANGCI_VERSION ?= v2.6.2

.PHONY: help setup build quickstart test lint bench clean

help: ## list targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

setup: ## install Debian packages, build runsc and k7 (idempotent)
	./scripts/setup.sh

build: ## build bin/k7 bin/k7d bin/k7-agent bin/k7-vminit
	CGO_ENABLED=0 go build -o bin/ ./cmd/k7 ./cmd/k7d ./cmd/k7-agent
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/k7-vminit ./internal/engine/qemu/vminit

quickstart: ## set up, start k7d, create, exec, fork
	./scripts/quickstart.sh

test: ## everything CI runs
	./scripts/test.sh

lint: ## golangci-lint with .golangci.yml
	go run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION) run ./...

bench: ## lifecycle benchmark against a temporary daemon
	./scripts/bench.sh

clean: ## remove build outputs
	rm -rf bin
