#!/usr/bin/env bash
# make dashboard-shots: the dashboard screenshots of docs/img/ from live data on this
# machine (root, cgroup v1 or v2), without a cluster:
#  1. the node agent standalone and the Java runtime in a cgroup of their own, as make demo
#     starts them (hack/demo.sh's functions; the agent with a CPU budget per container);
#  2. Debian's Prometheus with the shipped file_sd configuration (deploy/prometheus/, 2 s
#     intervals), its targets files written here with the labels a cluster's would have;
#  3. sample functions invoked without pause (Hydra, 200m to 1 core), CPUSLOT_SHOTS_LOAD
#     seconds (default 240) before and during the pictures; among them a chain (ChainBench
#     calling fib through the local bus), whose caller's lease sleeps and lends half its
#     quota meanwhile (agent -lend-ratio 0.5: the Lending row);
#  4. tools/dashboards/view/shots.mjs draws both Perses dashboards against that Prometheus in
#     headless Chromium: docs/img/dashboard-{node,runtime}.png (SHOTS_OUT=<dir> elsewhere);
#     it fails on a panel with an error, or without data where queries.txt expects some;
#  5. removes everything it made (also on Ctrl-C).
# With PROMETHEUS=<url> make dashboard-shots draws against that Prometheus instead.
set -euo pipefail

export DEMO_CG=/cpuslot-shots
export CPUSLOT_DEMO_WORK="${CPUSLOT_DEMO_WORK:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.cache/dashboard-shots}"
# shellcheck source=hack/demo.sh
source "$(dirname "${BASH_SOURCE[0]}")/demo.sh"

OUT="${SHOTS_OUT:-$REPO/docs/img}"
LOAD_SECONDS="${CPUSLOT_SHOTS_LOAD:-240}"
# Prometheus's scrape and evaluation interval; the page's datasource is told it
INTERVAL=2s

start_prometheus() {
	local dir="$WORK/prometheus" port node
	mkdir -p "$dir/cpuslot-targets" "$dir/data"
	sed -E "s/^( *)(scrape_interval|evaluation_interval): .*/\\1\\2: $INTERVAL/" \
		"$REPO/deploy/prometheus/prometheus-file-sd.yml" >"$dir/prometheus.yml"
	cp "$REPO/deploy/prometheus/cpuslot-rules.yml" "$dir/"
	node="$(hostname)"
	printf '[{"targets": ["127.0.0.1:%s"], "labels": {"namespace": "cpuslot-system", "pod": "cpuslot-node-agent-local", "node": "%s"}}]\n' \
		"$AGENT_HTTP" "$node" >"$dir/cpuslot-targets/node-agent.json"
	printf '[{"targets": ["127.0.0.1:%s"], "labels": {"namespace": "demo", "pod": "runtime-local", "node": "%s"}}]\n' \
		"$RT_METRICS" "$node" >"$dir/cpuslot-targets/runtime.json"
	port="$(free_port 19390)"
	PROM_URL="http://127.0.0.1:$port"
	prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
		--web.listen-address="127.0.0.1:$port" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
	echo $! >"$WORK/prometheus.pid"
	wait_http "$PROM_URL/-/ready" "prometheus" "$WORK/prometheus.pid"
}

# load: invokes the sample functions in turn until killed
load() {
	local f
	while :; do
		for f in hello:'{}' fib:'{"n": 27}' burn20:'{"ms": 50}' burn50:'{"ms": 30}' hello-noslot:'{}' \
			chain:'{"mode": "local", "callee": "fib", "n": 2}'; do
			invoke "$RT_PORT" "${f%%:*}" "${f#*:}" "$WORK/load" >/dev/null 2>&1 || true
		done
	done
}

shots_main() {
	[ "$(id -u)" = 0 ] || die "run as root (it creates cgroups): sudo make dashboard-shots"
	command -v prometheus >/dev/null || apt_install prometheus
	mkdir -p "$WORK"
	detect_cgroups
	trap 'cleanup; exit 130' INT TERM
	trap cleanup EXIT
	cleanup
	ensure_tools
	say "Building the node agent (and the runtime when it is not built)"
	(cd "$REPO" && CGO_ENABLED=0 "$GO" build -o bin/node-agent ./cmd/node-agent)
	[ -f "$RUNTIME_JAR" ] && [ -f "$SAMPLES_JAR" ] || build_all
	bash "$REPO/hack/dashboard-view.sh"

	# someone measuring on this machine (hack/demo.sh's convention): let them finish first
	while [ -n "$QUIET" ] && [ -e "$QUIET" ]; do info "$QUIET exists: someone is measuring; waiting"; sleep 10; done

	say "Starting the node agent, the runtime and Prometheus"
	cg_create "$DEMO_CG"
	AGENT_SOCK="$WORK/agent.sock"
	AGENT_HTTP="$(free_port 19464)"
	cg_create "$DEMO_CG/agent"
	# --budget: every served container gets a CPU budget, as a pod's CPU limit gives one;
	# --lend-ratio: a chain's caller lends half its quota while it waits (the Lending row)
	start_in_cgroup agent "$DEMO_CG/agent" "$REPO/bin/node-agent" run --socket "$AGENT_SOCK" \
		--serve-under "$DEMO_CG" --http "127.0.0.1:$AGENT_HTTP" --prewarm "200m=2,500m=2,1=1" --budget 2 \
		--lend-ratio 0.5
	wait_http "http://127.0.0.1:$AGENT_HTTP/readyz" "the node agent" "$WORK/agent.pid"
	start_runtime rt "$DEMO_CG/runtime" CPUSLOT_SOCKET="$AGENT_SOCK"
	register "$RT_PORT" hello HelloWorld 200m
	register "$RT_PORT" fib Fibonacci 500m
	register "$RT_PORT" burn20 CpuBurn 200m
	register "$RT_PORT" burn50 CpuBurn 500m
	register "$RT_PORT" hello-noslot HelloWorld
	register "$RT_PORT" chain ChainBench 500m
	start_prometheus
	info "agent metrics :$AGENT_HTTP, runtime :$RT_PORT (metrics :$RT_METRICS), Prometheus $PROM_URL"

	say "Invoking for $LOAD_SECONDS s, then drawing the dashboards"
	# two at a time: leases overlap, as on a busy node
	load &
	echo $! >"$WORK/load1.pid"
	load &
	echo $! >"$WORK/load2.pid"
	sleep "$LOAD_SECONDS"
	# the time range: the load's (the first minute of a rate is empty);
	# no OpenWhisk controller here to look annotations up in
	(cd "$REPO/tools/dashboards/view" && node shots.mjs --prometheus "$PROM_URL" --out "$OUT" \
		--scrape-interval "$INTERVAL" --start "$(((LOAD_SECONDS + 59) / 60))m" --timeout 240 --allow-empty "OpenWhisk annotation lookups")
}

shots_main "$@"
