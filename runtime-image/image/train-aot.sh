#!/usr/bin/env bash
# Writes the image's ahead-of-time cache (JDK 25, JEP 483/515): the runtime's classes loaded and
# linked, and their method profiles, from a training run of the image's own entrypoint. A cold
# JVM then maps them instead of loading, verifying and profiling some 20,000 classes again (GraalPy,
# GraalJS, Truffle and Graal): a cold Python /init takes about half the time
# (docs/benchmarks.md, "Cold start with the AOT cache").
#
#   runtime-image/image/train-aot.sh ROOT OUT -- ENTRYPOINT...
#
# ROOT: the image's staged root file system; ENTRYPOINT: its java command, exactly as the image
# runs it (the cache is refused by a JVM started with other module options or other jars). Runs
# the entrypoint as a container would (chroot-image.sh: under chroot as nobody, a container's clean
# environment), a Python action through OpenWhisk's /init and /run, and a JavaScript and a Python
# function through Hydra's /register, then stops it; the JVM writes the cache as it exits. OUT is
# written only when all of that succeeded. Root only (chroot, mount); leaves ROOT as it found it.
set -euo pipefail
root=$(realpath "${1:?usage: train-aot.sh ROOT OUT -- ENTRYPOINT...}")
out=${2:?usage: train-aot.sh ROOT OUT -- ENTRYPOINT...}
shift 2
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || { echo "train-aot: no entrypoint" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "train-aot: needs root (chroot, mount)" >&2; exit 1; }

# shellcheck source=chroot-image.sh
. "$(dirname "$0")/chroot-image.sh"
cleanup() {
	[ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null || true
	chroot_leave "$root"
}
trap cleanup EXIT
chroot_enter "$root"

log=$(mktemp)
cache=/tmp/cpuslot-runtime.aot
# -XX:AOTCacheOutput goes before -jar with the other JVM options
args=()
for a in "$@"; do [ "$a" = -jar ] && args+=("-XX:AOTCacheOutput=$cache"); args+=("$a"); done
chroot_run "$root" PORT=0 CPUSLOT_METRICS_PORT=-1 CPUSLOT_LANGUAGE=python CPUSLOT_LOG=stderr -- "${args[@]}" >"$log" 2>&1 &
pid=$!
fail() { echo "train-aot: $1; the runtime's log:" >&2; cat "$log" >&2; exit 1; }
until port=$(grep -o 'listening on :[0-9]*' "$log" | grep -o '[0-9]*$'); do
	kill -0 $pid 2>/dev/null || fail "the runtime exited"
	sleep 0.1
done
post() { # PATH BODY: must answer 200
	local code
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 600 -X POST "localhost:$port$1" --data-binary "$2") || fail "POST $1: curl failed"
	[ "$code" = 200 ] || fail "POST $1 answered $code"
}
post /init '{"value":{"name":"hello","main":"main","code":"def main(args):\n    return {\"hello\": args.get(\"name\", \"world\")}\n"}}'
for _ in 1 2 3; do post /run '{"value":{"name":"aot"}}'; done
post '/register?name=js&language=javascript&entryPoint=main' 'function main(args) { return { hello: args.name || "world" }; }'
post '/register?name=py&language=python&entryPoint=main' 'def main(args):
    return {"hello": args.get("name", "world")}
'
for f in js py; do for _ in 1 2 3; do post / "{\"name\":\"$f\",\"arguments\":\"{\\\"name\\\":\\\"aot\\\"}\"}"; done; done

kill -TERM $pid
wait $pid || true # the JVM exits on SIGTERM and writes the cache first
pid=
grep -q "AOTCache creation is complete" "$log" && [ -s "$root$cache" ] || fail "no AOT cache written"
mv "$root$cache" "$out"
chown 0:0 "$out"
chmod 0444 "$out"
echo "train-aot: $out ($(du -h "$out" | cut -f1))" >&2
