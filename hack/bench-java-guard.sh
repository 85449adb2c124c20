#!/usr/bin/env bash
# The cost of the Java guard: two runtime JVMs started with the image's options and no
# agent (CPUSLOT_ENABLED=false), one from BASELINE_JAR (e.g. a build of main) and one from this
# tree, each given the samples' HelloWorld by OpenWhisk /init. Prints /init and first /run wall
# time (curl), then warm hello latency and throughput side by side (runtime-image/bench).
#   hack/bench-java-guard.sh BASELINE_JAR   (build first: cd runtime-image && ./build.sh -DskipTests package)
# Environment: BENCH_THREADS (1), BENCH_REQUESTS (2000), BENCH_ROUNDS (4), BENCH_WARMUP (3000).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base_jar="${1:?usage: $0 BASELINE_JAR}"
jar="$root/runtime-image/runtime/target/runtime-0.1.0-SNAPSHOT.jar"
samples="$root/runtime-image/samples/target/samples-0.1.0-SNAPSHOT.jar"
bench="$root/runtime-image/bench/target/bench-0.1.0-SNAPSHOT.jar"
java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
mapfile -t opts < <(grep -v '^\s*$' "$root/runtime-image/image/jvm-options")
work="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT

start() { # start NAME JAR PORT
	mkdir -p "$work/$1/tmp"
	PORT=$3 CPUSLOT_METRICS_PORT=-1 CPUSLOT_ENABLED=false CPUSLOT_LOG="file:$work/$1/runtime.log" \
		"$java" "${opts[@]}" -Djava.io.tmpdir="$work/$1/tmp" -jar "$2" >"$work/$1/out" 2>&1 &
	pids+=($!)
	for _ in $(seq 600); do curl -fsS "http://127.0.0.1:$3/" >/dev/null 2>&1 && return; sleep 0.1; done
	echo "$1 did not start: $(cat "$work/$1/out")" >&2; exit 1
}

first() { # first NAME PORT: /init then the first /run, wall ms each
	printf '{"value":{"name":"hello","main":"dev.cpuslot.samples.HelloWorld","binary":true,"code":"' >"$work/init.json"
	base64 -w0 "$samples" >>"$work/init.json"
	printf '"}}' >>"$work/init.json"
	local i r
	i=$(curl -fsS -o /dev/null -w '%{time_total}' -X POST "http://127.0.0.1:$2/init" --data-binary "@$work/init.json")
	r=$(curl -fsS -o /dev/null -w '%{time_total}' -X POST "http://127.0.0.1:$2/run" -d '{"value":{"name":"bench"}}')
	echo "$1: /init $(awk "BEGIN{print $i*1000}") ms, first /run $(awk "BEGIN{print $r*1000}") ms"
}

start guard "$jar" 18190
start baseline "$base_jar" 18191
first guard 18190
first baseline 18191
"$java" -jar "$bench" --threads "${BENCH_THREADS:-1}" --requests "${BENCH_REQUESTS:-2000}" \
	--rounds "${BENCH_ROUNDS:-4}" --warmup "${BENCH_WARMUP:-3000}" \
	--target "guard" http://127.0.0.1:18190/run '{"value":{"name":"bench"}}' \
	--target "baseline" http://127.0.0.1:18191/run '{"value":{"name":"bench"}}'
