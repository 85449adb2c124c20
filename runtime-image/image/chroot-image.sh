#!/usr/bin/env bash
# The runtime image's root file system started as a container starts it: under chroot as nobody
# (65534:65534), with a container's clean environment, an empty /tmp, /proc and the four harmless
# devices a container has (GraalPy seeds its random module from /dev/urandom). Written once for
# every user: image/train-aot.sh and hack/bench-image-init.sh source it for its functions, the
# integration tests' RuntimeImageIT runs it. Root only (chroot, mount, mknod).
#
#   chroot-image.sh enter ROOT     /proc, /dev with its devices and an empty /tmp in ROOT, proc mounted
#   chroot-image.sh run ROOT CMD...
#                                  becomes CMD in ROOT as nobody (the same process): PATH, JAVA_HOME
#                                  and the caller's PORT and CPUSLOT_* variables, nothing else
#   chroot-image.sh leave ROOT     proc unmounted, what enter made removed, /tmp emptied
#
# enter lists what it made in ROOT.made (beside ROOT, not in it), so that leave leaves ROOT as
# enter found it: train-aot.sh runs in the image's staged root.

# chroot_enter ROOT
chroot_enter() {
	local root=$1 made=$1.made d n name type major minor
	: >"$made"
	for d in proc dev tmp; do
		[ -e "$root/$d" ] || { mkdir "$root/$d"; echo "$d" >>"$made"; }
	done
	chmod 1777 "$root/tmp"
	for n in "null c 1 3" "zero c 1 5" "random c 1 8" "urandom c 1 9"; do
		read -r name type major minor <<<"$n"
		[ -e "$root/dev/$name" ] || { mknod -m 666 "$root/dev/$name" "$type" "$major" "$minor"; echo "dev/$name" >>"$made"; }
	done
	chroot_empty_tmp "$root"
	mount -t proc proc "$root/proc"
}

# chroot_leave ROOT: stops at an unmount that fails, before removing anything (never a mounted /proc)
chroot_leave() {
	local root=$1 made=$1.made p
	if mountpoint -q "$root/proc"; then umount "$root/proc" || return; fi
	chroot_empty_tmp "$root"
	if [ -f "$made" ]; then
		while read -r p; do [ -n "$p" ] && rm -rf "${root:?}/$p"; done <"$made"
		rm -f "$made"
	fi
}

chroot_empty_tmp() { rm -rf "${1:?}"/tmp/* "${1:?}"/tmp/.[!.]* 2>/dev/null || true; }

# chroot_run ROOT [NAME=VALUE]... -- CMD...: execs CMD with only these variables, PATH and JAVA_HOME
chroot_run() {
	local root=$1 vars=(PATH=/usr/bin:/bin JAVA_HOME=/opt/java)
	shift
	while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
	[ "${1:-}" = -- ] && shift
	[ $# -gt 0 ] || { echo "chroot-image: no command" >&2; return 2; }
	exec env -i "${vars[@]}" "$(command -v chroot)" --userspec=65534:65534 "$root" "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -euo pipefail
	usage="usage: chroot-image.sh enter|leave ROOT, or run ROOT CMD..."
	what=${1:?$usage}
	root=$(realpath "${2:?$usage}")
	shift 2
	[ "$(id -u)" = 0 ] || { echo "chroot-image: needs root (chroot, mount, mknod)" >&2; exit 1; }
	case $what in
	enter) chroot_enter "$root" ;;
	leave) chroot_leave "$root" ;;
	run)
		pass=()
		for v in $(compgen -e); do
			case $v in PORT | CPUSLOT_*) pass+=("$v=${!v}") ;; esac
		done
		chroot_run "$root" "${pass[@]}" -- "$@"
		;;
	*) echo "$usage" >&2; exit 2 ;;
	esac
fi
