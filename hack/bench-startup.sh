#!/usr/bin/env bash
# Runtime start-up, two images side by side: the time from starting the
# image's entrypoint to its first HTTP answer, alternating A and B, N pairs;
# prints each pair and the medians with their ratio (B/A).
#
#   hack/bench-startup.sh A.tar B.tar [N]     (OCI image-layout tarballs, e.g.
#                                             bin/cpuslot-runtime-java.tar of
#                                             two builds)
#
# Each image's layers are unpacked into a directory and run there with
# chroot (/proc and /dev bound in), no slot socket, the image's entrypoint
# and environment.
# Root only. Ports 18080-18091 on loopback.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench-startup: must run as root (chroot)" >&2; exit 1; }
n="${3:-10}"
work="$(mktemp -d)"
cleanup() {
	for r in "$work"/a "$work"/b; do
		umount "$r/proc" "$r/dev" 2>/dev/null || true
	done
	# --one-file-system: should a mount stay (a process still in a chroot),
	# never recurse through it into the host's /dev or /proc.
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# unpack TAR DIR: the image's layers in order, and its entrypoint into DIR.entrypoint
unpack() {
	mkdir -p "$2.oci" "$2"
	tar xf "$1" -C "$2.oci"
	python3 - "$2.oci" "$2.layers" "$2.entrypoint" <<'EOF'
import json, sys
oci, layers, entry = sys.argv[1:]
blob = lambda d: f"{oci}/blobs/{d.replace(':', '/')}"
idx = json.load(open(f"{oci}/index.json"))
man = json.load(open(blob(idx["manifests"][0]["digest"])))
while "manifests" in man:  # an image index (tools/ocitar): its first platform's manifest
    man = json.load(open(blob(man["manifests"][0]["digest"])))
cfg = json.load(open(blob(man["config"]["digest"])))["config"]
open(layers, "w").write("\n".join(blob(l["digest"]) for l in man["layers"]) + "\n")
open(entry, "w").write("\0".join(cfg["Entrypoint"] + (cfg.get("Cmd") or [])))
open(entry + ".env", "w").write("\0".join(cfg.get("Env") or []))
EOF
	while read -r l; do tar xf "$l" -C "$2"; done <"$2.layers"
	mkdir -p "$2/proc" "$2/dev"
	mount -t proc proc "$2/proc"
	mount --bind /dev "$2/dev"
}
unpack "$1" "$work/a"
unpack "$2" "$work/b"

# once DIR PORT: seconds to the first HTTP answer
once() {
	local -a cmd envs
	mapfile -d '' -t cmd <"$1.entrypoint"
	mapfile -d '' -t envs <"$1.entrypoint.env"
	local t0 t1
	t0=$(date +%s.%N)
	env -i "${envs[@]}" PORT="$2" CPUSLOT_METRICS_PORT=$(($2 + 1)) chroot "$1" "${cmd[@]}" >/dev/null 2>&1 &
	local pid=$!
	local tries=0
	until curl -s -o /dev/null -m 1 "http://127.0.0.1:$2/" 2>/dev/null; do
		kill -0 "$pid" 2>/dev/null || { echo "bench-startup: $1 exited before answering" >&2; return 1; }
		tries=$((tries + 1))
		[ "$tries" -lt 6000 ] || { echo "bench-startup: $1 did not answer" >&2; kill "$pid"; wait "$pid" 2>/dev/null; return 1; }
		sleep 0.02
	done
	t1=$(date +%s.%N)
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	echo "$t1 - $t0" | bc
}

echo "# load: $(cut -d' ' -f1-3 /proc/loadavg); A=$1 B=$2"
echo "# A_s B_s"
out="$work/pairs"
for _ in $(seq 1 "$n"); do
	a="$(once "$work/a" 18080)"
	b="$(once "$work/b" 18090)"
	echo "$a $b" | tee -a "$out"
done
python3 - "$out" <<'EOF'
import statistics, sys
a, b = zip(*(map(float, l.split()) for l in open(sys.argv[1])))
ma, mb = statistics.median(a), statistics.median(b)
print(f"median A {ma:.3f} s, B {mb:.3f} s, B/A {mb / ma:.2f}x ({len(a)} pairs)")
EOF
