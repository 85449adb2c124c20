#!/usr/bin/env bash
# Guest code through the runtime against node and python3, side by side in one run: function-shaped
# workloads (fib, a JSON round trip, a regex extraction, group and sort, in JavaScript also with
# localeCompare, string building and number formatting, dict/object aggregation, hello), warm and
# first call, each answer checked against the baseline's (main called in process, and main served over
# HTTP as an action container serves it, unless --no-http), with the runtime started as its
# image starts it; rounds alternate between every runtime under test and the baseline, so that they
# share the machine's load; then memory per registered function (Java, JavaScript, Python) and a new
# function's first call, against one node, python3 or JVM process per function. Needs node and python3
# on PATH. Arguments go to GuestBench, e.g.
#   make bench-guest BENCH_GUEST_ARGS="--workloads memory --functions 40"
#   make bench-guest BENCH_GUEST_ARGS="--warm-seconds 10 --workloads json,sort --languages python"
#   make bench-guest BENCH_GUEST_ARGS="--before-jar OLD/runtime-0.1.0-SNAPSHOT.jar --interpreted"
set -euo pipefail
cd "$(dirname "$0")/../runtime-image"
java_major() { "$1/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if [ -z "${JAVA_HOME:-}" ] || [ "$(java_major "$JAVA_HOME" 2>/dev/null || echo 0)" -lt 25 ]; then
	for d in /usr/lib/jvm/*; do
		if [ -x "$d/bin/java" ] && [ "$(java_major "$d")" -ge 25 ] 2>/dev/null; then export JAVA_HOME="$d"; break; fi
	done
fi
for t in node python3; do command -v "$t" >/dev/null || { echo "bench-guest: needs $t (the baseline)" >&2; exit 1; }; done
./build.sh -q -DskipTests package -pl runtime,bench -am
exec "$JAVA_HOME/bin/java" -cp bench/target/bench-0.1.0-SNAPSHOT.jar dev.cpuslot.bench.GuestBench \
	--runtime-jar runtime/target/runtime-0.1.0-SNAPSHOT.jar --image-dir image "$@"
