#!/usr/bin/env bash
# Builds the real OpenWhisk pieces the project is checked against, from
# upstream checkouts given by the caller (OpenWhisk's source is not part of
# this repository), with dependencies from the Go module proxy and Maven
# Central only. Cached per machine, keyed by the checkouts' commits and this
# recipe's own files.
#
#   OPENWHISK_CLI_SRC=<apache/openwhisk-cli> OPENWHISK_WSKDEPLOY_SRC=<apache/openwhisk-wskdeploy> \
#     hack/openwhisk-build.sh wsk            # prints the path of wsk
#   OPENWHISK_SRC=<apache/openwhisk> hack/openwhisk-build.sh standalone
#                                            # prints the path of a start script
#
# See deploy/openwhisk/README.md ("The real OpenWhisk").
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${OPENWHISK_BUILD_CACHE:-/var/cache/cpuslot/openwhisk}
BUILD_FILES="$ROOT/deploy/openwhisk/build"

log() { echo "openwhisk-build: $*" >&2; }
die() { log "$*"; exit 1; }

commit() { git -C "$1" rev-parse HEAD 2>/dev/null || die "$1 is not a git checkout"; }

# A hash of the standalone's build files, so that a changed pom or patch rebuilds.
recipe_hash() { cat "$BUILD_FILES"/* | sha256sum | cut -c1-12; }

build_wsk() {
	: "${OPENWHISK_CLI_SRC:?set OPENWHISK_CLI_SRC to a checkout of apache/openwhisk-cli}"
	: "${OPENWHISK_WSKDEPLOY_SRC:?set OPENWHISK_WSKDEPLOY_SRC to a checkout of apache/openwhisk-wskdeploy}"
	local cli wd out work
	cli=$(commit "$OPENWHISK_CLI_SRC")
	wd=$(commit "$OPENWHISK_WSKDEPLOY_SRC")
	out="$CACHE/wsk/${cli:0:12}-${wd:0:12}"
	if [ -x "$out/wsk" ]; then echo "$out/wsk"; return; fi
	work="$out.work"
	rm -rf "$work" && mkdir -p "$work"
	git -C "$OPENWHISK_CLI_SRC" archive HEAD | tar -x -C "$work"
	mkdir -p "$work/.wskdeploy"
	git -C "$OPENWHISK_WSKDEPLOY_SRC" archive HEAD | tar -x -C "$work/.wskdeploy"
	(
		cd "$work"
		# The module proxy refuses openwhisk-wskdeploy at the pinned
		# pseudo-version: take it from its checkout.
		go mod edit -replace "github.com/apache/openwhisk-wskdeploy=./.wskdeploy"
		# i18n resources are generated, with go-bindata at the version the
		# CLI's module pins (an unpinned `go install` needs @v/list, which
		# the proxy refuses), before `go mod tidy` drops that requirement.
		go build -mod=mod -o .bin/go-bindata github.com/jteeuwen/go-bindata/go-bindata
		.bin/go-bindata -pkg wski18n -o wski18n/i18n_resources.go wski18n/resources
		go mod tidy
		CGO_ENABLED=0 go build -o wsk .
	) >&2
	mkdir -p "$out"
	mv "$work/wsk" "$out/wsk"
	rm -rf "$work"
	echo "$out/wsk"
}

# resource_jar NAME DIR...: each module's application.conf and reference.conf
# must stay a separate classpath entry (Typesafe Config merges them all).
resource_jar() {
	local name=$1
	shift
	local tmp
	tmp=$(mktemp -d)
	for d in "$@"; do cp -r "$d"/. "$tmp"/; done
	(cd "$tmp" && jar cf "$OUT/lib/ow-$name-resources.jar" .)
	rm -rf "$tmp"
}

build_standalone() {
	: "${OPENWHISK_SRC:?set OPENWHISK_SRC to a checkout of apache/openwhisk}"
	local ow work s
	ow=$(commit "$OPENWHISK_SRC")
	# the compile is keyed by the build files, the assembly also by this script
	work="$CACHE/standalone/${ow:0:12}-$(recipe_hash).work"
	OUT="$CACHE/standalone/${ow:0:12}-$(recipe_hash)-$(sha256sum "$0" | cut -c1-8)"
	if [ -x "$OUT/bin/openwhisk-standalone" ]; then echo "$OUT/bin/openwhisk-standalone"; return; fi
	s="$work/src"
	mkdir -p "$s"
	if [ ! -e "$work/patched" ]; then
		rm -rf "$s" && mkdir -p "$s"
		git -C "$OPENWHISK_SRC" archive HEAD common core tools/admin ansible/files | tar -x -C "$s"
		"$BUILD_FILES/patch-source.sh" "$s"
		touch "$work/patched"
	fi
	if [ ! -e "$work/target/openwhisk-standalone-0.jar" ]; then
		cp "$BUILD_FILES/pom.xml" "$work/pom.xml"
		log "compiling OpenWhisk standalone (about 15 min on 2 quiet cores; log: $work/mvn.log)"
		(cd "$work" && nice mvn -B -Dow.src="$s" package >"$work/mvn.log" 2>&1) ||
			{ tail -50 "$work/mvn.log" >&2; die "maven failed, log: $work/mvn.log"; }
	fi
	rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp/lib" "$OUT.tmp/bin"
	local final=$OUT
	OUT="$OUT.tmp"
	cp "$work"/target/lib/*.jar "$work"/target/openwhisk-standalone-0.jar "$OUT/lib/"
	# The Kubernetes client (fabric8 4.10) reads an EC client key of a
	# kubeconfig (kubeadm's, kind's, the e2e cluster's) only with BouncyCastle
	# on the classpath, an optional dependency upstream's build leaves out (its
	# invoker runs with a service account token). Run time only: added here,
	# not in build/pom.xml, so the compile stays cached.
	for a in bcprov-jdk15on bcutil-jdk15on bcpkix-jdk15on; do
		mvn -B -q dependency:copy -Dartifact="org.bouncycastle:$a:1.70" -DoutputDirectory="$OUT/lib" >&2
	done
	resource_jar common "$s/common/scala/src/main/resources"
	# The scheduler's configuration binds its messages to the Kryo serializer,
	# which is not served (standalone sends them to no other node).
	mkdir -p "$work/scheduler-res"
	cp -r "$s/core/scheduler/src/main/resources"/. "$work/scheduler-res"/
	sed -i '/^    serializers {/,/^  }$/{/^  }$/!d}; /^pekko-kryo-serialization/d' "$work/scheduler-res/application.conf"
	resource_jar scheduler "$work/scheduler-res"
	resource_jar invoker "$s/core/invoker/src/main/resources"
	resource_jar controller "$s/core/controller/src/main/resources"
	resource_jar admin "$s/tools/admin/src/main/resources"
	# standalone's own resources plus the default runtime manifest it loads
	# as a resource (runtimes.json); swagger-ui, the API gateway actions and
	# the Grafana dashboards are left out (they are fetched or built with npm).
	mkdir -p "$work/standalone-res"
	cp -r "$s/core/standalone/src/main/resources"/. "$work/standalone-res"/
	cp "$s/ansible/files/runtimes.json" "$work/standalone-res/"
	resource_jar standalone "$work/standalone-res"
	cat >"$OUT/bin/openwhisk-standalone" <<-'EOS'
		#!/bin/sh
		# OpenWhisk standalone built by hack/openwhisk-build.sh; arguments as
		# upstream's `java -jar openwhisk-standalone.jar`.
		here=$(cd "$(dirname "$0")/.." && pwd)
		exec java ${JAVA_OPTS:-} -cp "$here/lib/*" org.apache.openwhisk.standalone.StandaloneOpenWhisk "$@"
	EOS
	chmod +x "$OUT/bin/openwhisk-standalone"
	rm -rf "$final" && mv "$OUT" "$final"
	echo "$final/bin/openwhisk-standalone"
}

case "${1:-}" in
wsk) build_wsk ;;
standalone) build_standalone ;;
*) die "usage: $0 wsk|standalone" ;;
esac
