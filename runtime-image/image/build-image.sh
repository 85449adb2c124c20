#!/usr/bin/env bash
# Builds the runtime's JVM image as an OCI image-layout tarball, without a Docker engine or a
# registry (for `ctr -n k8s.io images import`):
#
#   runtime-image/image/build-image.sh OUT.tar [IMAGE_NAME] [KIND]
#   runtime-image/image/build-image.sh --stage ROOT [KIND]
#       (default docker.io/cpuslot/runtime-jvm:dev; KIND java, javascript or python fixes the
#        language of /init code with CPUSLOT_LANGUAGE, as OpenWhisk maps each kind to an image:
#        e.g. docker.io/cpuslot/runtime-python:dev python. Without KIND: the generic image, whose
#        language comes from the action's /init env CPUSLOT_LANGUAGE, or is guessed.)
#
# The image has no base image. Its one layer holds:
#   /opt/java            a minimal JRE made with jlink from the JDK 25 (modules from jdeps)
#   /opt/cpuslot/        runtime.jar and lib/ (the runtime module's jar and dependencies; for
#                        KIND java only those Java functions need: no JavaScript or Python engine,
#                        a third of the size, and a smaller JRE), and compiler/ (Graal, the JIT of
#                        JavaScript and Python code; not for KIND java, whose functions HotSpot's
#                        own JIT compiles), and polyglot/ (GraalPy's standard library with its
#                        .pyc and Truffle's native helper, unpacked, read-only; not for KIND java),
#                        and runtime.aot (the JVM's AOT cache from a training run, train-aot.sh;
#                        not for KIND java; only when built as root)
#   /lib*, /usr/lib*     the shared libraries the JRE's binaries link (found with ldd, copied
#                        from this machine: glibc, libz...) and the dynamic loader
#   /etc/passwd, /tmp    root and nobody; a world-writable /tmp (user.home)
# Entrypoint: java [image/jvm-options] [image/jvm-options-jit unless KIND java, Graal on the module
# path] [-XX:AOTCache] -jar /opt/cpuslot/runtime.jar, as user 65534 (the slot fds the agent passes
# need no privilege), port 8080, metrics 9102.
# The tarball is an OCI index with one manifest, for this machine's architecture (the JRE is
# jlinked from its JDK and the libraries are its own: no other architecture can be built here),
# a gzip layer, annotated with the source, revision and version, dated by SOURCE_DATE_EPOCH (the
# last commit's time by default). NAME@DIGEST is the one line printed on stdout.
# --stage: no tarball; the image's root file system left in ROOT (replaced) and its entrypoint in
# ROOT.entrypoint, one argument a line (the conformance suite runs it under chroot-image.sh).
# Needs: the runtime built (runtime-image/build.sh -DskipTests package), a JDK 25, Go (to build
# tools/ocitar from this repository), ldd.
set -euo pipefail
# stdout carries NAME@DIGEST only; every tool's output goes to stderr
exec 3>&1 1>&2

usage="usage: build-image.sh OUT.tar [IMAGE_NAME] [KIND], or --stage ROOT [KIND]"
staged=
if [ "${1:-}" = --stage ]; then
	staged="${2:?$usage}"
	out=
	kind="${3:-}"
else
	out="${1:?$usage}"
	name="${2:-docker.io/cpuslot/runtime-jvm:dev}"
	kind="${3:-}"
fi
case "$kind" in ""|java|javascript|python) ;; *) echo "build-image: KIND must be java, javascript or python" >&2; exit 1 ;; esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="$repo/runtime-image/runtime/target"
jar="$target/runtime-0.1.0-SNAPSHOT.jar"
lib="$target/lib"
[ "$kind" = java ] && lib="$target/lib-java"
# guest code (JavaScript, Python) is compiled by Graal through JVMCI; without it Truffle interprets only
jit=1
[ "$kind" = java ] && jit=0
[ -f "$jar" ] && [ -d "$lib" ] && { [ $jit = 0 ] || [ -f "$target/compiler/compiler.jar" ]; } || { echo "build-image: build the runtime first (make build-runtime)" >&2; exit 1; }

