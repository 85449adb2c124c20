#!/usr/bin/env bash
# Cold /init in the image itself, two images side by side: each image's layer unpacked
# once into a temporary root, then alternating cold starts of its entrypoint as a container
# starts it (runtime-image/image/chroot-image.sh: under chroot as nobody, a container's clean
# environment, an empty /tmp, /proc and the four harmless devices a container has), /init of an
# action, one /run; prints the wall time of /init, the process's CPU
# time when /init returned, and what the action answered. Root only (chroot, mount, mknod).
#   hack/bench-image-init.sh THIS.tar OTHER.tar [PAIRS] [hello|stdlib|javascript|java]
# THIS/OTHER: OCI tarballs of build-image.sh (make runtime-image writes bin/cpuslot-runtime.tar).
# hello: a Python main returning json's file (imported in main, at /run); stdlib: a Python action
# importing json, re, datetime, collections, urllib.parse, base64, hashlib and random at /init;
# javascript: hello-world in JavaScript; java: the samples' HelloWorld jar (build the samples
# first: runtime-image/build.sh -DskipTests package).
set -euo pipefail
usage="usage: bench-image-init.sh THIS.tar OTHER.tar [PAIRS] [hello|stdlib|javascript|java]"
this=$(realpath "${1:?$usage}")
other=$(realpath "${2:?$usage}")
pairs=${3:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
body=$(mktemp)
case "${4:-hello}" in
hello) lang=python action='def main(args):\n    import json\n    return {\"json\": json.__file__}\n' ;;
stdlib) lang=python action='import json, re, datetime, collections, urllib.parse, base64, hashlib, random\ndef main(args):\n    return {\"json\": json.__file__}\n' ;;
javascript) lang=javascript action='function main(args) { return { hello: \"world\" }; }\n' ;;
java) lang=java ;;
*) echo "bench-image-init: hello, stdlib, javascript or java" >&2; exit 1 ;;
esac
if [ "$lang" = java ]; then
	jar="$here/runtime-image/samples/target/samples-0.1.0-SNAPSHOT.jar"
	[ -f "$jar" ] || { echo "bench-image-init: no $jar (runtime-image/build.sh -DskipTests package)" >&2; exit 1; }
	printf '{"value":{"name":"hello","main":"dev.cpuslot.samples.HelloWorld","binary":true,"code":"%s"}}' "$(base64 -w0 "$jar")" >"$body"
else
	printf '{"value":{"name":"hello","main":"main","code":"%s"}}' "$action" >"$body"
fi
# shellcheck source=../runtime-image/image/chroot-image.sh
. "$here/runtime-image/image/chroot-image.sh"
work=$(mktemp -d)
entered=()
cleanup() { for r in "${entered[@]}"; do chroot_leave "$r" 2>/dev/null || true; done; rm -rf "$work"; }
trap 'cleanup; rm -f "$body"' EXIT

unpack() { # TAR DIR: the image's layer as a root file system; prints its entrypoint, one word a line
	local tar=$1 dir=$2 f
	mkdir -p "$dir/layout" "$dir/rootfs"
	tar -xf "$tar" -C "$dir/layout"
	for f in "$dir"/layout/blobs/sha256/*; do
		if [ "$(stat -c %s "$f")" -gt 1048576 ]; then tar -xf "$f" -C "$dir/rootfs"; fi
	done
	for f in "$dir"/layout/blobs/sha256/*; do
		if [ "$(stat -c %s "$f")" -lt 65536 ]; then python3 -c 'import json,sys
try: print("\n".join(json.load(open(sys.argv[1]))["config"]["Entrypoint"]))
except Exception: pass' "$f"; fi
	done >"$dir/entrypoint"
}

one() { # DIR LABEL
	local dir=$1 rf=$1/rootfs log pid jpid port t1 t2 st code
	mapfile -t ep <"$dir/entrypoint"
	chroot_enter "$rf"; entered+=("$rf")
	log=$(mktemp)
	chroot_run "$rf" PORT=0 CPUSLOT_METRICS_PORT=-1 CPUSLOT_LANGUAGE=$lang CPUSLOT_LOG=stderr -- "${ep[@]}" >"$log" 2>&1 &
	pid=$!
	until port=$(grep -o 'listening on :[0-9]*' "$log" | grep -o '[0-9]*$'); do
		kill -0 $pid 2>/dev/null || { echo "bench-image-init: the runtime exited:" >&2; cat "$log" >&2; exit 1; }
		sleep 0.05
	done
	t1=$(date +%s%N)
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 600 -X POST "localhost:$port/init" --data-binary @"$body")
	t2=$(date +%s%N)
	jpid=$(pgrep -P $pid || echo $pid) # chroot execs the JVM: the same process
	read -r -a st </proc/$jpid/stat
	[ "$code" = 200 ] || { echo "bench-image-init: /init answered $code:" >&2; cat "$log" >&2; exit 1; }
	printf '%-6s /init %6.1f s  process CPU at /init %5.1f s  load %s  /run %s  /tmp: %s\n' "$2" \
		"$(echo "($t2 - $t1) / 10^9" | bc -l)" "$(echo "(${st[13]} + ${st[14]}) / $(getconf CLK_TCK)" | bc -l)" \
		"$(cut -d' ' -f1 /proc/loadavg)" "$(curl -s --max-time 600 -X POST "localhost:$port/run" -d '{"value":{"name":"image"}}')" \
		"$(ls -A "$rf/tmp" | tr '\n' ' ')"
	kill $pid; wait $pid 2>/dev/null || true
	chroot_leave "$rf"; unset 'entered[-1]'
	rm -f "$log"
}

unpack "$this" "$work/this"
unpack "$other" "$work/other"
for _ in $(seq "$pairs"); do one "$work/this" this; one "$work/other" other; done
