#!/usr/bin/env bash
# setup.sh installs everything k7 needs on a fresh Debian 12 machine and
# builds k7's binaries into bin/. It is idempotent: a second run checks,
# finds everything in place and changes nothing.
#
#   Debian packages   busybox-static (the built-in busybox image), e2fsprogs
#                     (ext4 root disks), qemu-system-x86 and linux-image-amd64
#                     (the qemu engine's VMM and guest kernel), nftables and
#                     iproute2 (network tests compare listings), procps
#   runsc             built from the pinned gvisor.dev/gvisor Go module into
#                     $K7_CACHE/runsc/<version>/runsc, linked as bin/runsc
#   k7, k7d, k7-agent built from this tree into bin/, with k7-vminit (the
#                     qemu engine's /init, next to k7-agent)
#
# Nothing is downloaded from anywhere but Debian's archive and the Go module
# proxy.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

# The pinned gVisor build. Checkpoints restore only into the same build.
GVISOR_VERSION=${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}
K7_CACHE=${K7_CACHE:-/var/cache/k7}
export GOFLAGS=${GOFLAGS:--buildvcs=false}

log() { printf 'setup: %s\n' "$*" >&2; }

need_root() {
	if [ "$(id -u)" != 0 ]; then
		log "must run as root (sandboxes need namespaces, cgroups and mounts)"
		exit 1
	fi
}

apt_packages() {
	local missing=()
	for p in busybox-static e2fsprogs xz-utils qemu-system-x86 linux-image-amd64 nftables iproute2 procps; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if [ ${#missing[@]} -eq 0 ]; then
		log "debian packages: present"
		return
	fi
	log "debian packages: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${missing[@]}" >/dev/null
}

build_runsc() {
	local dir="$K7_CACHE/runsc/$GVISOR_VERSION"
	local bin="$dir/runsc"
	if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
		log "runsc $GVISOR_VERSION: present ($bin)"
	else
		log "runsc $GVISOR_VERSION: building from the Go module (about a minute, longer on a cold module cache)"
		local work
		work=$(mktemp -d)
		trap 'rm -rf "$work"' RETURN
		printf 'module runsc\n\ngo 1.26\n' >"$work/go.mod"
		(cd "$work" && go get "gvisor.dev/gvisor/runsc@$GVISOR_VERSION" >/dev/null 2>&1 &&
			CGO_ENABLED=0 go build -o runsc gvisor.dev/gvisor/runsc)
		mkdir -p "$dir"
		mv "$work/runsc" "$bin.tmp" && mv "$bin.tmp" "$bin"
	fi
	mkdir -p "$root/bin"
	if [ "$(readlink "$root/bin/runsc" 2>/dev/null)" != "$bin" ]; then
		ln -sfn "$bin" "$root/bin/runsc"
	fi
}

build_k7() {
	log "k7: building bin/k7 bin/k7d bin/k7-agent bin/k7-vminit"
	mkdir -p "$root/bin"
	local ldflags="-X github.com/k7-dev/k7/internal/version.Version=$(cat "$root/VERSION" 2>/dev/null || echo dev)"
	CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$root/bin/" ./cmd/k7 ./cmd/k7d ./cmd/k7-agent
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$root/bin/k7-vminit" ./internal/engine/qemu/vminit
}

need_root
apt_packages
build_runsc
build_k7
log "done"
