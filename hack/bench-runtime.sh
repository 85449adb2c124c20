#!/usr/bin/env bash
# make bench-runtime: hello-world /run latency and throughput through the Java runtime, with
# CPU slots vs without cgroups, side by side in one run (root). Not a test: it prints a table.
#
#   "with slots":  a runtime JVM in /cpuslot-bench/slots, served by the node agent, with the
#                  runtime's defaults (local leasing); every invocation runs in a 1-core slot
#                  (OpenWhisk /init env CPUSLOT_QUOTA=1): the process holds its slots (HOLD
#                  leases) and each invocation claims one from its own table and sends nothing;
#                  the worker reads the slot's counters after the answer (the requests do not ask
#                  for their usage: no X-Cpuslot-Usage header) and usage goes out batched.
#   "slots, linger": the per-invocation path (CPUSLOT_LOCAL=false) with its lingering
#                  (CPUSLOT_LINGER=100ms): the worker keeps its lease between invocations.
#   "slots, no linger": CPUSLOT_LOCAL=false CPUSLOT_LINGER=0: ACQUIRE (affinity hit: no cgroup
#                  write), counters read, one-way RELEASE per invocation.
#   "no cgroups":  the same runtime JVM in /cpuslot-bench/base with CPUSLOT_ENABLED=false and no
#                  agent: invocations never touch a slot.
#   BENCH_KERNEL=1 adds two targets that separate the kernel's share of the gap from the runtime's:
#   "worker in 1-core cgroup": the "no cgroups" runtime (no slot client at all), but this script
#                  moves each of its function worker threads (fn-*) into a child cgroup with the
#                  1-core slot's quota (cfs_quota_us 100000 per 100000), as a slot holds them;
#   "worker in unlimited cgroup": the same, the child cgroup without a quota (cfs_quota_us -1).
#   BENCH_BASELINE_JAR=path/to/runtime.jar adds "with slots, baseline": the "with slots" setup with
#                  another build of the runtime (e.g. main's, built in a temporary directory), to
#                  compare a change with the code before it in one run.
#
# Every runtime JVM runs in a PID namespace of its own, as in a pod: on cgroup v1 the agent
# passes slot fds (which local leasing, lingering and the client's own counter reads need) only
# to such peers. All JVMs are started the same way and warmed up; the client (runtime-image/bench) keeps one
# keep-alive connection per thread and alternates between the two every round.
# Environment: BENCH_THREADS (default 1,4), BENCH_REQUESTS (per thread per round, 2000),
#              BENCH_ROUNDS (6), BENCH_WARMUP (5000), BENCH_LINGER=0 (leave out the
#              "slots, linger" target), BENCH_NOLINGER=0 (leave out "slots, no linger"),
#              BENCH_KERNEL=1 (add the two "worker in ... cgroup" targets), BENCH_BASELINE_JAR,
#              BENCH_JFR=DIR (each runtime JVM records a JFR profile, DIR/<name>.jfr, Java samples
#              every 1 ms), CPUSLOT_NO_INSTALL=1.
set -euo pipefail

export DEMO_CG=/cpuslot-bench
export CPUSLOT_DEMO_WORK="${CPUSLOT_DEMO_WORK:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.cache/bench-runtime}"
# shellcheck source=hack/demo.sh
source "$(dirname "${BASH_SOURCE[0]}")/demo.sh"

init_hello() { # init_hello PORT [ENV_JSON]: OpenWhisk /init with the samples jar's HelloWorld
	local body="$WORK/init.json" env="${2:-}"
	[ -n "$env" ] || env='{}'
	printf '{"value":{"name":"hello","main":"dev.cpuslot.samples.HelloWorld","binary":true,"env":%s,"code":"' "$env" >"$body"
	base64 -w0 "$SAMPLES_JAR" >>"$body"
	printf '"}}' >>"$body"
	curl -fsS -X POST "http://127.0.0.1:$1/init" --data-binary "@$body" >/dev/null
}

