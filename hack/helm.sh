#!/usr/bin/env bash
# hack/helm.sh: build helm once from the Go module proxy, cache it, print its
# path. Idempotent and safe to call concurrently; every script that needs helm
# calls it:
#
#   HELM=$(hack/helm.sh) && "$HELM" template charts/cpuslot
#
# The binary lives in $CPUSLOT_E2E_CACHE/tools/bin/helm (default
# <repo>/.cache/e2e/tools/bin/helm), beside the other builds keyed by version,
# so a fresh clone on a machine that built it once builds nothing. It is rebuilt only when
# the pinned version or the link-time settings below change (a stamp file
# records them) or the binary is missing.
#
# Link-time settings: built with `go install`, helm's Makefile does not run,
# so its defaults are those of the source: helm would report "v3.17" with no
# commit and, worse, `helm template` and `helm lint` would assume Kubernetes
# 1.20 (.Capabilities.KubeVersion, deprecation checks). We set the same
# variables helm's Makefile sets: Kubernetes = the client-go minor helm is
# built with (v0.32 -> 1.32, the version the e2e cluster runs).
#
# Environment:
#   HELM_VERSION     helm release (default below)
#   HELM_KUBE_MINOR  Kubernetes 1.<minor> assumed by template/lint (default 32)
#   CPUSLOT_QUIET    marker file of a quiet period (default /tmp/cpuslot-quiet):
#                    while it exists the build waits (polling every 10 s)
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.17.4}
HELM_KUBE_MAJOR=1
HELM_KUBE_MINOR=${HELM_KUBE_MINOR:-32}
QUIET=${CPUSLOT_QUIET:-/tmp/cpuslot-quiet}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="${CPUSLOT_E2E_CACHE:-$root/.cache/e2e}/tools"
bin="$tools/bin"
helm="$bin/helm"
stamp="$tools/helm.stamp"
want="helm=$HELM_VERSION kube=$HELM_KUBE_MAJOR.$HELM_KUBE_MINOR"

fresh() { [[ -x "$helm" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; }

if fresh; then
	echo "$helm"
	exit 0
fi

mkdir -p "$bin"
# One builder at a time; the others wait and then find the binary fresh.
exec 9>"$tools/helm.lock"
flock 9
if fresh; then
	echo "$helm"
	exit 0
fi

command -v go >/dev/null || { echo "hack/helm.sh: go is not installed" >&2; exit 1; }

if [[ -e "$QUIET" ]]; then
	echo "hack/helm.sh: quiet period ($QUIET exists); waiting before building helm" >&2
	while [[ -e "$QUIET" ]]; do sleep 10; done
fi

echo "hack/helm.sh: building helm $HELM_VERSION (Kubernetes $HELM_KUBE_MAJOR.$HELM_KUBE_MINOR defaults) into $bin" >&2
ldflags="-w -s"
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$HELM_KUBE_MAJOR"
ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM_KUBE_MINOR"
ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$HELM_KUBE_MAJOR"
ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$HELM_KUBE_MINOR"

rm -f "$stamp"
# Outside the repository so its go.mod plays no part; k8s.io modules are not
# always answered by the checksum database (see the local-cluster notes).
(
	cd "$tools"
	GOBIN="$bin" GOFLAGS=-mod=mod CGO_ENABLED=0 GONOSUMDB="${GONOSUMDB:+$GONOSUMDB,}k8s.io" \
		go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
) >&2

got=$("$helm" version --template '{{.Version}}')
if [[ "$got" != "$HELM_VERSION" ]]; then
	echo "hack/helm.sh: built helm reports $got, want $HELM_VERSION" >&2
	exit 1
fi
echo "$want" >"$stamp"
echo "$helm"
