#!/usr/bin/env bash
# make demo: what cpuslot does, in one command (root, Linux with cgroup v1 or v2).
#
#  1. installs what is missing (curl, Maven, a JDK 25, Go), builds the node agent and the
#     Java runtime;
#  2. starts the agent standalone and the runtime JVM in a cgroup of its own under
#     /cpuslot-demo (the runtime's "container"), registers the sample functions;
#  3. runs CPU-bound invocations at the same time with different CPU quotas, with and without
#     cpuslot, and prints the CPU share each one got;
#  4. measures what a slot costs per invocation: the node agent and client alone, then hello world
#     through the runtime against a second runtime without cpuslot (make bench-runtime's setup);
#  5. removes everything it made (also on Ctrl-C): processes, slots, cgroups.
#
# Safe to run again: leftovers of an interrupted run are removed first.
# Environment: CPUSLOT_DEMO_SECONDS (length of each CPU run, default 5),
#              RUNTIME_PIDNS=0 (the runtime in the host's PID namespace: on cgroup v1 the agent
#              then places every thread itself, the slow path; default 1, a namespace of its own),
#              CPUSLOT_DEMO_WORK (scratch dir, default <repo>/.cache/demo),
#              CPUSLOT_NO_INSTALL=1 (only check for the tools, install nothing).
#
# hack/bench-runtime.sh sources this file for its setup functions.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${CPUSLOT_DEMO_WORK:-$REPO/.cache/demo}"
DEMO_CG="${DEMO_CG:-/cpuslot-demo}"
SECONDS_PER_RUN="${CPUSLOT_DEMO_SECONDS:-5}"
RUNTIME_JAR="$REPO/runtime-image/runtime/target/runtime-0.1.0-SNAPSHOT.jar"
SAMPLES_JAR="$REPO/runtime-image/samples/target/samples-0.1.0-SNAPSHOT.jar"
BENCH_JAR="$REPO/runtime-image/bench/target/bench-0.1.0-SNAPSHOT.jar"

