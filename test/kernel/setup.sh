#!/usr/bin/env bash
# setup.sh — prepare everything the kernel-client harness boots in qemu:
# a Debian kernel (unpacked, never installed), a busybox initramfs with
# the virtio-net + NFS module closure, the static mountnfs/locktest/odirect
# helpers, setfattr/getfattr (c/fattr.c), copy (c/copy.c), /init (init.sh) and the workloads (workload.sh, failover.sh).
#
#   setup.sh [6.1|newest]
#
# 6.1 (the default) is Debian 12's kernel: the linux-image-6.1.*-amd64
# package that linux-image-amd64 depends on in the machine's own apt lists.
# newest is the newest kernel Debian ships: what linux-image-amd64 depends
# on in the unstable suite (sid). Its package lists come from a private apt
# configuration under the cache dir (apt-sid/: its own sources.list, lists
# and package cache); the machine's /etc/apt is only read, never changed.
# If that fetch fails, setup fails: a run that asked for the newest kernel
# must not quietly test another one.
#
# Idempotent: each kernel is downloaded and unpacked once per version, into
# CACHE/VERSION; the initramfs is rebuilt only when one of its inputs in
# this directory changed. Built artifacts live in the cache dir, never in
# the repository.
#
# Output (stdout, one per line, for the Go driver):
#   KVER=6.1.0-NN-amd64
#   KERNEL=/var/cache/shoal-kernel/6.1.0-NN-amd64/vmlinuz
#   INITRD=/var/cache/shoal-kernel/6.1.0-NN-amd64/initramfs-<hash>.gz
#
# Environment: SHOAL_KERNEL_CACHE (default /var/cache/shoal-kernel),
# SHOAL_KERNEL_VERSION (6.1 only, e.g. 6.1.0-56-amd64; default: what
# linux-image-amd64 depends on), SHOAL_KERNEL_NEWEST_VERSION (newest only,
# e.g. 7.2.13+deb14-amd64: use this version, from the cache if it is
# there, instead of asking the unstable suite).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${SHOAL_KERNEL_CACHE:-/var/cache/shoal-kernel}
log() { echo "setup: $*" >&2; }

# Host tools. apt-get only runs when something is missing.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v tshark >/dev/null || need+=(tshark)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v depmod >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	# tshark asks whether non-root users may capture; answer no, quietly.
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2 ||
		{ apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2; }
fi

which=${1:-6.1}

# One setup at a time per cache: runs from several checkouts on one machine
# share it (the apt lists, the unpacked trees, the initramfs images).
mkdir -p "$cache"
exec 9>"$cache/.setup.lock"
flock 9

# sid_apt runs an apt command against Debian unstable only, through a
# private configuration: its own sources.list, package lists and package
# cache under $cache/apt-sid. The machine's sources and lists are not
# touched. The rest of the machine's apt configuration (apt.conf.d, for
# example a proxy) still applies.
sid_apt() {
	local a=$cache/apt-sid
	mkdir -p "$a/lists/partial" "$a/cache/archives/partial"
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" >"$a/sources.list"
	cat >"$a/apt.conf" <<-EOF
		Dir::Etc::SourceList "$a/sources.list";
		Dir::Etc::SourceParts "/dev/null";
		Dir::State::Lists "$a/lists";
		Dir::Cache "$a/cache";
		Acquire::Languages "none";
		APT::Sandbox::User "root";
	EOF
	APT_CONFIG=$a/apt.conf "$@"
}

# image_dep APT... prints the versioned kernel that linux-image-amd64
# depends on (linux-image-VERSION-amd64 -> VERSION-amd64), as APT sees it.
image_dep() {
	"$@" apt-cache depends linux-image-amd64 2>/dev/null |
		sed -n 's/^ *Depends: linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -1
}

case "$which" in
6.1)
	# The 6.1 image that linux-image-amd64 depends on (Debian 12).
	apt=()
	kver=${SHOAL_KERNEL_VERSION:-}
	if [ -z "$kver" ]; then
		kver=$(image_dep | grep -E '^6\.1\.' || true)
		if [ -z "$kver" ]; then
			# Fall back to any cached version so offline reruns still work.
			kver=$(ls -1 "$cache" 2>/dev/null | grep -E '^6\.1\..*-amd64$' | sort -V | tail -1 || true)
		fi
		[ -n "$kver" ] || { log "cannot resolve linux-image-6.1.*-amd64 (apt-get update?)"; exit 1; }
	fi
	;;
newest)
	# The kernel of Debian's unstable suite. No fallback to a cached
	# version: the run asked for the newest, so a failed look-up fails.
	apt=(sid_apt)
	kver=${SHOAL_KERNEL_NEWEST_VERSION:-}
	if [ -z "$kver" ] || [ ! -f "$cache/$kver/tree/.done" ]; then
		log "updating the private package lists of Debian unstable ($cache/apt-sid)"
		sid_apt apt-get update -q --error-on=any >&2 || { log "apt-get update of Debian unstable failed"; exit 1; }
	fi
	if [ -z "$kver" ]; then
		kver=$(image_dep sid_apt)
		[ -n "$kver" ] || { log "cannot resolve the kernel linux-image-amd64 depends on in Debian unstable"; exit 1; }
	fi
	;;
*)
	log "unknown kernel '$which': want 6.1 or newest"
	exit 2
	;;
esac
work=$cache/$kver
tree=$work/tree
mkdir -p "$work"