# jvm_pid NAME: the pid of the runtime NAME's JVM: the child of the recorded process (unshare
# --fork, in a PID namespace of its own) or, with RUNTIME_PIDNS=0, that process itself (it execs
# the JVM; looking only for a child found none there, and the thread figures came out empty).
# Empty while the JVM is not started yet; fails once the recorded process is gone.
jvm_pid() {
	local pid child
	pid="$(cat "$WORK/$1.pid" 2>/dev/null)" && [ -d "/proc/$pid" ] || return 1
	if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$JAVA_HOME/bin/java")" ]; then
		echo "$pid"
	else
		child="$(ps -o pid= --ppid "$pid" 2>/dev/null | head -1 | tr -d ' ')"
		[ -z "$child" ] || [ "$(readlink "/proc/$child/exe" 2>/dev/null)" != "$(readlink -f "$JAVA_HOME/bin/java")" ] || echo "$child"
	fi
}

# move_workers NAME CGROUP: every 0.2 s, moves the function worker threads (fn-*) of the runtime
# NAME into CGROUP (both v1 hierarchies, or v2 as threaded), until killed. Only the workers move:
# the HTTP threads stay where they are, as with slots.
move_workers() {
	local java="" t comm r cgs
	while sleep 0.2; do
		[ -n "$java" ] || java="$(jvm_pid "$1")" || return 0
		[ -n "$java" ] || continue
		for t in /proc/"$java"/task/*; do
			read -r comm <"$t/comm" 2>/dev/null || continue
			[[ "$comm" == fn-* ]] || continue
			mapfile -t cgs <"$t/cgroup" 2>/dev/null || continue
			[[ " ${cgs[*]} " == *":$2 "* ]] && continue # already there (bash builtins only: no fork per thread)
			for r in "${CG_ROOTS[@]}"; do
				if [ "$CG_VERSION" = 1 ]; then echo "${t##*/}" >"$r$2/tasks"; else echo "${t##*/}" >"$r$2/cgroup.threads"; fi
			done 2>/dev/null || true
		done
	done
}

# kernel_target NAME QUOTA_US LABEL: a runtime without a slot client whose workers this script
# keeps in the child cgroup NAME/w (cfs quota QUOTA_US per 100 ms period, -1: none).
kernel_target() {
	local name=$1 quota=$2 cg="$DEMO_CG/$1" port
	start_runtime "$name" "$cg" CPUSLOT_ENABLED=false $(jfr "$name")
	if [ "$CG_VERSION" = 1 ]; then
		cg_create "$cg/w"
		echo 100000 >"${CG_ROOTS[0]}$cg/w/cpu.cfs_period_us"
		echo "$quota" >"${CG_ROOTS[0]}$cg/w/cpu.cfs_quota_us"
	else
		# as the agent makes a slot: threaded first, then the controller (the runtime's cgroup has processes)
		mkdir -p "${CG_ROOTS[0]}$cg/w"
		echo threaded >"${CG_ROOTS[0]}$cg/w/cgroup.type"
		echo +cpu >"${CG_ROOTS[0]}$cg/cgroup.subtree_control"
		if [ "$quota" = -1 ]; then echo "max 100000" >"${CG_ROOTS[0]}$cg/w/cpu.max"; else echo "$quota 100000" >"${CG_ROOTS[0]}$cg/w/cpu.max"; fi
	fi
	port="${name^^}_PORT"
	init_hello "${!port}"
	move_workers "$name" "$cg/w" &
	echo $! >"$WORK/$name-mover.pid"
	kernel+=(--target "$3" "http://127.0.0.1:${!port}/run" "$body")
	info "$3: pid $(cat "$WORK/$name.pid") in $cg, workers moved to $cg/w, :${!port}"
}

