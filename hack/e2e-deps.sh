#!/usr/bin/env bash
# Prepares what e2e/ needs to run a real single-node Kubernetes here:
#   - Debian packages: containernetworking-plugins, etcd-server, prometheus,
#     iptables, nftables (installed without starting any daemon: the tests
#     start their own, and the Debian services stay off); containerd 2 and
#     runc come from hack/v2node-deps.sh (Debian's 1.6 is too old for the
#     kubelet 1.37),
#   - Kubernetes v1.37.2 server binaries built from the Go module proxy into
#     a cache dir (skipped when they are there already),
#   - kubectl: the machine's when there is one, else built the same way;
#   - helm, by hack/helm.sh (built once from the Go module proxy, cached);
#   - Knative Serving's components as image tarballs, by hack/knative.sh
#     (built once from the Go module proxy, cached; beside Kubernetes').
#
# Idempotent. Run as root on Debian 12.
#
# Cache dir: $CPUSLOT_E2E_CACHE, default <repo>/.cache/e2e (gitignored).
# Results (what e2e/cluster looks for):
#   $CACHE/k8s/v1.37.2/bin/{kube-apiserver,kube-controller-manager,
#                           kube-scheduler,kubelet,kube-proxy[,kubectl]}
# Prints "KUBE_BIN=<that dir>", "KUBECTL=<path>" and "HELM=<path>" on its
# last lines.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${CPUSLOT_E2E_CACHE:-$repo/.cache/e2e}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

k8s_version="${CPUSLOT_K8S_VERSION:-v1.37.2}"
bindir="$cache/k8s/$k8s_version/bin"
servers=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { echo "e2e-deps: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
	log "must run as root (the cluster it prepares for runs as root)"
	exit 1
fi

# ---------------------------------------------------------------------------
# 1. Debian packages, without starting their services.
# ---------------------------------------------------------------------------
# nftables: nft deletes the nf_tables tables iptables-nft creates for the
# cluster (iptables itself cannot), so teardown leaves none behind.
packages=(containernetworking-plugins etcd-server prometheus iptables nftables)
missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

# Daemons the packages ship: must not be running because of us.
daemons=(containerd etcd prometheus prometheus-node-exporter)
pids_of() { # names -> "pid pid ..." of processes whose comm is one of them
	local n pids=()
	for n in "$@"; do
		pids+=($(pgrep -x "$n" 2>/dev/null || true))
	done
	echo "${pids[*]:-}"
}

if [ "${#missing[@]}" -gt 0 ]; then
	before=" $(pids_of "${daemons[@]}") "
	log "installing ${missing[*]}"
	# policy-rc.d exit 101 tells invoke-rc.d and deb-systemd-invoke not to
	# start (or restart) any service during the install. Keep one that is
	# already there.
	policy=/usr/sbin/policy-rc.d
	own_policy=0
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 0755 "$policy"
		own_policy=1
	fi
	cleanup_policy() { if [ "$own_policy" = 1 ]; then rm -f "$policy"; fi; }
	trap cleanup_policy EXIT
	install() {
		env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends "${missing[@]}" >/dev/null
	}
	if ! install; then
		log "apt-get update"
		apt-get update -qq
		install
	fi
	cleanup_policy
	trap - EXIT

	# Services stay off: disabled where systemd runs (it would start them at
	# boot), and any daemon that appeared during the install is stopped.
	if [ -d /run/systemd/system ]; then
		for p in "${missing[@]}"; do
			case "$p" in
			containerd) unit=containerd ;;
			etcd-server) unit=etcd ;;
			prometheus) unit=prometheus ;;
			*) continue ;;
			esac
			systemctl disable --now "$unit" >/dev/null 2>&1 || true
		done
	fi
	for pid in $(pids_of "${daemons[@]}"); do
		case "$before" in *" $pid "*) continue ;; esac
		log "stopping $(cat /proc/"$pid"/comm 2>/dev/null || echo '?') (pid $pid), started by the package install"
		kill "$pid" 2>/dev/null || true
	done
fi
# containerd, ctr and runc are hack/v2node-deps.sh's builds, in the cache, not on PATH.
for b in etcd prometheus iptables nft; do
	command -v "$b" >/dev/null || { log "$b not found after install"; exit 1; }
done
for p in bridge host-local loopback; do
	[ -x "/usr/lib/cni/$p" ] || { log "/usr/lib/cni/$p missing"; exit 1; }
done

# Knative's build (step 4) starts now, beside Kubernetes': on a new machine
# it mostly waits on module downloads while Kubernetes compiles.
knative_out=""
knative_pid=""
if [ -f "$repo/hack/knative.sh" ]; then
	knative_out="$(mktemp)"
	trap 'rm -f "$knative_out"; [ -z "$knative_pid" ] || kill "$knative_pid" 2>/dev/null || true' EXIT
	bash "$repo/hack/knative.sh" >"$knative_out" &
	knative_pid=$!