say()  { printf '\n\033[1m== %s\033[0m\n' "$*"; }
info() { printf '   %s\n' "$*"; }
die()  { printf 'demo: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- tools --------------

apt_updated=0
apt_install() {
	[ "${CPUSLOT_NO_INSTALL:-0}" = 1 ] && die "missing $* (CPUSLOT_NO_INSTALL=1: not installing)"
	command -v apt-get >/dev/null || die "missing $*; install it (no apt-get here)"
	if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
	info "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

java_major() { "$1/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }

# Sets JAVA_HOME to a JDK >= 25 (the one in JAVA_HOME, else one under /usr/lib/jvm).
find_jdk25() {
	if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/jlink" ] && [ "$(java_major "$JAVA_HOME")" -ge 25 ] 2>/dev/null; then
		return 0
	fi
	local d
	for d in /usr/lib/jvm/*; do
		if [ -x "$d/bin/jlink" ] && [ "$(java_major "$d")" -ge 25 ] 2>/dev/null; then
			export JAVA_HOME="$d"
			return 0
		fi
	done
	return 1
}

# Sets GO to a Go toolchain (go on PATH, else /usr/local/go).
find_go() {
	GO="$(command -v go || true)"
	[ -z "$GO" ] && [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go
	[ -n "$GO" ] && "$GO" version >/dev/null 2>&1
}

ensure_tools() {
	say "Tools"
	command -v curl >/dev/null || apt_install curl ca-certificates
	command -v mvn >/dev/null || apt_install maven
	if ! find_jdk25; then
		# Eclipse Temurin 25 from Adoptium's apt repository (Debian has no JDK 25 yet)
		[ "${CPUSLOT_NO_INSTALL:-0}" = 1 ] && die "no JDK 25 (set JAVA_HOME)"
		info "adding the Adoptium apt repository for temurin-25-jdk"
		install -d /etc/apt/keyrings
		curl -fsSL https://packages.adoptium.net/artifactory/api/gpg/key/public -o /etc/apt/keyrings/adoptium.asc
		echo "deb [signed-by=/etc/apt/keyrings/adoptium.asc] https://packages.adoptium.net/artifactory/deb $(. /etc/os-release && echo "$VERSION_CODENAME") main" \
			>/etc/apt/sources.list.d/adoptium.list
		apt_updated=0
		apt_install temurin-25-jdk
		find_jdk25 || die "temurin-25-jdk installed but no JDK 25 found under /usr/lib/jvm"
	fi
	if ! find_go; then
		# the official tarball, as go.dev/doc/install describes (Debian's golang is too old)
		[ "${CPUSLOT_NO_INSTALL:-0}" = 1 ] && die "no Go toolchain"
		local ver arch
		ver="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$REPO/go.mod")"
		case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) die "no Go for $(uname -m)" ;; esac
		info "installing Go $ver into /usr/local/go"
		curl -fsSL "https://go.dev/dl/go$ver.linux-$arch.tar.gz" | tar -C /usr/local -xz
		find_go || die "Go install failed"
	fi
	export PATH="$JAVA_HOME/bin:$PATH"
	info "java: $JAVA_HOME ($(java_major "$JAVA_HOME")), go: $("$GO" version | cut -d' ' -f3), $(mvn -v 2>/dev/null | head -1 | sed 's/\x1b\[[0-9;]*m//g')"
}

build_all() {
	say "Building the node agent (Go) and the runtime (Java, Maven)"
	(cd "$REPO" && CGO_ENABLED=0 "$GO" build -o bin/node-agent ./cmd/node-agent && CGO_ENABLED=0 "$GO" build -C tools -o "$REPO/bin/slotbench" ./slotbench)
	info "bin/node-agent, bin/slotbench"
	(cd "$REPO/runtime-image" && ./build.sh -q -DskipTests package) >"$WORK/maven.log" 2>&1 ||
		{ tail -40 "$WORK/maven.log"; die "runtime build failed (log: $WORK/maven.log)"; }
	info "runtime-image/runtime/target/runtime-0.1.0-SNAPSHOT.jar (+ lib/), samples, bench"
}

# ---------------------------------------------------------------- cgroups ------------

# CG_VERSION and CG_ROOTS: the cpu hierarchy (v1: cpu, and cpuacct when mounted apart).
detect_cgroups() {
	CG_ROOTS=()
	local cpu acct uni
	cpu="$(awk '{for (i = 1; i <= NF; i++) if ($i == "-") { if ($(i+1) == "cgroup" && ("," $(i+3) ",") ~ /,cpu,/) print $5; break }}' /proc/self/mountinfo | head -1)"
	acct="$(awk '{for (i = 1; i <= NF; i++) if ($i == "-") { if ($(i+1) == "cgroup" && ("," $(i+3) ",") ~ /,cpuacct,/) print $5; break }}' /proc/self/mountinfo | head -1)"
	uni="$(awk '{for (i = 1; i <= NF; i++) if ($i == "-") { if ($(i+1) == "cgroup2") print $5; break }}' /proc/self/mountinfo | head -1)"
	if [ -n "$cpu" ]; then
		CG_VERSION=1
		CG_ROOTS=("$cpu")
		[ -n "$acct" ] && [ "$acct" != "$cpu" ] && CG_ROOTS+=("$acct")
	elif [ -n "$uni" ] && grep -qw cpu "$uni/cgroup.controllers"; then
		CG_VERSION=2
		CG_ROOTS=("$uni")
		grep -qw cpu "$uni/cgroup.subtree_control" || echo +cpu >"$uni/cgroup.subtree_control"
	else
		die "no cgroup hierarchy with the cpu controller"
	fi
}

cg_create() { # cg_create /cpuslot-demo/runtime
	local r
	for r in "${CG_ROOTS[@]}"; do mkdir -p "$r$1"; done
	if [ "$CG_VERSION" = 2 ]; then echo +cpu >"${CG_ROOTS[0]}$(dirname "$1")/cgroup.subtree_control"; fi
}

# The demo's cgroup gets the largest CPU weight, so that other work on a busy machine does not
# change the numbers (quotas, the caps on show, are not affected by weights).
cg_favour() {
	if [ "$CG_VERSION" = 1 ]; then echo 262144 >"${CG_ROOTS[0]}$1/cpu.shares"; else echo 10000 >"${CG_ROOTS[0]}$1/cpu.weight"; fi
}

# Prints a shell snippet that moves the shell's own pid ($$) into cgroup $1 in every root.
cg_join_snippet() {
	local r s=""
	for r in "${CG_ROOTS[@]}"; do s+="echo \$\$ > '$r$1/cgroup.procs' && "; done
	printf '%s' "$s"
}

# ---------------------------------------------------------------- processes ----------

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { local p=$1; while port_in_use "$p"; do p=$((p + 1)); done; echo "$p"; }

# start_in_cgroup NAME CGROUP CMD... : runs CMD in CGROUP (joined before exec), logs to $WORK/NAME.log
start_in_cgroup() {
	local name=$1 cg=$2
	shift 2
	sh -c "$(cg_join_snippet "$cg") exec \"\$@\"" sh "$@" >"$WORK/$name.log" 2>&1 &
	echo $! >"$WORK/$name.pid"
}

run_in_cgroup() { # run_in_cgroup CGROUP CMD... : in the foreground
	local cg=$1
	shift
	sh -c "$(cg_join_snippet "$cg") exec \"\$@\"" sh "$@"
}

stop_pid_file() { # SIGTERM, then SIGKILL, the process we started (by its recorded pid)
	local f=$1 pid
	[ -f "$f" ] || return 0
	pid="$(cat "$f")"
	if kill -0 "$pid" 2>/dev/null; then
		pkill -TERM -P "$pid" 2>/dev/null || true # its child, when started in a PID namespace (unshare --fork)
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$f"
}

wait_http() { # wait_http URL WHAT PIDFILE
	for _ in $(seq 600); do
		curl -fs -o /dev/null "$1" && return 0
		kill -0 "$(cat "$3")" 2>/dev/null || { tail -30 "${3%.pid}.log"; die "$2 exited"; }
		sleep 0.1
	done
	die "$2 did not come up ($1)"
}

AGENT_SOCK=""
start_agent() { # start_agent PREWARM
	AGENT_SOCK="$WORK/agent.sock"
	AGENT_HTTP="$(free_port 19464)"
	cg_create "$DEMO_CG/agent"
	start_in_cgroup agent "$DEMO_CG/agent" "$REPO/bin/node-agent" run --socket "$AGENT_SOCK" --serve-under "$DEMO_CG" \
		--http "127.0.0.1:$AGENT_HTTP" --prewarm "$1"
	wait_http "http://127.0.0.1:$AGENT_HTTP/readyz" "the node agent" "$WORK/agent.pid"
}

# start_runtime NAME CGROUP ENV... : the runtime JVM in its own cgroup; sets <NAME>_PORT, <NAME>_METRICS
start_runtime() {
	launch_runtime "$@"
	wait_runtime "$1"
}

# launch_runtime NAME CGROUP ENV... : start_runtime without waiting for it (wait_runtime NAME before use)
launch_runtime() {
	local name=$1 cg=$2 port metrics
	shift 2
	port="$(free_port 18080)"
	metrics="$(free_port $((port + 1000)))"
	cg_create "$cg"
	# the runtime's own lines into its log file; OpenWhisk /run from several client threads at once
	local cmd=(env PORT="$port" CPUSLOT_METRICS_PORT="$metrics" CPUSLOT_LOG=stderr __OW_ALLOW_CONCURRENT=true "$@"
		"$JAVA_HOME/bin/java" -XX:+UseSerialGC -Xmx512m
		-XX:+UnlockExperimentalVMOptions -XX:+EnableJVMCI --upgrade-module-path="$(dirname "$RUNTIME_JAR")/compiler"
		-jar "$RUNTIME_JAR")
	if [ "${RUNTIME_PIDNS:-1}" = 1 ]; then
		# In a PID namespace of its own, as in a pod: on cgroup v1 the agent passes slot fds only
		# to a peer whose PID namespace holds every process of its cgroup (docs/security.md), so
		# unshare stays outside the cgroup and the JVM, the namespace's PID 1, joins it itself.
		unshare --pid --fork --kill-child=SIGTERM sh -c "$(cg_join_snippet "$cg") exec \"\$@\"" sh "${cmd[@]}" >"$WORK/$name.log" 2>&1 &
		echo $! >"$WORK/$name.pid"
	else
		# RUNTIME_PIDNS=0: in the host's PID namespace; the agent then places every thread itself
		start_in_cgroup "$name" "$cg" "${cmd[@]}"
	fi
	printf -v "${name^^}_PORT" '%s' "$port"
	printf -v "${name^^}_METRICS" '%s' "$metrics"
}

wait_runtime() { # wait_runtime NAME
	local metrics="${1^^}_METRICS"
	wait_http "http://127.0.0.1:${!metrics}/metrics" "the runtime ($1)" "$WORK/$1.pid"
}

register() { # register PORT NAME CLASS [QUOTA]: Hydra /register of a sample Java function
	local q=""
	[ -n "${4:-}" ] && q="&quota=$4"
	curl -fsS -X POST "http://127.0.0.1:$1/register?name=$2&language=java&entryPoint=dev.cpuslot.samples.$3&url=file:$SAMPLES_JAR$q" >/dev/null
}

invoke() { # invoke PORT NAME ARGS_JSON OUT_PREFIX: headers to OUT.h, body to OUT.b
	# X-Cpuslot-Usage: reply asks for the invocation's CPU in the answer (X-Cpuslot-Cpu-Ns)
	curl -sS -o "$4.b" -D "$4.h" -X POST "http://127.0.0.1:$1/" -H 'X-Cpuslot-Usage: reply' \
		-d "{\"name\":\"$2\",\"arguments\":\"$(printf '%s' "$3" | sed 's/"/\\"/g')\"}"
}

header() { grep -i "^$1:" "$2" | tail -1 | cut -d: -f2- | tr -d ' \r'; }

# A shared machine's convention: while /tmp/cpuslot-quiet exists someone is measuring; wait
# for it to go, then hold it while we measure (CPUSLOT_QUIET_FILE= turns this off).
QUIET="${CPUSLOT_QUIET_FILE-/tmp/cpuslot-quiet}"
HOLDING_QUIET=0
hold_quiet() {
	[ -n "$QUIET" ] || return 0
	while [ -e "$QUIET" ]; do info "$QUIET exists: someone is measuring on this machine; waiting"; sleep 10; done
	echo "cpuslot demo pid $$" >"$QUIET"
	HOLDING_QUIET=1
}

cleanup() {
	set +e
	local f
	[ "$HOLDING_QUIET" = 1 ] && rm -f "$QUIET" && HOLDING_QUIET=0
	for f in "$WORK"/*.pid; do [ -e "$f" ] && stop_pid_file "$f"; done
	# the agent's cleanup: slots, then every cgroup of the demo, bottom up
	if [ -x "$REPO/bin/node-agent" ] && [ ${#CG_ROOTS[@]} -gt 0 ] && [ -d "${CG_ROOTS[0]}$DEMO_CG" ]; then
		"$REPO/bin/node-agent" cleanup --under "$DEMO_CG" --tree --wait 5s >/dev/null ||
			info "warning: could not remove the cgroups under $DEMO_CG"
	fi
	rm -f "$WORK/agent.sock"
	set -e
}

# ---------------------------------------------------------------- the demo -----------

# runs "label|port|function|args" lines at the same time; prints one table row per run
concurrent_runs() {
	local title=$1
	shift
	local i=0 spec pids=()
	for spec in "$@"; do
		IFS='|' read -r label port fn args quota <<<"$spec"
		invoke "$port" "$fn" "$args" "$WORK/run$i" &
		pids+=($!)
		i=$((i + 1))
	done
	wait "${pids[@]}"
	printf '\n   %s\n' "$title"
	printf '   %-34s %-12s %-20s %s\n' "invocation" "quota asked" "CPU share measured" "slot"
	i=0
	for spec in "$@"; do
		IFS='|' read -r label port fn args quota <<<"$spec"
		local cpu wall share slot
		cpu="$(header X-Cpuslot-Cpu-Ns "$WORK/run$i.h")"
		wall="$(sed -n 's/.*"wall_ms":\([0-9.]*\).*/\1/p' "$WORK/run$i.b")"
		share="n/a"
		if [ -n "$cpu" ] && [ -n "$wall" ]; then
			share="$(awk -v c="$cpu" -v w="$wall" 'BEGIN { printf "%.2f of a core", c / (w * 1e6) }')"
		fi
		slot="$(header X-Cpuslot-Outcome "$WORK/run$i.h")"
		[ -n "$slot" ] && slot="slot $(header X-Cpuslot-Slot "$WORK/run$i.h") ($slot)" || slot="none"
		printf '   %-34s %-12s %-20s %s\n' "$label" "$quota" "$share" "$slot"
		i=$((i + 1))
	done
}

main() {
	[ "$(id -u)" = 0 ] || die "run as root (it creates cgroups): sudo make demo"
	mkdir -p "$WORK"
	detect_cgroups
	trap 'cleanup; exit 130' INT TERM
	trap cleanup EXIT
	cleanup # leftovers of an interrupted run
	ensure_tools
	build_all
	hold_quiet

	say "Starting the node agent and the runtime"
	cg_create "$DEMO_CG"
	cg_favour "$DEMO_CG"
	start_agent "200m=2,300m=2,500m=2,1=2"
	info "node agent: serves every process in a cgroup below $DEMO_CG; slots kept ready: 200m, 300m, 500m, 1 core (2 each)"
	info "            socket $AGENT_SOCK, metrics http://127.0.0.1:$AGENT_HTTP/metrics"
	start_runtime rt "$DEMO_CG/runtime" CPUSLOT_SOCKET="$AGENT_SOCK"
	# the baseline of "What a slot costs" (below): it starts while the functions are registered
	launch_runtime base "$DEMO_CG/base" CPUSLOT_ENABLED=false
	info "runtime:    JVM in cgroup $DEMO_CG/runtime, HTTP :$RT_PORT (OpenWhisk, Knative, Hydra), metrics :$RT_METRICS$([ "${RUNTIME_PIDNS:-1}" = 1 ] && echo ", PID 1 of a PID namespace of its own")"
	info "baseline:   a second runtime JVM with cpuslot off (CPUSLOT_ENABLED=false) in $DEMO_CG/base, HTTP :$BASE_PORT,"
	info "            for the last comparison (what a slot costs against no cpuslot at all)"

	say "Registering the sample functions (Hydra /register; the quota is the function's CPU limit per invocation)"
	register "$RT_PORT" hello HelloWorld 200m
	register "$RT_PORT" fib Fibonacci 500m
	register "$RT_PORT" video VideoDownscale 1
	register "$RT_PORT" filehash FileHash 300m
	register "$RT_PORT" restkv RestKv 200m
	register "$RT_PORT" burn20 CpuBurn 200m
	register "$RT_PORT" burn30 CpuBurn 300m
	register "$RT_PORT" burn50 CpuBurn 500m
	register "$RT_PORT" burn-noslot CpuBurn
	register "$RT_PORT" hello-slot HelloWorld 1
	info "hello (200m), fib (500m), video (1 core), filehash (300m), restkv (200m), CpuBurn as burn20/30/50 (200m/300m/500m) and burn-noslot (no quota)"
	invoke "$RT_PORT" hello '{"name":"newcomer"}' "$WORK/hello"
	info "hello -> $(cat "$WORK/hello.b")   [ran in slot $(header X-Cpuslot-Slot "$WORK/hello.h"), $(header X-Cpuslot-Outcome "$WORK/hello.h")]"
	invoke "$RT_PORT" fib '{"n":27}' "$WORK/fib"
	info "fib   -> $(cat "$WORK/fib.b")"
	invoke "$RT_PORT" video '{"width":320,"height":240,"frames":10,"factor":2}' "$WORK/video"
	info "video -> $(cut -c1-110 "$WORK/video.b")..."

	local ms=$((SECONDS_PER_RUN * 1000))
	say "CPU quotas: three CPU-bound invocations at the same time, ${SECONDS_PER_RUN} s each"
	concurrent_runs "with cpuslot: each invocation runs in a CPU slot of its quota" \
		"burn, asks 20% of a core|$RT_PORT|burn20|{\"ms\":$ms}|200m" \
		"burn, asks 30% of a core|$RT_PORT|burn30|{\"ms\":$ms}|300m" \
		"burn, asks 50% of a core|$RT_PORT|burn50|{\"ms\":$ms}|500m"
	local it1
	local p1 p2 p3
	invoke "$RT_PORT" burn-noslot "{\"ms\":$ms}" "$WORK/ns1" & p1=$!
	invoke "$RT_PORT" burn-noslot "{\"ms\":$ms}" "$WORK/ns2" & p2=$!
	invoke "$RT_PORT" burn-noslot "{\"ms\":$ms}" "$WORK/ns3" & p3=$!
	wait $p1 $p2 $p3
	printf '\n   without cpuslot (no quota, same function, same time): the kernel shares the machine'\''s %s cores evenly;\n' "$(nproc)"
	printf '   work done per invocation (loop iterations), next to the 50%% slot run above:\n'
	local ref
	ref="$(sed -n 's/.*"iterations":\([0-9]*\).*/\1/p' "$WORK/run2.b")"
	for i in 1 2 3; do
		it1="$(sed -n 's/.*"iterations":\([0-9]*\).*/\1/p' "$WORK/ns$i.b")"
		awk -v a="$it1" -v r="$ref" -v i="$i" 'BEGIN { printf "   burn-noslot #%d: %d iterations = about %.2f of a core (the 500m run did %d)\n", i, a, 0.5 * a / r, r }'
	done

	say "Fairness: a 10-thread and a 1-thread invocation with the same quota (500m), at the same time"
	concurrent_runs "with cpuslot: threads an invocation starts stay in its slot" \
		"burn with 10 threads|$RT_PORT|burn50|{\"ms\":$ms,\"threads\":10}|500m" \
		"burn with 1 thread|$RT_PORT|burn50|{\"ms\":$ms,\"threads\":1}|500m"
	invoke "$RT_PORT" burn-noslot "{\"ms\":$ms,\"threads\":10}" "$WORK/f10" & p1=$!
	invoke "$RT_PORT" burn-noslot "{\"ms\":$ms,\"threads\":1}" "$WORK/f1" & p2=$!
	wait $p1 $p2
	printf '\n   without cpuslot: work done (iterations); the 10-thread invocation takes most of the machine\n'
	local a b
	a="$(sed -n 's/.*"iterations":\([0-9]*\).*/\1/p' "$WORK/f10.b")"
	b="$(sed -n 's/.*"iterations":\([0-9]*\).*/\1/p' "$WORK/f1.b")"
	ref="$(sed -n 's/.*"iterations":\([0-9]*\).*/\1/p' "$WORK/run1.b")"
	awk -v a="$a" -v b="$b" -v r="$ref" 'BEGIN { printf "   10 threads: %d iterations (~%.2f of a core), 1 thread: %d (~%.2f of a core)\n", a, 0.5 * a / r, b, 0.5 * b / r }'

	say "What a slot costs per invocation"
	info "node agent + client alone (bin/slotbench: acquire, place the thread, release; 'uncached' makes and"
	info "removes a cgroup every time, 'affinity' is cpuslot's default and reuses the thread's slot):"
	cg_create "$DEMO_CG/tools"
	(cd "$REPO" && run_in_cgroup "$DEMO_CG/tools" bin/slotbench -modes uncached,affinity -threads 1 -steady 500 -sporadic 50 -share 0 2>&1) |
		sed -n '/^steady/,$p' | sed 's/^/   /'
	info ""
	# The benchmark's setup (hack/bench-runtime.sh), shorter: the baseline is a runtime without cpuslot,
	# not the demo runtime's own function without a quota, which shared the JVM's warm-up; with a
	# warm-up too short for the JIT that ratio moved with the targets' order (docs/benchmarks.md,
	# "The demo's comparison").
	wait_runtime base
	register "$BASE_PORT" hello HelloWorld
	info "through the runtime: hello world over HTTP (Hydra POST /), as make bench-runtime measures it:"
	info "  hello with a slot:  the demo's runtime; each invocation of hello-slot (quota 1 core) runs in a CPU slot"
	info "                      leased from the node agent, as in production"
	info "  hello, no cgroups:  a second runtime JVM started the same way but with cpuslot off (CPUSLOT_ENABLED=false):"
	info "                      what the same call costs without cpuslot; the ratios are to it"
	info "  one client thread, 5000 warm-up requests each, then 4 rounds x 2000 requests, alternating"
	run_in_cgroup "$DEMO_CG/tools" "$JAVA_HOME/bin/java" -jar "$BENCH_JAR" --threads 1 --requests 2000 --rounds 4 --warmup 5000 \
		--target "hello with a slot" "http://127.0.0.1:$RT_PORT/" '{"name":"hello-slot","arguments":"{}"}' \
		--target "hello, no cgroups" "http://127.0.0.1:$BASE_PORT/" '{"name":"hello","arguments":"{}"}' |
		sed -n '/^|/p;/^ratio/p' | sed 's/^/   /'

	say "Cleaning up"
	cleanup
	trap - EXIT INT TERM
	info "agent and both runtimes stopped, slots and $DEMO_CG removed"
	info "more: runtime-image/README.md (quota names, platforms, metrics), make test, hack/bench-runtime.sh"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	main "$@"
fi
