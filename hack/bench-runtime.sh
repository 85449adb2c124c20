#!/usr/bin/env bash
# make bench-runtime: hello-world /run latency and throughput through the Java runtime, with
# CPU slots vs without cgroups, side by side in one run (root). Not a test: it prints a table.
#
#   "with slots":  a runtime JVM in /cpuslot-bench/slots, served by the node agent, with the
#                  runtime's defaults (local leasing); every invocation runs in a 1-core slot
#                  (OpenWhisk /init env CPUSLOT_QUOTA=1): the process holds its slots (HOLD
#                  leases) and each invocation claims one from its own table, reads the slot's
#                  counters and sends nothing (usage goes out batched, off the invocation path).
#   "slots, linger": the per-invocation path (CPUSLOT_LOCAL=false) with its lingering
#                  (CPUSLOT_LINGER=100ms): the worker keeps its lease between invocations.
#   "slots, no linger": CPUSLOT_LOCAL=false CPUSLOT_LINGER=0: ACQUIRE (affinity hit: no cgroup
#                  write), counters read, one-way RELEASE per invocation.
#   "no cgroups":  the same runtime JVM in /cpuslot-bench/base with CPUSLOT_ENABLED=false and no
#                  agent: invocations never touch a slot.
#
# Every runtime JVM runs in a PID namespace of its own, as in a pod: on cgroup v1 the agent
# passes slot fds (which local leasing, lingering and the client's own counter reads need) only
# to such peers. All JVMs are started the same way and warmed up; the client (runtime-image/bench) keeps one
# keep-alive connection per thread and alternates between the two every round.
# Environment: BENCH_THREADS (default 1,4), BENCH_REQUESTS (per thread per round, 2000),
#              BENCH_ROUNDS (6), BENCH_WARMUP (5000), BENCH_LINGER=0 (leave out the
#              "slots, linger" target), BENCH_NOLINGER=0 (leave out "slots, no linger"),
#              CPUSLOT_NO_INSTALL=1.
set -euo pipefail

export DEMO_CG=/cpuslot-bench
export RUNTIME_PIDNS=1
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
	start_runtime slots "$DEMO_CG/slots" CPUSLOT_SOCKET="$AGENT_SOCK"
	start_runtime base "$DEMO_CG/base" CPUSLOT_ENABLED=false
	init_hello "$SLOTS_PORT" '{"CPUSLOT_QUOTA":"1"}'
	init_hello "$BASE_PORT"
	local body='{"value":{"name":"bench"},"activation_id":"b","action_name":"/guest/hello","namespace":"guest","deadline":"9999999999999"}'
	local nolinger=() linger=()
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
	info "with slots: pid $(cat "$WORK/slots.pid") in $DEMO_CG/slots, :$SLOTS_PORT; no cgroups: pid $(cat "$WORK/base.pid") in $DEMO_CG/base, :$BASE_PORT"
	info "$(uname -r), $(nproc) CPUs, cgroup v$CG_VERSION, load average $(cut -d' ' -f1-3 /proc/loadavg)"

	say "Benchmark (POST /run hello world)"
	cg_create "$DEMO_CG/client"
	start_in_cgroup client "$DEMO_CG/client" "$JAVA_HOME/bin/java" -jar "$BENCH_JAR" \
		--threads "${BENCH_THREADS:-1,4}" --requests "${BENCH_REQUESTS:-2000}" --rounds "${BENCH_ROUNDS:-6}" --warmup "${BENCH_WARMUP:-5000}" \
		--target "with slots" "http://127.0.0.1:$SLOTS_PORT/run" "$body" "${linger[@]}" "${nolinger[@]}" \
		--target "no cgroups" "http://127.0.0.1:$BASE_PORT/run" "$body"
	local pid rc=0
	pid="$(cat "$WORK/client.pid")"
	wait "$pid" || rc=$?
	rm -f "$WORK/client.pid"
	cat "$WORK/client.log"
	cp "$WORK/client.log" "$WORK/bench-runtime.txt"
	local label metrics
	for label in "with slots:$SLOTS_METRICS" "slots, linger:${LINGER_METRICS:-}" "slots, no linger:${NOLINGER_METRICS:-}"; do
		metrics="${label##*:}"
		[ -n "$metrics" ] || continue
		curl -fs "http://127.0.0.1:$metrics/metrics" | awk -v l="${label%:*}" '/^cpuslot_slot_acquire_seconds_total/ {a = $2} /^cpuslot_slot_release_seconds_total/ {r = $2}
			/event="acquire.calls"/ {n = $2} /event="linger.reused"/ {u = $2} /event="local.hit"/ {h = $2} /^cpuslot_slot_throttled_seconds_total/ {t += $2}
			END { if (n > 0) printf "%s, inside the runtime: acquire %.1f us, release %.1f us per invocation (mean of %d; %d reused a lingering lease, %d local hits); throttled %.3f s in total\n", l, a / n * 1e6, r / n * 1e6, n, u, h, t }'
	done
	curl -fs "http://127.0.0.1:$AGENT_HTTP/metrics" 2>/dev/null | awk '/^cpuslot_acquire_duration_seconds_count/ {n += $2} END { if (n > 0) printf "agent: %d ACQUIREs in total\n", n }' || true
	info "saved: $WORK/bench-runtime.txt"
	[ "$rc" = 0 ] || die "the benchmark client failed ($rc)"
}

bench_main "$@"
