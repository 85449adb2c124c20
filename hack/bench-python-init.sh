#!/usr/bin/env bash
# Cold Python /init, this tree's runtime against another build's, alternating pairs:
# each runtime started as its image starts it (image/jvm-options + jvm-options-jit, python kind,
# a container's clean environment and an empty user.home, as a pod's /tmp), /init of a
# hello-world action; prints the wall time of /init and the process's CPU time when /init
# returned (steadier than wall time on a loaded machine).
#   hack/bench-python-init.sh OLD_TARGET_DIR [PAIRS]
# OLD_TARGET_DIR: another build's runtime/target (the jar, lib/, compiler/, polyglot/ if it has
# one). Build this tree first (runtime-image/build.sh -DskipTests package); its polyglot/ (the
# image's /opt/cpuslot/polyglot) is made here once if missing.
set -euo pipefail
old=$(cd "${1:?usage: bench-python-init.sh OLD_TARGET_DIR [PAIRS]}" && pwd); pairs=${2:-2}
cd "$(dirname "$0")/../runtime-image"
new=$PWD/runtime/target
java_major() { "$1/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if [ -z "${JAVA_HOME:-}" ] || [ "$(java_major "$JAVA_HOME" 2>/dev/null || echo 0)" -lt 25 ]; then
	for d in /usr/lib/jvm/*; do
		if [ -x "$d/bin/java" ] && [ "$(java_major "$d")" -ge 25 ] 2>/dev/null; then export JAVA_HOME="$d"; break; fi
	done
fi
tck=$(getconf CLK_TCK)
jitopts() { cat image/jvm-options image/jvm-options-jit | grep -v '^ *$' | sed "s#/opt/cpuslot/#$1/#"; }
if [ -z "$(find "$new/polyglot" -name '*.pyc' -print -quit 2>/dev/null)" ]; then
	mapfile -t opts < <(jitopts "$new")
	rm -rf "$new/polyglot.tmp"
	"$JAVA_HOME/bin/java" "${opts[@]}" -cp "$new/runtime-0.1.0-SNAPSHOT.jar:$new/lib/*" dev.cpuslot.runtime.lang.PolyglotCache "$new/polyglot.tmp"
	rm -rf "$new/polyglot"; mv "$new/polyglot.tmp" "$new/polyglot"
fi
one() { # TARGET_DIR LABEL
	local dir=$1 log home pid port t0 t1 t2 code
	mapfile -t opts < <(jitopts "$dir")
	log=$(mktemp); home=$(mktemp -d)
	env -i PATH=/usr/bin:/bin PORT=0 CPUSLOT_METRICS_PORT=-1 CPUSLOT_LANGUAGE=python CPUSLOT_LOG=stderr \
		"$JAVA_HOME/bin/java" "${opts[@]}" -Duser.home="$home" -jar "$dir/runtime-0.1.0-SNAPSHOT.jar" >"$log" 2>&1 &
	pid=$!
	t0=$(date +%s%N)
	until port=$(grep -o 'listening on :[0-9]*' "$log" | grep -o '[0-9]*$'); do
		kill -0 $pid 2>/dev/null || { echo "bench-python-init: the runtime exited:" >&2; cat "$log" >&2; exit 1; }
		sleep 0.05
	done
	t1=$(date +%s%N)
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 600 -X POST "localhost:$port/init" \
		-d '{"value":{"name":"hello","main":"main","code":"def main(args):\n    return {\"hello\": \"world\"}\n"}}')
	t2=$(date +%s%N)
	read -r -a st </proc/$pid/stat
	[ "$code" = 200 ] || { echo "bench-python-init: /init answered $code:" >&2; cat "$log" >&2; kill $pid; exit 1; }
	printf '%-6s start %6.1f s  /init %6.1f s  process CPU at /init %5.1f s  load %s\n' "$2" \
		"$(echo "($t1 - $t0) / 10^9" | bc -l)" "$(echo "($t2 - $t1) / 10^9" | bc -l)" \
		"$(echo "(${st[13]} + ${st[14]}) / $tck" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
	kill $pid; wait $pid 2>/dev/null || true; rm -rf "$log" "$home"
}
for _ in $(seq "$pairs"); do one "$new" this; one "$old" other; done
