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
#   $CACHE/modules/  the kernel modules for 9p shares (9p over virtio-pci)
#                    and their dependencies, as NAME.ko, with "order" (the
#                    names in load order) and "kernel-version"
#   $CACHE/node-modules/  the same for test/vm's systemd boot (System): 9p,
#                    overlay, autofs4, virtio_net, veth
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

ensure_xz() {
	if ! command -v xz >/dev/null 2>&1; then
		ensure_known xz-utils
		"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends xz-utils
	fi
}

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

# 2. The kernel, and the few modules that read-only 9p shares need
#    (test/vm Options.Shares). linux-image-amd64 is a metapackage; the image
#    is its linux-image-6.1*-amd64 dependency (e.g.
#    linux-image-6.1.0-56-amd64). Everything else the tests need is built in
#    (cgroup2, serial console, devtmpfs, gzip initramfs): of the package's
#    ~400 MB of modules only the 9p/virtio ones are kept.
#
# Modules the shares need; their dependencies are added from the modules'
# own "depends=" (the package has no modules.dep: depmod makes it at install).
#
# Two sets, each with its dependencies in a directory of its own:
#   modules/       what test/vm's shares need;
#   node-modules/  what test/vm's systemd boot (System) needs: the 9p root,
#                  overlayfs (the writable root, containerd's snapshotter),
#                  autofs4 (systemd), virtio_net (qemu user networking),
#                  veth (the pods' network).
module_sets=(
	"modules:virtio_pci 9pnet_virtio 9p"
	"node-modules:virtio_pci 9pnet_virtio 9p overlay autofs4 virtio_net veth"
)
modules_current() {
	local m
	[ -s "$modules_dir/order" ] && [ -s "$cache/kernel-version" ] &&
		cmp -s "$cache/kernel-version" "$modules_dir/kernel-version" || return 1
	for m in "${share_modules[@]}"; do
		grep -qx "${m//-/_}" "$modules_dir/order" || return 1
	done
}
for set in "${module_sets[@]}"; do
modules_dir="$cache/${set%%:*}"
read -r -a share_modules <<<"${set#*:}"
if [ ! -s "$cache/vmlinuz" ] || ! modules_current; then
	kpkg=""
	if [ -s "$cache/vmlinuz" ] && [ -s "$cache/kernel-version" ]; then
		# Modules for the kernel already here: same package, if still to be had.
		kpkg="linux-image-$(sed 's/^vmlinuz-//' "$cache/kernel-version")"
		if ! ls "$cache/debs/${kpkg}"_*.deb >/dev/null 2>&1 && ! known "$kpkg"; then
			apt_update_once
			known "$kpkg" || kpkg=""
		fi
		# Otherwise take the current kernel and replace the old one.
		[ -n "$kpkg" ] || rm -f "$cache/vmlinuz"
	fi
	if [ -z "$kpkg" ]; then
		ensure_known linux-image-amd64
		kpkg="$(apt-cache depends linux-image-amd64 |
			awk '/Depends: linux-image-[0-9].*-amd64/ {print $2; exit}')"
		if [ -z "$kpkg" ]; then
			log "cannot find the kernel image dependency of linux-image-amd64"
			exit 1
		fi
	fi
	download "$kpkg"
	log "extracting $(basename "$deb")"
	dir="$cache/kernel"
	rm -rf "$dir"
	mkdir -p "$dir"
	dpkg-deb -x "$deb" "$dir"
	vmlinuz="$(ls "$dir"/boot/vmlinuz-* | head -n1)"
	if [ ! -s "$cache/vmlinuz" ]; then
		cp "$vmlinuz" "$cache/vmlinuz.tmp"
		mv "$cache/vmlinuz.tmp" "$cache/vmlinuz"
		basename "$vmlinuz" >"$cache/kernel-version"
		rm -f "$cache/vmlinux" # derived from the old vmlinuz
	fi

	kver="$(basename "$vmlinuz")"
	kver="${kver#vmlinuz-}"
	moddir="$dir/lib/modules/$kver"
	# name -> file, names with "-" folded to "_" as the kernel does.
	declare -A modfile=() builtin=() seen=()
	while IFS= read -r -d '' f; do
		n="$(basename "$f")"
		n="${n%%.ko*}"
		modfile[${n//-/_}]="$f"
	done < <(find "$moddir/kernel" \( -name '*.ko' -o -name '*.ko.xz' \) -print0)
	if [ -f "$moddir/modules.builtin" ]; then
		while read -r f; do
			n="$(basename "$f" .ko)"
			builtin[${n//-/_}]=1
		done <"$moddir/modules.builtin"
	fi
	# Uncompressed module contents (busybox insmod loads plain ELF only).
	modcat() {
		case "$1" in
		*.xz) ensure_xz && xz -dc "$1" ;;
		*) cat "$1" ;;
		esac
	}
	# visit NAME: append NAME's dependencies, then NAME, to $order.
	order=()
	visit() {
		local n="${1//-/_}" f deps d
		[ -z "${seen[$n]:-}" ] || return 0
		seen[$n]=1
		[ -z "${builtin[$n]:-}" ] || return 0
		f="${modfile[$n]:-}"
		if [ -z "$f" ]; then
			log "kernel $kver has no module $n"
			exit 1
		fi
		deps="$(modcat "$f" | tr '\0' '\n' | sed -n 's/^depends=//p')"
		for d in ${deps//,/ }; do
			visit "$d"
		done
		order+=("$n")
	}
	for m in "${share_modules[@]}"; do
		visit "$m"
	done
	rm -rf "$modules_dir.tmp"
	mkdir -p "$modules_dir.tmp"
	for n in "${order[@]}"; do
		modcat "${modfile[$n]}" >"$modules_dir.tmp/$n.ko"
		echo "$n" >>"$modules_dir.tmp/order"
	done
	echo "vmlinuz-$kver" >"$modules_dir.tmp/kernel-version"
	rm -rf "$modules_dir"
	mv "$modules_dir.tmp" "$modules_dir"
	log "kept modules ${share_modules[*]} with their dependencies: ${order[*]} ($(du -sh "$modules_dir" | cut -f1))"
	rm -rf "$dir"
fi
done

# 2b. The uncompressed kernel. Debian compresses it with xz; the ELF inside
#     the bzImage starts at the first xz stream (what the kernel's
#     scripts/extract-vmlinux does). Optional: test/vm falls back to vmlinuz.
if [ ! -s "$cache/vmlinux" ]; then
	ensure_xz
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
log "ready: $kernel ($(cat "$cache/kernel-version" 2>/dev/null || echo '?')), $cache/busybox, $cache/modules, $cache/node-modules, $(command -v qemu-system-x86_64)"