if [ ! -f "$tree/.done" ]; then
	rm -rf "$tree" "$work/deb"
	mkdir -p "$work/deb"
	# Debian 12 ships the kernel and its modules in linux-image-VERSION.
	# Newer Debian makes that a meta package over linux-binary-VERSION
	# (vmlinuz), linux-modules-VERSION and linux-base-VERSION
	# (modules.order, modules.builtin*, System.map); fetch whichever of
	# those exist.
	pkgs=("linux-image-$kver")
	for p in $("${apt[@]}" apt-cache depends "linux-image-$kver" 2>/dev/null |
		sed -n "s/^ *Depends: \(linux-\(binary\|modules\|base\)-$kver\)\$/\1/p" | sort -u); do
		pkgs+=("$p")
	done
	log "fetching ${pkgs[*]}"
	(cd "$work/deb" && "${apt[@]}" apt-get download "${pkgs[@]}" >&2)
	for deb in "$work"/deb/*.deb; do
		dpkg -x "$deb" "$tree"
	done
	# Merged /usr: the packages put everything under usr/lib/modules.
	# depmod -b and modprobe -d look in lib/modules.
	if [ ! -e "$tree/lib" ] && [ -d "$tree/usr/lib/modules/$kver" ]; then
		ln -s usr/lib "$tree/lib"
	fi
	depmod -b "$tree" "$kver"
	rm -rf "$work/deb"
	touch "$tree/.done"
fi
for v in "$tree/boot/vmlinuz-$kver" "$tree/usr/lib/modules/$kver/vmlinuz"; do
	if [ -f "$v" ]; then
		cp -f "$v" "$work/vmlinuz"
		break
	fi
done
[ -f "$work/vmlinuz" ] || { log "no vmlinuz in $tree"; exit 1; }

# The initramfs is keyed by a hash of its inputs.
hash=$( (cat "$here/setup.sh" "$here/init.sh" "$here/workload.sh" "$here/failover.sh" "$here"/c/*.c; echo "$kver") |
	sha256sum | cut -c1-16)
initrd=$work/initramfs-$hash.gz
if [ ! -f "$initrd" ]; then
	log "building $initrd"
	root=$(mktemp -d "$work/root.XXXXXX")
	trap 'rm -rf "$root"' EXIT
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,mnt,root,lib/modules/$kver}
	cp /bin/busybox "$root/bin/busybox"
	ln -s busybox "$root/bin/sh"
	ln -s ../bin/busybox "$root/sbin/modprobe"

	gcc -static -O2 -Wall -Wextra -o "$root/bin/mountnfs" "$here/c/mountnfs.c"
	gcc -static -O2 -Wall -Wextra -o "$root/bin/locktest" "$here/c/locktest.c"
	gcc -static -O2 -Wall -Wextra -o "$root/bin/odirect" "$here/c/odirect.c"
	gcc -static -O2 -Wall -Wextra -o "$root/bin/sparse" "$here/c/sparse.c"
	gcc -static -O2 -Wall -Wextra -o "$root/bin/fattr" "$here/c/fattr.c"
	gcc -static -O2 -Wall -Wextra -o "$root/bin/copy" "$here/c/copy.c"
	ln -s fattr "$root/bin/setfattr"
	ln -s fattr "$root/bin/getfattr"

	# Module closure in dependency (load) order; duplicates dropped.
	mods="virtio_pci virtio_net nfsv4 nfs_layout_nfsv41_files nfs_layout_flexfiles nfsv3"
	: >"$root/modules.order"
	for m in $mods; do
		modprobe -d "$tree" -S "$kver" --show-depends "$m"
	done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r ko; do
		rel=${ko#"$tree/lib/modules/$kver/"}
		mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
		case "$rel" in
		*.xz) xz -dc "$ko" >"$root/lib/modules/$kver/${rel%.xz}"; rel=${rel%.xz} ;;
		*.zst) zstd -qdc "$ko" >"$root/lib/modules/$kver/${rel%.zst}"; rel=${rel%.zst} ;;
		*) cp "$ko" "$root/lib/modules/$kver/$rel" ;;
		esac
		echo "$rel" >>"$root/modules.order"
	done
	cp "$tree/lib/modules/$kver/modules.builtin" "$root/lib/modules/$kver/" 2>/dev/null || true
	# The modules are decompressed above (busybox's insmod in the guest
	# does not load .ko.xz), so modules.order must name the .ko files.
	[ -f "$tree/lib/modules/$kver/modules.order" ] &&
		sed -E 's/\.ko\.(xz|zst|gz)$/.ko/' "$tree/lib/modules/$kver/modules.order" >"$root/lib/modules/$kver/modules.order"
	[ -f "$tree/lib/modules/$kver/modules.builtin.modinfo" ] &&
		cp "$tree/lib/modules/$kver/modules.builtin.modinfo" "$root/lib/modules/$kver/"
	# A trimmed modules.dep lets the kernel's on-demand modprobe (for
	# example nfs-layouttype4-1) work with busybox as /sbin/modprobe.
	depmod -b "$root" "$kver"

	cp "$here/init.sh" "$root/init"
	cp "$here/workload.sh" "$root/workload.sh"
	cp "$here/failover.sh" "$root/failover.sh"
	chmod 755 "$root/init" "$root/workload.sh" "$root/failover.sh"
	echo "$kver" >"$root/kver"

	(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) |
		gzip -6 >"$initrd.tmp"
	mv "$initrd.tmp" "$initrd"
	# Keep only the newest few images.
	ls -1t "$work"/initramfs-*.gz | tail -n +4 | xargs -r rm -f
fi

echo "KVER=$kver"
echo "KERNEL=$work/vmlinuz"
echo "INITRD=$initrd"
