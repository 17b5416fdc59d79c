#!/usr/bin/env bash
# setup.sh — prepare the machine-crash harness's VM: Debian 12's kernel
# (fetched and cached by ../kernel/setup.sh, never installed) and a
# busybox initramfs with virtio (net, block) and ext4, and /init
# (init.sh). The shoal binary is not in it: the test appends it as a
# second cpio archive, so a rebuilt binary needs no new initramfs.
#
# Output (stdout, for the Go driver): KVER=, KERNEL=, INITRD=.
# Environment: SHOAL_KERNEL_CACHE, SHOAL_KERNEL_VERSION (see ../kernel).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${SHOAL_KERNEL_CACHE:-/var/cache/shoal-kernel}
log() { echo "crash-setup: $*" >&2; }

command -v mkfs.ext4 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q e2fsprogs >&2

out=$("$here/../kernel/setup.sh" 6.1)
kver=$(sed -n 's/^KVER=//p' <<<"$out")
kernel=$(sed -n 's/^KERNEL=//p' <<<"$out")
[ -n "$kver" ] && [ -n "$kernel" ] || { log "kernel setup printed no KVER/KERNEL"; exit 1; }
work=$cache/$kver
tree=$work/tree

exec 9>"$cache/.setup.lock"
flock 9

hash=$( (cat "$here/setup.sh" "$here/init.sh"; echo "$kver") | sha256sum | cut -c1-16)
initrd=$work/crash-initramfs-$hash.gz
if [ ! -f "$initrd" ]; then
	log "building $initrd"
	root=$(mktemp -d "$work/crashroot.XXXXXX")
	trap 'rm -rf "$root"' EXIT
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,disk,root,lib/modules/$kver}
	cp /bin/busybox "$root/bin/busybox"
	ln -s busybox "$root/bin/sh"
	: >"$root/modules.order"
	for m in virtio_pci virtio_net virtio_blk crc32c_generic ext4; do
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
	cp "$here/init.sh" "$root/init"
	chmod 755 "$root/init"
	echo "$kver" >"$root/kver"
	(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) |
		gzip -6 >"$initrd.tmp"
	mv "$initrd.tmp" "$initrd"
	ls -1t "$work"/crash-initramfs-*.gz | tail -n +3 | xargs -r rm -f
fi

echo "KVER=$kver"
echo "KERNEL=$kernel"
echo "INITRD=$initrd"