fi

# ---------------------------------------------------------------------------
# 2. Kubernetes binaries from the Go module proxy.
# ---------------------------------------------------------------------------
want=("${servers[@]}")
kubectl="$(command -v kubectl || true)"
if [ -z "$kubectl" ]; then
	want+=(kubectl)
	kubectl="$bindir/kubectl"
fi

have_all=1
for b in "${want[@]}"; do
	[ -x "$bindir/$b" ] || have_all=0
done

if [ "$have_all" = 0 ]; then
	# Wait out a quiet period (a benchmark running on this machine).
	while [ -e /tmp/cpuslot-quiet ]; do
		log "waiting for /tmp/cpuslot-quiet to go away"
		sleep 10
	done
	command -v go >/dev/null || { log "go not found"; exit 1; }
	mod="$cache/k8s/$k8s_version/module"
	mkdir -p "$mod" "$bindir"
	export GONOSUMDB=k8s.io GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOWORK=off
	# The staging modules (k8s.io/api, ...) are replaced in kubernetes'
	# go.mod by ./staging/src/...; a module that depends on it must replace
	# each of them by its published v0.x.y.
	if [ ! -s "$mod/go.mod" ] || ! grep -q "k8s.io/kubernetes $k8s_version" "$mod/go.mod"; then
		log "resolving k8s.io/kubernetes@$k8s_version"
		# A go.mod of its own first, so go does not use the repo's.
		printf 'module cpuslot.local/e2e-k8s-build\n' >"$mod/go.mod"
		rm -f "$mod/go.sum"
		kmod="$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$k8s_version" |
			sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
		[ -s "$kmod" ] || { log "cannot download k8s.io/kubernetes@$k8s_version"; exit 1; }
		staging_version="v0.${k8s_version#v1.}"
		{
			echo "module cpuslot.local/e2e-k8s-build"
			echo
			echo "go $(sed -n 's/^go //p' "$kmod")"
			echo
			echo "require k8s.io/kubernetes $k8s_version"
			echo
			echo "replace ("
			sed -n 's|^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*$|\t\1 => \1 '"$staging_version"'|p' "$kmod"
			echo ")"
		} >"$mod/go.mod.tmp"
		grep -q 'k8s.io/api => k8s.io/api' "$mod/go.mod.tmp" ||
			{ log "no staging replace directives found in kubernetes' go.mod"; exit 1; }
		mv "$mod/go.mod.tmp" "$mod/go.mod"
		rm -f "$mod/go.sum"
	fi
	pkgs=()
	for b in "${want[@]}"; do
		pkgs+=("k8s.io/kubernetes/cmd/$b")
	done
	ldflags=""
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$k8s_version"
		ldflags+=" -X $pkg.gitMajor=$(echo "${k8s_version#v}" | cut -d. -f1)"
		ldflags+=" -X $pkg.gitMinor=$(echo "${k8s_version#v}" | cut -d. -f2)"
		ldflags+=" -X $pkg.gitTreeState=clean"
		ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	log "building ${want[*]} $k8s_version (a few minutes the first time)"
	start=$(date +%s)
	(cd "$mod" && go build -trimpath -ldflags "-s -w$ldflags" -o "$bindir/" "${pkgs[@]}")
	log "built in $(($(date +%s) - start)) s"
	for b in "${want[@]}"; do
		[ -x "$bindir/$b" ] || { log "$bindir/$b missing after the build"; exit 1; }
	done
fi
ver="$("$bindir/kubelet" --version 2>/dev/null || true)"
case "$ver" in
*"$k8s_version"*) ;;
*) log "$bindir/kubelet reports '$ver', want $k8s_version (delete $bindir to rebuild)"; exit 1 ;;
esac

# ---------------------------------------------------------------------------
# 3. helm, from hack/helm.sh (which builds and caches it) when it exists.
# ---------------------------------------------------------------------------
helm=""
if [ -f "$repo/hack/helm.sh" ]; then
	helm="$(bash "$repo/hack/helm.sh" | tail -n1)"
	[ -x "$helm" ] || { log "hack/helm.sh printed no helm binary"; exit 1; }
fi

# ---------------------------------------------------------------------------
# 4. Knative Serving, from hack/knative.sh (which builds and caches it).
# ---------------------------------------------------------------------------
knative=""
if [ -n "$knative_pid" ]; then
	pid=$knative_pid
	knative_pid=""
	wait "$pid" || { log "hack/knative.sh failed"; exit 1; }
	knative="$(sed -n 's/^KNATIVE_IMAGES=//p' "$knative_out")"
	[ -d "$knative" ] || { log "hack/knative.sh printed no image directory"; exit 1; }
fi

log "ready: $bindir ($ver), kubectl $kubectl${helm:+, helm $helm}${knative:+, Knative images $knative}"
echo "KUBE_BIN=$bindir"
echo "KUBECTL=$kubectl"
[ -z "$helm" ] || echo "HELM=$helm"
