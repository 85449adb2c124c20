#!/usr/bin/env bash
# make e2e: both node kinds at once.
#   - the legacy node's packages (e2e, e2e/cluster, ...) on this machine,
#     one at a time (each brings its cluster up; e2e/cluster also serialises
#     clusters with a lock);
#   - the current node's (e2e/v2node) in the VM, beside them: an emulated
#     node is CPU-bound for half an hour, the legacy packages wait on the
#     cluster much of theirs, so together they take little more than the
#     VM alone. Its lines are prefixed "[v2node] ".
# The quota checks hold under this: a slot's lower bound needs a quarter of
# one CPU (retried, and on the emulated node checked only when the node let
# the slot run).
# The runtime's images (make images-runtime: minutes of Maven, jlink and
# an AOT training run) build while the v2 node comes up, which needs only
# the Go-built images; its JavaRuntimePods waits for the runtime-java
# tarball. The legacy node's packages start when they are built (their
# clusters import every image at their start).
# Exit status: failed if either failed; both always run to their end.
#
# Environment: GOTESTSUM (the Makefile's), MAKE, E2E_TIMEOUT (go test -timeout).
set -uo pipefail
cd "$(dirname "$0")/../e2e"
gotestsum="${GOTESTSUM:-go run gotest.tools/gotestsum@v1.13.0}"
timeout="${E2E_TIMEOUT:-70m}"
export CPUSLOT_E2E=1

legacy=()
while read -r pkg; do
	case "$pkg" in */v2node) ;; *) legacy+=("$pkg") ;; esac
done < <(go list ./...)

start=$SECONDS
# No tarball of an earlier build stands in for the one being built.
rm -f ../bin/cpuslot-runtime.tar ../bin/cpuslot-runtime-java.tar
# Each side in a process group of its own (set -m), waited for with wait
# (which a trap interrupts), so that a stop of make (SIGINT, SIGTERM)
# reaches both go tests and the VM.
set -m
# shellcheck disable=SC2086 # gotestsum may be a command with arguments
(
	$gotestsum --format standard-verbose -- ./v2node -count=1 -timeout "$timeout" 2>&1 |
		sed -u 's/^/[v2node] /'
	rc=${PIPESTATUS[0]}
	echo "[v2node] e2e/v2node: exit $rc after $((SECONDS - start)) s"
	exit "$rc"
) &
v2=$!
"${MAKE:-make}" -C .. --no-print-directory images-runtime &
images=$!
trap 'kill -TERM -- -"$v2" -"$images" 2>/dev/null; exit 130' INT TERM
if ! wait "$images"; then
	echo "e2e: make images-runtime failed after $((SECONDS - start)) s; stopping e2e/v2node"
	kill -TERM -- -"$v2" 2>/dev/null
	wait "$v2"
	exit 1
fi
echo "e2e: the runtime's images built $((SECONDS - start)) s after the start, beside the v2 node"
# shellcheck disable=SC2086
$gotestsum --format standard-verbose -- "${legacy[@]}" -count=1 -timeout "$timeout" -p 1 &
legacy=$!
set +m
trap 'kill -TERM -- -"$v2" -"$legacy" 2>/dev/null; exit 130' INT TERM

wait "$legacy"
legacy_rc=$?
echo "e2e: the legacy node's packages: exit $legacy_rc after $((SECONDS - start)) s; waiting for e2e/v2node"
wait "$v2"
v2_rc=$?
echo "e2e: legacy node exit $legacy_rc, v2 node exit $v2_rc; $((SECONDS - start)) s in all"
[ "$legacy_rc" = 0 ] && [ "$v2_rc" = 0 ]