# thread_costs LABEL NAME METRICS_PORT: the kernel's per-thread accounting of the runtime NAME
# (/proc/<tid>/schedstat: time on a CPU, time runnable but waiting for one, times scheduled),
# summed by kind of thread and divided by the invocations it served (warm-up included). Kinds:
# worker (fn-*), http (the threads that serve requests: cpuslot-http-*, or a build's before them
# virtual-thread carriers, ForkJoinPool-*), dispatcher (the HTTP server's), slot-client.
thread_costs() {
	local java n
	java="$(jvm_pid "$2")" || return 0
	[ -n "$java" ] || { info "$1: no JVM found for its threads"; return 0; }
	n="$(curl -fs "http://127.0.0.1:$3/metrics" | awk '/^cpuslot_invocations_total/ {n += $2} END {print n + 0}')"
	[ "$n" -gt 0 ] 2>/dev/null || return 0
	for t in /proc/"$java"/task/*; do
		printf '%s %s %s\n' "$(tr ' ' _ <"$t/comm")" "$(cat "$t/schedstat")" \
			"$(awk '/^se.nr_migrations/ {m = $3} /^nr_involuntary_switches/ {v = $3} END {print m + 0, v + 0}' "$t/sched" 2>/dev/null || echo 0 0)"
	done 2>/dev/null | awk -v l="$1" -v n="$n" '
		{ k = $1 ~ /^fn-/ ? "worker" : $1 ~ /^(ForkJoinPool|cpuslot-http)/ ? "http" : $1 ~ /^HTTP-Dispatch/ ? "dispatcher" : $1 ~ /^cpuslot-local/ ? "slot-client" : "other"
		  cpu[k] += $2; wait[k] += $3; runs[k] += $4; mig[k] += $5; inv[k] += $6 }
		END { printf "%s, per invocation (%d):\n", l, n
		      split("worker http dispatcher slot-client", ks, " ")
		      for (i = 1; i <= 4; i++) { k = ks[i]; if (k in cpu) printf "    %-11s cpu %5.1f us, runnable waiting %5.1f us, scheduled %.2f times, migrated %.3f, preempted %.3f\n", k, cpu[k] / n / 1e3, wait[k] / n / 1e3, runs[k] / n, mig[k] / n, inv[k] / n } }'
}

# jfr NAME: the environment that makes the runtime NAME record a JFR profile (BENCH_JFR=DIR), or nothing
jfr() {
	[ -n "${BENCH_JFR:-}" ] || return 0
	mkdir -p "$BENCH_JFR"
	echo "JAVA_TOOL_OPTIONS=-XX:StartFlightRecording=filename=$BENCH_JFR/$1.jfr,settings=profile,dumponexit=true,jdk.ExecutionSample#period=1ms,jdk.NativeMethodSample#period=1ms"
}

bench_main() {
	[ "$(id -u)" = 0 ] || die "run as root (it creates cgroups)"
	mkdir -p "$WORK"
	detect_cgroups
	trap 'cleanup; exit 130' INT TERM
	trap cleanup EXIT
	cleanup
	ensure_tools
	build_all
	hold_quiet

	say "Setting up: agent, a runtime with slots, a runtime without cgroups"
	cg_create "$DEMO_CG"
	cg_favour "$DEMO_CG" # both runtimes, the agent and the client alike
	start_agent "1=4"
	start_runtime slots "$DEMO_CG/slots" CPUSLOT_SOCKET="$AGENT_SOCK" $(jfr slots)
	start_runtime base "$DEMO_CG/base" CPUSLOT_ENABLED=false $(jfr base)
	init_hello "$SLOTS_PORT" '{"CPUSLOT_QUOTA":"1"}'
	init_hello "$BASE_PORT"
	local body='{"value":{"name":"bench"},"activation_id":"b","action_name":"/guest/hello","namespace":"guest","deadline":"9999999999999"}'
	local nolinger=() linger=() kernel=() baseline=()
	if [ -n "${BENCH_BASELINE_JAR:-}" ]; then
		[ -f "$BENCH_BASELINE_JAR" ] || die "BENCH_BASELINE_JAR: no such file: $BENCH_BASELINE_JAR"
		RUNTIME_JAR="$BENCH_BASELINE_JAR" start_runtime old "$DEMO_CG/old" CPUSLOT_SOCKET="$AGENT_SOCK" $(jfr old)
		init_hello "$OLD_PORT" '{"CPUSLOT_QUOTA":"1"}'
		baseline=(--target "with slots, baseline" "http://127.0.0.1:$OLD_PORT/run" "$body")
		info "with slots, baseline: $BENCH_BASELINE_JAR, pid $(cat "$WORK/old.pid") in $DEMO_CG/old, :$OLD_PORT"
	fi
	if [ "${BENCH_LINGER:-1}" != 0 ]; then
		start_runtime linger "$DEMO_CG/linger" CPUSLOT_SOCKET="$AGENT_SOCK" CPUSLOT_LOCAL=false
		init_hello "$LINGER_PORT" '{"CPUSLOT_QUOTA":"1"}'
		linger=(--target "slots, linger" "http://127.0.0.1:$LINGER_PORT/run" "$body")
		info "slots, linger: pid $(cat "$WORK/linger.pid") in $DEMO_CG/linger, :$LINGER_PORT"
	fi
	if [ "${BENCH_NOLINGER:-1}" != 0 ]; then
		start_runtime nolinger "$DEMO_CG/nolinger" CPUSLOT_SOCKET="$AGENT_SOCK" CPUSLOT_LOCAL=false CPUSLOT_LINGER=0
		init_hello "$NOLINGER_PORT" '{"CPUSLOT_QUOTA":"1"}'
		nolinger=(--target "slots, no linger" "http://127.0.0.1:$NOLINGER_PORT/run" "$body")
		info "slots, no linger: pid $(cat "$WORK/nolinger.pid") in $DEMO_CG/nolinger, :$NOLINGER_PORT"
	fi
	if [ "${BENCH_KERNEL:-0}" = 1 ]; then
		kernel_target kq 100000 "worker in 1-core cgroup"
		kernel_target kn -1 "worker in unlimited cgroup"
	fi
	info "with slots: pid $(cat "$WORK/slots.pid") in $DEMO_CG/slots, :$SLOTS_PORT; no cgroups: pid $(cat "$WORK/base.pid") in $DEMO_CG/base, :$BASE_PORT"
	info "$(uname -r), $(nproc) CPUs, cgroup v$CG_VERSION, load average $(cut -d' ' -f1-3 /proc/loadavg)"

	say "Benchmark (POST /run hello world)"
	cg_create "$DEMO_CG/client"
	start_in_cgroup client "$DEMO_CG/client" "$JAVA_HOME/bin/java" -jar "$BENCH_JAR" \
		--threads "${BENCH_THREADS:-1,4}" --requests "${BENCH_REQUESTS:-2000}" --rounds "${BENCH_ROUNDS:-6}" --warmup "${BENCH_WARMUP:-5000}" \
		--target "with slots" "http://127.0.0.1:$SLOTS_PORT/run" "$body" "${baseline[@]}" "${linger[@]}" "${nolinger[@]}" "${kernel[@]}" \
		--target "no cgroups" "http://127.0.0.1:$BASE_PORT/run" "$body"
	local pid rc=0
	pid="$(cat "$WORK/client.pid")"
	wait "$pid" || rc=$?
	rm -f "$WORK/client.pid"
	cat "$WORK/client.log"
	cp "$WORK/client.log" "$WORK/bench-runtime.txt"
	local label metrics l name
	for label in "with slots:$SLOTS_METRICS" "with slots, baseline:${OLD_METRICS:-}" "slots, linger:${LINGER_METRICS:-}" "slots, no linger:${NOLINGER_METRICS:-}"; do
		metrics="${label##*:}"
		[ -n "$metrics" ] || continue
		curl -fs "http://127.0.0.1:$metrics/metrics" | awk -v l="${label%:*}" '/^cpuslot_slot_acquire_seconds_total/ {a = $2} /^cpuslot_slot_release_seconds_total/ {r = $2}
			/event="acquire.calls"/ {n = $2} /event="linger.reused"/ {u = $2} /event="local.hit"/ {h = $2} /^cpuslot_slot_throttled_seconds_total/ {t += $2}
			/event="local.batch_read"/ {b = $2}
			END { if (n > 0) printf "%s, inside the runtime: acquire %.1f us, release %.1f us per invocation (mean of %d; %d reused a lingering lease, %d local hits, %d usage batches read); throttled %.3f s in total\n", l, a / n * 1e6, r / n * 1e6, n, u, h, b, t }'
	done
	say "Threads (kernel schedstat, per invocation, warm-up included)"
	for label in "with slots:slots:$SLOTS_METRICS" "with slots, baseline:old:${OLD_METRICS:-}" "slots, linger:linger:${LINGER_METRICS:-}" \
		"slots, no linger:nolinger:${NOLINGER_METRICS:-}" "worker in 1-core cgroup:kq:${KQ_METRICS:-}" \
		"worker in unlimited cgroup:kn:${KN_METRICS:-}" "no cgroups:base:$BASE_METRICS"; do
		IFS=: read -r l name metrics <<<"$label"
		[ -n "$metrics" ] && thread_costs "$l" "$name" "$metrics"
	done | tee -a "$WORK/bench-runtime.txt"
	curl -fs "http://127.0.0.1:$AGENT_HTTP/metrics" 2>/dev/null | awk '/^cpuslot_acquire_duration_seconds_count/ {n += $2} END { if (n > 0) printf "agent: %d ACQUIREs in total\n", n }' || true
	info "saved: $WORK/bench-runtime.txt"
	[ "$rc" = 0 ] || die "the benchmark client failed ($rc)"
}

bench_main "$@"
