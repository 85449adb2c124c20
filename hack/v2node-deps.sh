#!/usr/bin/env bash
# Prepares what the cgroup v2 / systemd node (e2e/v2node) needs, next to
# what hack/e2e-deps.sh and hack/vm-deps.sh prepare:
#   - Kubernetes $K8S_VERSION server binaries and kubectl (hack/e2e-deps.sh
#     with CPUSLOT_K8S_VERSION; the same throwaway-module build);
#   - containerd 2 (containerd, containerd-shim-runc-v2, ctr) built from the
#     Go module proxy;
#   - runc built from the Go module proxy with seccomp (cgo, Debian's
#     libseccomp-dev, installed here);
#   - the VM's kernel, busybox and modules (hack/vm-deps.sh).
# etcd is Debian's (hack/e2e-deps.sh installs it).
#
# Idempotent; a build is skipped when its binaries are there and report the
# pinned version. Run as root on Debian 12.
#
# Cache dir: $CPUSLOT_E2E_CACHE, default <repo>/.cache/e2e (gitignored).
# Results (what e2e/v2node looks for):
#   $CACHE/k8s/$K8S_VERSION/bin/{kube-apiserver,...,kubelet,kubectl}
#   $CACHE/containerd/$CONTAINERD_VERSION/bin/{containerd,containerd-shim-runc-v2,ctr}
#   $CACHE/runc/$RUNC_VERSION/bin/runc
# Prints "KUBE_BIN=", "CONTAINERD_BIN=", "RUNC=" on its last lines.
#
# Environment: CPUSLOT_V2_K8S_VERSION, CPUSLOT_CONTAINERD_VERSION,
# CPUSLOT_RUNC_VERSION override the pins below.
set -euo pipefail
# Version checks pipe into grep without -q: grep -q exits at its first
# match, and the version command, still writing, then dies of SIGPIPE,
# which pipefail turns into a failed check.

# The newest releases the Go module proxy serves that build here
# (`go list -m -versions MODULE`).
k8s_version="${CPUSLOT_V2_K8S_VERSION:-v1.37.2}"
containerd_version="${CPUSLOT_CONTAINERD_VERSION:-v2.4.2}"
runc_version="${CPUSLOT_RUNC_VERSION:-v1.5.2}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${CPUSLOT_E2E_CACHE:-$repo/.cache/e2e}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

log() { echo "v2node-deps: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
	log "must run as root"
	exit 1
fi
command -v go >/dev/null || { log "go not found"; exit 1; }

wait_quiet() {
	while [ -e /tmp/cpuslot-quiet ]; do
		log "waiting for /tmp/cpuslot-quiet to go away"
		sleep 10
	done
}

# prepare_module DIR MODULE VERSION: a throwaway module in DIR requiring
# MODULE@VERSION (a go.mod of its own, so the repo's plays no part).
prepare_module() {
	local dir="$1" module="$2" version="$3"
	mkdir -p "$dir"
	if [ ! -s "$dir/go.mod" ] || ! grep -q "^require $module $version\$" "$dir/go.mod"; then
		printf 'module cpuslot.local/v2node-build\n\nrequire %s %s\n' "$module" "$version" >"$dir/go.mod"
		rm -f "$dir/go.sum"
	fi
}

# 1. containerd 2.
cbin="$cache/containerd/$containerd_version/bin"
if ! "$cbin/containerd" --version 2>/dev/null | grep " $containerd_version\b" >/dev/null ||
	[ ! -x "$cbin/containerd-shim-runc-v2" ] || [ ! -x "$cbin/ctr" ]; then
	wait_quiet
	mod="$cache/containerd/$containerd_version/module"
	prepare_module "$mod" github.com/containerd/containerd/v2 "$containerd_version"
	mkdir -p "$cbin"
	log "building containerd $containerd_version"
	start=$(date +%s)
	# No cgo: the btrfs snapshotter (cgo) is left out, as in containerd's
	# static builds; overlayfs is what the node uses. The checksum database
	# does not answer for some of containerd's Windows-only dependencies
	# (github.com/Microsoft/...), whose go.mod files the module graph needs.
	(cd "$mod" && GONOSUMDB="${GONOSUMDB:+$GONOSUMDB,}github.com/Microsoft,k8s.io" GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 \
		go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version -X github.com/containerd/containerd/v2/version.Revision=module-proxy" \
		-o "$cbin/" \
		github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/ctr)
	log "containerd built in $(($(date +%s) - start)) s"
fi
"$cbin/containerd" --version | grep " $containerd_version\b" >/dev/null ||
	{ log "$cbin/containerd reports '$("$cbin/containerd" --version)', want $containerd_version"; exit 1; }

# 2. runc, with seccomp (cgo + libseccomp).
rbin="$cache/runc/$runc_version/bin"
if ! "$rbin/runc" --version 2>/dev/null | grep "^runc version ${runc_version#v}\$" >/dev/null; then
	wait_quiet
	if ! dpkg-query -W -f='${Status}' libseccomp-dev 2>/dev/null | grep -q 'install ok installed'; then
		log "installing libseccomp-dev"
		install() { env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config >/dev/null; }
		install || { apt-get update -qq && install; }
	fi
	mod="$cache/runc/$runc_version/module"
	prepare_module "$mod" github.com/opencontainers/runc "$runc_version"
	mkdir -p "$rbin"
	log "building runc $runc_version"
	start=$(date +%s)
	# The Makefile's tags minus libpathrs (a Rust library Debian 12 lacks).
	(cd "$mod" && GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=1 \
		go build -trimpath -tags "seccomp urfave_cli_no_docs" \
		-ldflags "-s -w -X main.gitCommit=module-proxy" \
		-o "$rbin/runc" github.com/opencontainers/runc)
	log "runc built in $(($(date +%s) - start)) s"
fi
"$rbin/runc" --version | grep "^runc version ${runc_version#v}\$" >/dev/null ||
	{ log "$rbin/runc reports '$("$rbin/runc" --version | head -n1)', want ${runc_version#v}"; exit 1; }
"$rbin/runc" --version | grep '^libseccomp' >/dev/null ||
	{ log "$rbin/runc was built without seccomp"; exit 1; }

# 3. Kubernetes, the way the v1 node's is built.
kube="$(CPUSLOT_K8S_VERSION="$k8s_version" bash "$repo/hack/e2e-deps.sh")"
kube_bin="$(sed -n 's/^KUBE_BIN=//p' <<<"$kube")"
[ -x "$kube_bin/kubelet" ] || { log "hack/e2e-deps.sh gave no kubelet"; exit 1; }

# 4. The VM, with the modules of its systemd boot.
bash "$repo/hack/vm-deps.sh"

log "ready: $kube_bin, $cbin, $rbin"
echo "KUBE_BIN=$kube_bin"
echo "CONTAINERD_BIN=$cbin"
echo "RUNC=$rbin/runc"
