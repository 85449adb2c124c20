#!/usr/bin/env bash
# Prepares what test/vm needs to boot a real cgroup v2 kernel under qemu:
#   - qemu-system-x86 installed into the system (apt),
#   - a Debian kernel image and a static busybox, downloaded with
#     `apt-get download` and unpacked into a cache dir, NOT installed.
#
# Idempotent: work already done is skipped. Run as root on Debian 12.
#
# Cache dir: $CPUSLOT_VM_CACHE, default <repo>/.cache/vm (gitignored).
# Results (stable names, what test/vm looks for):
#   $CACHE/vmlinuz   the kernel (bzImage)
#   $CACHE/vmlinux   the same kernel uncompressed (ELF, PVH entry point): qemu
#                    boots it directly, skipping the bzImage's self-
#                    decompression, which takes ~3 s under emulation
#   $CACHE/busybox   a statically linked busybox
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${CPUSLOT_VM_CACHE:-$repo/.cache/vm}"
mkdir -p "$cache/debs"
cache="$(cd "$cache" && pwd)"

log() { echo "vm-deps: $*" >&2; }

sudo_cmd=()
if [ "$(id -u)" != 0 ]; then
	sudo_cmd=(sudo)
fi

# apt-get update at most once per run, and only when something is missing
# from the package lists (a fresh machine has empty lists).
updated=0
apt_update_once() {
	if [ "$updated" = 0 ]; then
		log "apt-get update"
		"${sudo_cmd[@]}" apt-get update -qq
		updated=1
	fi
}
known() { apt-cache show "$1" >/dev/null 2>&1; }
ensure_known() {
	known "$1" || apt_update_once
	known "$1" || { log "package $1 not found in apt sources"; exit 1; }
}

# 1. qemu, installed into the system.
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
	ensure_known qemu-system-x86
	log "installing qemu-system-x86"
	install_qemu() {
		"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends qemu-system-x86
	}
	if ! install_qemu; then
		[ "$updated" = 0 ] || exit 1
		apt_update_once
		install_qemu
	fi
fi

# download PKG: fetch PKG's .deb into $cache/debs (once) and set $deb to its
# path. (Not used as $(download ...): a subshell would forget apt_update_once.)
download() {
	local pkg="$1"
	deb="$(ls "$cache/debs/${pkg}"_*.deb 2>/dev/null | head -n1 || true)"
	if [ -z "$deb" ]; then
		ensure_known "$pkg"
		log "downloading $pkg"
		# apt's sandbox user may not be able to write into the cache;
		# download into a private temp dir it can use, then move.
		local tmp
		tmp="$(mktemp -d)"
		chmod 0777 "$tmp"
		# Stale package lists name versions the mirror no longer has:
		# refresh them once and retry.
		if ! (cd "$tmp" && apt-get download -qq "$pkg"); then
			[ "$updated" = 0 ] || exit 1
			apt_update_once
			(cd "$tmp" && apt-get download -qq "$pkg")
		fi
		mv "$tmp"/"${pkg}"_*.deb "$cache/debs/"
		rm -rf "$tmp"
		deb="$(ls "$cache/debs/${pkg}"_*.deb | head -n1)"
	fi
}

# 2. The kernel. linux-image-amd64 is a metapackage; the image is its
#    linux-image-6.1*-amd64 dependency (e.g. linux-image-6.1.0-56-amd64).
if [ ! -s "$cache/vmlinuz" ]; then
	ensure_known linux-image-amd64
	kpkg="$(apt-cache depends linux-image-amd64 |
		awk '/Depends: linux-image-[0-9].*-amd64/ {print $2; exit}')"
	if [ -z "$kpkg" ]; then
		log "cannot find the kernel image dependency of linux-image-amd64"
		exit 1
	fi
	download "$kpkg"
	log "extracting vmlinuz from $(basename "$deb")"
	dir="$cache/kernel"
	rm -rf "$dir"
	mkdir -p "$dir"
	dpkg-deb -x "$deb" "$dir"
	vmlinuz="$(ls "$dir"/boot/vmlinuz-* | head -n1)"
	cp "$vmlinuz" "$cache/vmlinuz.tmp"
	mv "$cache/vmlinuz.tmp" "$cache/vmlinuz"
	basename "$vmlinuz" >"$cache/kernel-version"
	rm -f "$cache/vmlinux" # derived from the old vmlinuz
	# Everything the tests need is built in (cgroup2, serial console,
	# devtmpfs, gzip initramfs): the ~400 MB of modules are not used.
	rm -rf "$dir"
fi

# 2b. The uncompressed kernel. Debian compresses it with xz; the ELF inside
#     the bzImage starts at the first xz stream (what the kernel's
#     scripts/extract-vmlinux does). Optional: test/vm falls back to vmlinuz.
if [ ! -s "$cache/vmlinux" ]; then
	if ! command -v xz >/dev/null 2>&1; then
		ensure_known xz-utils
		"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends xz-utils
	fi
	off="$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$cache/vmlinuz" | head -n1 | cut -d: -f1 || true)"
	if [ -n "$off" ] &&
		# No pipefail here: tail dies of SIGPIPE when xz stops at the end of
		# the stream; xz's status is what counts.
		(set +o pipefail; tail -c +"$((off + 1))" "$cache/vmlinuz" |
			xz -dc --single-stream >"$cache/vmlinux.tmp" 2>/dev/null) &&
		[ "$(head -c 4 "$cache/vmlinux.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
		mv "$cache/vmlinux.tmp" "$cache/vmlinux"
	else
		rm -f "$cache/vmlinux.tmp"
		log "warning: could not extract vmlinux from vmlinuz; boots will be ~3 s slower"
	fi
fi

# 3. A static busybox for the initramfs.
if [ ! -x "$cache/busybox" ]; then
	download busybox-static
	log "extracting busybox from $(basename "$deb")"
	dir="$cache/busybox-static"
	rm -rf "$dir"
	mkdir -p "$dir"
	dpkg-deb -x "$deb" "$dir"
	cp "$dir/bin/busybox" "$cache/busybox.tmp"
	chmod 0755 "$cache/busybox.tmp"
	mv "$cache/busybox.tmp" "$cache/busybox"
	rm -rf "$dir"
fi

kernel="$cache/vmlinuz"
[ -s "$cache/vmlinux" ] && kernel="$cache/vmlinux"
log "ready: $kernel ($(cat "$cache/kernel-version" 2>/dev/null || echo '?')), $cache/busybox, $(command -v qemu-system-x86_64)"
