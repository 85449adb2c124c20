#!/usr/bin/env bash
# hack/knative.sh: Knative Serving for the e2e cluster, built from the Go
# module proxy and cached; prints where everything is.
#
#   - the five components (controller, webhook, activator, autoscaler,
#     queue) built with CGO_ENABLED=0 from knative.dev/serving@$version in a
#     throwaway module, packed as OCI image-layout tarballs by tools/ocitar
#     (docker.io/cpuslot/knative-<name>:<version>, user 65532 as Knative's
#     own images, which its manifests require: runAsNonRoot);
#   - nothing of Knative's is copied: the e2e tests read Knative's manifests
#     (config/core of knative.dev/serving, config/ of knative.dev/networking
#     and knative.dev/caching, whose CRDs serving's release bundles) from the
#     Go module cache at the directories printed here.
#
# Idempotent; a second run with everything built takes well under a second.
# Cache: $CPUSLOT_E2E_CACHE/knative/<version> (default <repo>/.cache/e2e).
# Last lines:
#   KNATIVE_VERSION=<version>
#   KNATIVE_SERVING_DIR=<module dir of knative.dev/serving>
#   KNATIVE_NETWORKING_DIR=<module dir of knative.dev/networking>
#   KNATIVE_CACHING_DIR=<module dir of knative.dev/caching>
#   KNATIVE_IMAGES=<dir with controller.tar webhook.tar ...>
#
# Version: the newest release whose dependencies the module proxy serves
# (v0.51.0 pins knative.dev/networking and knative.dev/pkg pseudo-versions
# the proxy refuses). Override with CPUSLOT_KNATIVE_VERSION.
set -euo pipefail

version="${CPUSLOT_KNATIVE_VERSION:-v0.50.0}"
prefix="${CPUSLOT_IMAGE_PREFIX:-docker.io/cpuslot}"
components=(controller webhook activator autoscaler queue)
quiet="${CPUSLOT_QUIET:-/tmp/cpuslot-quiet}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${CPUSLOT_E2E_CACHE:-$repo/.cache/e2e}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)/knative/$version"
mod="$cache/module"
bin="$cache/bin"
images="$cache/images"
stamp="$cache/done"

log() { echo "knative: $*" >&2; }

# Module directories in the Go module cache (download when absent).
module_dir() { # module@version -> Dir
	(cd "$mod" && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
}

export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOWORK=off

if [ ! -f "$stamp" ]; then
	mkdir -p "$mod" "$bin" "$images"
	exec 9>"$cache/lock"
	flock 9
fi
if [ ! -f "$stamp" ]; then
	while [ -e "$quiet" ]; do
		log "waiting for $quiet to go away"
		sleep 10
	done
	command -v go >/dev/null || { log "go not found"; exit 1; }
	if ! grep -q "knative.dev/serving $version" "$mod/go.mod" 2>/dev/null; then
		printf 'module cpuslot.local/e2e-knative-build\n\nrequire knative.dev/serving %s\n' "$version" >"$mod/go.mod"
		rm -f "$mod/go.sum"
	fi
	pkgs=()
	for c in "${components[@]}"; do
		pkgs+=("knative.dev/serving/cmd/$c")
	done
	log "building ${components[*]} of knative.dev/serving $version (a few minutes the first time)"
	start=$(date +%s)
	(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$bin/" "${pkgs[@]}")
	log "built in $(($(date +%s) - start)) s"

	ocitar="$cache/ocitar"
	(cd "$repo/tools" && GOFLAGS=-buildvcs=false go build -o "$ocitar" ./ocitar)
	for c in "${components[@]}"; do
		[ -x "$bin/$c" ] || { log "$bin/$c missing after the build"; exit 1; }
		"$ocitar" -o "$images/$c.tar.tmp" -name "$prefix/knative-$c:$version" \
			-user 65532:65532 -env KO_DATA_PATH=/var/run/ko \
			-entrypoint "/ko-app/$c" -add "$bin/$c:/ko-app/$c" >&2
		mv "$images/$c.tar.tmp" "$images/$c.tar"
	done
	rm -f "$ocitar"
	echo "$version" >"$stamp"
fi

serving="$(module_dir "knative.dev/serving@$version")"
networking="$(cd "$mod" && go list -m -f '{{.Dir}}' knative.dev/networking)"
caching="$(cd "$mod" && go list -m -f '{{.Dir}}' knative.dev/caching)"
[ -d "$serving/config/core" ] || { log "no config/core in $serving"; exit 1; }
[ -f "$networking/config/serverlessservice.yaml" ] || { log "no config/serverlessservice.yaml in $networking"; exit 1; }
[ -f "$caching/config/image.yaml" ] || { log "no config/image.yaml in $caching"; exit 1; }
echo "KNATIVE_VERSION=$version"
echo "KNATIVE_SERVING_DIR=$serving"
echo "KNATIVE_NETWORKING_DIR=$networking"
echo "KNATIVE_CACHING_DIR=$caching"
echo "KNATIVE_IMAGES=$images"