java_major() { "$1/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if [ -z "${JAVA_HOME:-}" ] || [ ! -x "$JAVA_HOME/bin/jlink" ] || [ "$(java_major "$JAVA_HOME")" -lt 25 ]; then
	for d in /usr/lib/jvm/*; do
		if [ -x "$d/bin/jlink" ] && [ "$(java_major "$d")" -ge 25 ] 2>/dev/null; then JAVA_HOME="$d"; break; fi
	done
fi
[ -x "${JAVA_HOME:-}/bin/jlink" ] || { echo "build-image: need a JDK 25 with jlink (JAVA_HOME)" >&2; exit 1; }
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
if [ -n "$staged" ]; then
	rm -rf "$staged" "$staged.entrypoint"
	mkdir -p "$staged"
	root="$(cd "$staged" && pwd)"
fi
# The root is what takes minutes (jlink, the polyglot cache, the AOT training): one built from the
# same inputs is reused (the conformance suite stages it, the image tests and make images pack it
# again in one CI run). The key is every input: the jars, these scripts, the JDK, the kind, root or not.
cache="$target/image-cache/${kind:-generic}"
key="$({ echo "kind=$kind uid=$(id -u) arch=$(uname -m) java=$JAVA_HOME"; cat "$JAVA_HOME/release"
	cd "$target" && sha256sum "$(basename "$jar")" "$(basename "$lib")"/*.jar
	[ $jit = 0 ] || sha256sum compiler/*.jar
	cd "$here" && sha256sum ./*; } | sha256sum | cut -d' ' -f1)"

build_root() {
	mkdir -p "$root/opt/cpuslot/lib" "$root/etc" "$root/tmp"

	# 1. the JRE: the modules jdeps finds in the runtime and its dependencies, plus a few loaded
	#    reflectively (zip file system for polyglot resources, naming, EC crypto for https)
	cp "$jar" "$root/opt/cpuslot/runtime.jar"
	cp "$lib"/*.jar "$root/opt/cpuslot/lib/"
	if [ $jit = 1 ]; then
		mkdir -p "$root/opt/cpuslot/compiler"
		cp "$target"/compiler/*.jar "$root/opt/cpuslot/compiler/"
		# GraalVM's language files unpacked and GraalPy's standard library compiled to .pyc
		# (dev.cpuslot.runtime.lang.PolyglotCache), read-only: no copy into /tmp at each pod's start, none
		# the runtime's user can write. Made with the image's JIT options (the same resources unpack).
		mapfile -t jitopts < <(grep -v '^ *$' "$here/jvm-options-jit" | sed "s#/opt/cpuslot/#$root/opt/cpuslot/#")
		"$JAVA_HOME/bin/java" -Duser.home="$stage" --sun-misc-unsafe-memory-access=allow --enable-native-access=ALL-UNNAMED \
			"${jitopts[@]}" -cp "$jar:$lib/*" dev.cpuslot.runtime.lang.PolyglotCache "$root/opt/cpuslot/polyglot" /opt/cpuslot/polyglot >&2
		chmod -R u=rwX,go=rX "$root/opt/cpuslot/polyglot"
	fi
	cp_list="$(ls "$root"/opt/cpuslot/lib/*.jar | tr '\n' ':')"
	mods="$("$JAVA_HOME/bin/jdeps" --multi-release 25 --ignore-missing-deps --print-module-deps \
		--class-path "$cp_list" "$root/opt/cpuslot/runtime.jar" "$root"/opt/cpuslot/lib/*.jar 2>/dev/null | tail -1)"
	mods="$mods,java.logging,java.management,java.naming,jdk.zipfs,jdk.crypto.ec,jdk.localedata"
	# what the compiler's modules require (they come from compiler/ on the module path). Never the
	# JDK's own jdk.graal.compiler: Temurin's is an empty placeholder, and a system module of that name
	# would hide Graal's on the module path (hence --upgrade-module-path on a JDK, which turns off
	# class-data sharing and the AOT cache below).
	mods="$(echo "$mods" | tr ',' '\n' | grep -vx 'jdk.graal.compiler\(.management\)\?' | paste -sd, -)"
	[ $jit = 1 ] && mods="$mods,jdk.internal.vm.ci,jdk.management,jdk.unsupported"
	echo "build-image: jlink --add-modules $mods" >&2
	# Compressed modules (zip-6) and a class-data-sharing archive: the image is a quarter smaller
	# (pulled and unpacked on every node) and the JVM starts faster (a JVM per pod: cold starts).
	# Measured side by side: docs/benchmarks.md, "Runtime start-up". classes_nocoops.jsa serves heaps over 32 GB only.
	"$JAVA_HOME/bin/jlink" --add-modules "$mods" --strip-debug --no-header-files --no-man-pages \
		--compress=zip-6 --generate-cds-archive --output "$root/opt/java"
	rm -f "$root/opt/java/lib/server/classes_nocoops.jsa"

	# 2. the shared libraries the JRE links, at the paths the loader looks them up
	#    (not for the X11/sound parts of java.desktop: the runtime is headless; libraries inside the
	#    JRE itself are found through its own RPATH)
	libs="$(find "$root/opt/java" -type f \( -name '*.so' -o -path '*/bin/*' -o -name jspawnhelper \) \
		! -name 'libawt_xawt.so' ! -name 'libjawt.so' ! -name 'libsplashscreen.so' ! -name 'libjsound.so' -exec ldd {} \; 2>/dev/null |
		awk '/=> \// {print $3} /^\t\/[^ ]+ \(0x/ {print $1}' | grep -v "^$root/" | sort -u)"
	for l in $libs; do
		mkdir -p "$root$(dirname "$l")"
		cp -L "$l" "$root$l"
	done

	# 3. users and a writable /tmp
	printf 'root:x:0:0:root:/tmp:/sbin/nologin\nnobody:x:65534:65534:nobody:/tmp:/sbin/nologin\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
	chmod 1777 "$root/tmp"

	# 4. the entrypoint's JVM and options (-jar follows): those the conformance tests start the
	#    runtime with, but Graal on the module path: this JRE has no placeholder jdk.graal.compiler
	#    to upgrade (step 1), and --upgrade-module-path would turn class-data sharing off
	java_cmd=(/opt/java/bin/java)
	opts=("$here/jvm-options")
	[ $jit = 1 ] && opts+=("$here/jvm-options-jit")
	while read -r opt; do
		case "$opt" in
		"") ;;
		--upgrade-module-path=*) java_cmd+=("--module-path=${opt#--upgrade-module-path=}" --add-modules=jdk.graal.compiler,org.graalvm.truffle.compiler) ;;
		*) java_cmd+=("$opt") ;;
		esac
	done < <(cat "${opts[@]}")

	# 5. the AOT cache (train-aot.sh): the classes a cold start loads, from a training run of that
	#    entrypoint. Every file gets the layer's time first: the JVM refuses a cache whose jars changed.
	find "$root" -exec touch -h -d @0 {} +
	if [ $jit = 1 ]; then
		if [ "$(id -u)" = 0 ]; then
			"$here/train-aot.sh" "$root" "$root/opt/cpuslot/runtime.aot" -- "${java_cmd[@]}" -jar /opt/cpuslot/runtime.jar
			touch -h -d @0 "$root/opt/cpuslot/runtime.aot"
			# -Xms64m: the cache's archived heap objects must fit the initial heap, or the JVM refuses
			# to start ("unrecoverable error"); Serial GC in a 1-CPU 512 Mi pod would start with 8 MB
			java_cmd+=(-Xms64m -XX:AOTCache=/opt/cpuslot/runtime.aot)
		else
			echo "build-image: not root: no AOT cache (cold starts take about twice as long)" >&2
		fi
	fi
}

mkdir -p "$target/image-cache"
exec 9>"$cache.lock"
flock 9 # one build of a kind at a time: none takes a root another is replacing
if [ -f "$cache/key" ] && [ "$(cat "$cache/key")" = "$key" ]; then
	cp -a "$cache/root/." "$root/"
	mapfile -t java_cmd <"$cache/java_cmd"
	libs="$(cat "$cache/libs")"
	echo "build-image: the root built from these inputs before, reused ($cache)" >&2
else
	build_root
	rm -rf "$cache"
	mkdir -p "$cache"
	cp -a "$root" "$cache/root"
	printf '%s\n' "${java_cmd[@]}" >"$cache/java_cmd"
	echo "$libs" >"$cache/libs"
	echo "$key" >"$cache/key" # last: a cache cut short is never taken
fi
exec 9>&-

if [ -n "$staged" ]; then
	printf '%s\n' "${java_cmd[@]}" -jar /opt/cpuslot/runtime.jar >"$root.entrypoint"
	echo "build-image: staged in $root, entrypoint in $root.entrypoint" >&2
	exit 0
fi

# 6. the OCI layout tarball (tools/ocitar of this repository)
(cd "$repo/tools" && CGO_ENABLED=0 "$GO" build -o "$stage/ocitar" ./ocitar)
adds=()
for top in "$root"/*; do adds+=(-add "$top:/$(basename "$top")"); done
entry=()
for a in "${java_cmd[@]}" -jar /opt/cpuslot/runtime.jar; do entry+=(-entrypoint "$a"); done
kindenv=()
[ -n "$kind" ] && kindenv=(-env "CPUSLOT_LANGUAGE=$kind")
version="$(git -C "$repo" describe --always --dirty 2>/dev/null || echo dev)"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}"
mkdir -p "$(dirname "$out")"
ref="$("$stage/ocitar" -o "$out" -name "$name" -user 65534:65534 -workdir /tmp \
	-arch "$("$GO" env GOHOSTARCH)" \
	-annotation "org.opencontainers.image.source=${IMAGE_SOURCE:-https://github.com/cpuslot/cpuslot}" \
	-annotation "org.opencontainers.image.revision=$revision" -annotation "org.opencontainers.image.version=$version" \
	-env JAVA_HOME=/opt/java -env PORT=8080 -env CPUSLOT_METRICS_PORT=9102 "${kindenv[@]}" \
	"${entry[@]}" \
	"${adds[@]}")"
echo "build-image: $out ($ref, $(du -h "$out" | cut -f1), $(echo "$libs" | wc -w) shared libraries from this machine)" >&2
echo "$ref" >&3
