#!/usr/bin/env bash
# diskless.sh: boot Debian diskless nodes (qemu VMs) with / on a Shoal
# cluster. The recipe and the reasons behind it are in docs/diskless.md.
#
#   diskless.sh rootfs [--check]
#       Build a Debian root tree with debootstrap (minbase, systemd-sysv,
#       python3-minimal), trimmed and made fit to be shared by many nodes
#       (empty machine-id, no hostname). Cached: the debootstrap tree is
#       kept under CACHE and reused; the image is rebuilt from it when the
#       customization changes. --check adds test/diskless/boot-check.service,
#       which prints DISKLESS lines on the console and powers the node off.
#       Prints ROOTFS=DIR.
#   diskless.sh initramfs [6.1|newest]
#       Build the initramfs (dist/diskless/init, busybox, a static mount(2)
#       helper, the NIC, NFS, pNFS layout and overlayfs modules) for a
#       Debian kernel fetched by test/kernel/setup.sh (never installed).
#       Prints KVER=, KERNEL=, INITRD=.
#   diskless.sh boot [--kernel 6.1|newest] [--nodes N] [--target T] [--kill-ds S] [--keep DIR]
#                    [--loop SECS [--kill ds|mds] [--down S]]
#       The whole run: rootfs --check, initramfs, a network namespace with a
#       bridge, a Shoal cluster in it (shoal mds + 3 shoal ds, --mirrors 2),
#       shoal cp -a of the root tree to /images/NAME and the symlink
#       /images/current, then N VMs booted at once from it. Prints one
#       NODE line per VM (boot time to the boot check's first line, bytes
#       the bridge delivered to it, its DISKLESS lines) and one SERVER line
#       per server (bytes read and written, READ and LAYOUTGET counts
#       during the boots, from the server's own counters). Exit status 0
#       if every node ran the check to its end. --kill-ds S kill -9s the
#       first data server S seconds after node0 mounted its root.
#       --target picks the server(s) of the root: shoal (the default, the
#       above), serve (one `shoal serve`, no pNFS, the same exports) or
#       ganesha (NFS-Ganesha, VFS backend, serving a cp -a of the tree as
#       /export, started by scripts/ganesha.sh; statistics over a private
#       D-Bus). The baselines boot with shoal.pnfs=prefer: the initramfs
#       stops a boot without a pNFS layout by default. --kill and --kill-ds
#       need --target shoal.
#   diskless.sh boot --loop SECS [--kill ds|mds] [--down S] [--kernel K]
#       Running nodes: each node's boot check runs
#       test/diskless/run-loop.sh for SECS seconds and at least 8 rounds
#       (python3, md5sum and ls -lR from the root, page cache dropped
#       every round) and prints a loop-summary line (iterations, errors,
#       longest gap). --kill ds
#       kill -9s data server ds0 once node0's loop has run 3 rounds and
#       starts it again S seconds later (default 10). --kill mds runs the
#       cluster as docs/availability.md deploys it (3 etcd members, two
#       shoal mds with shoal vip beside each, in namespaces a and b, the
#       data servers and etcd in svc, the nodes on a bridge in lan),
#       mounts the service address, and kill -9s the leading MDS instead
#       (restarted after S seconds, default 1). FAULT lines say what was
#       done and when.
#
# Environment: SHOAL_DISKLESS_CACHE (default /var/cache/shoal-diskless),
# SHOAL_DISKLESS_SUITE (bookworm), SHOAL_DISKLESS_MIRROR
# (http://deb.debian.org/debian), SHOAL_BIN (a prebuilt shoal; default:
# go build ./cmd/shoal), SHOAL_DISKLESS_VM_TIMEOUT (seconds per boot,
# default 600), SHOAL_DISKLESS_MEM (MiB per VM, default 768),
# SHOAL_DISKLESS_CAPTURE=1 (dumpcap of the bridge into capture.pcap), and
# SHOAL_KERNEL_CACHE and friends of test/kernel/setup.sh.
#
# Needs root (debootstrap, network namespaces, tap devices). Every network
# address used is inside the namespace the run creates and deletes.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cache=${SHOAL_DISKLESS_CACHE:-/var/cache/shoal-diskless}
suite=${SHOAL_DISKLESS_SUITE:-bookworm}
mirror=${SHOAL_DISKLESS_MIRROR:-http://deb.debian.org/debian}
pkgs=systemd-sysv,python3-minimal
log() { echo "diskless: $*" >&2; }
die() { log "$*"; exit 1; }

# Addresses inside the run's namespace (bridge br0).
subnet=10.202.0
mds_ip=$subnet.1
ds_ips=("$subnet.11" "$subnet.12" "$subnet.13")

cmd_rootfs() {
	local check=0
	[ "${1:-}" = --check ] && check=1
	command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
	mkdir -p "$cache"
	exec 8>"$cache/.rootfs.lock"
	flock 8
	local key base
	# The cache key covers the suite, the mirror, the packages and the
	# script from the key= line to the trim:end marker below (the debootstrap
	# command and the trimming): change any and the tree is built anew.
	key=$( (echo "$suite $mirror $pkgs"; sed -n '/# trim:begin/,/# trim:end/p' "$0") | sha256sum | cut -c1-12)
	base=$cache/base-$suite-$key
	if [ ! -f "$base.done" ]; then
		rm -rf "$base" "$base.tmp"
		log "debootstrap $suite (minbase + $pkgs) into $base"
		debootstrap --variant=minbase --include="$pkgs" "$suite" "$base.tmp" "$mirror" >&2 ||
			die "debootstrap failed (log: $base.tmp/debootstrap/debootstrap.log)"
		# trim:begin
		# What a shared, read-only root does not need: the downloaded
		# packages, the package lists, documentation and translations.
		rm -rf "$base.tmp"/var/cache/apt/archives/*.deb "$base.tmp"/var/cache/apt/*.bin \
			"$base.tmp"/var/lib/apt/lists/* "$base.tmp"/usr/share/doc/* "$base.tmp"/usr/share/man/* \
			"$base.tmp"/usr/share/info/* "$base.tmp"/usr/share/locale/* "$base.tmp"/var/log/bootstrap.log
		# Each node must get its own machine ID (systemd makes one at boot
		# when the file is empty) and its host name from the kernel
		# command line (ip=), not the build host's.
		: >"$base.tmp/etc/machine-id"
		rm -f "$base.tmp/etc/hostname" "$base.tmp/var/lib/dbus/machine-id"
		# trim:end
		mv "$base.tmp" "$base"
		touch "$base.done"
		# Keep the newest two trees of the suite.
		ls -1dt "$cache/base-$suite-"*.done | tail -n +3 | while read -r d; do rm -rf "${d%.done}" "$d"; done
	fi
	local img=$base
	if [ $check = 1 ]; then
		local ckey
		ckey=$(cat "$here/test/diskless/boot-check.sh" "$here/test/diskless/boot-check.service" "$here/test/diskless/run-loop.sh" | sha256sum | cut -c1-12)
		img=$cache/image-$suite-$key-check-$ckey
		if [ ! -f "$img.done" ]; then
			rm -rf "$img"
			cp -a "$base" "$img.tmp"
			install -m 755 "$here/test/diskless/boot-check.sh" "$img.tmp/usr/local/sbin/boot-check.sh"
			install -m 755 "$here/test/diskless/run-loop.sh" "$img.tmp/usr/local/sbin/run-loop.sh"
			install -m 644 "$here/test/diskless/boot-check.service" "$img.tmp/etc/systemd/system/boot-check.service"
			mkdir -p "$img.tmp/etc/systemd/system/multi-user.target.wants"
			ln -sf /etc/systemd/system/boot-check.service "$img.tmp/etc/systemd/system/multi-user.target.wants/"
			mv "$img.tmp" "$img"
			touch "$img.done"
			# Keep the newest few images.
			ls -1dt "$cache"/image-*-check-*.done | tail -n +4 | while read -r d; do rm -rf "${d%.done}" "$d"; done
		fi
	fi
	echo "ROOTFS=$img"
}

cmd_initramfs() {
	local which=${1:-6.1} out kver tree
	out=$("$here/test/kernel/setup.sh" "$which") || die "test/kernel/setup.sh $which failed"
	kver=$(sed -n 's/^KVER=//p' <<<"$out")
	local kernel
	kernel=$(sed -n 's/^KERNEL=//p' <<<"$out")
	tree=${SHOAL_KERNEL_CACHE:-/var/cache/shoal-kernel}/$kver/tree
	[ -d "$tree/lib/modules/$kver" ] || die "no module tree $tree/lib/modules/$kver"
	local hash work=$cache/$kver
	hash=$( (cat "$0" "$here/dist/diskless/init" "$here/test/kernel/c/mountnfs.c"; echo "$kver") | sha256sum | cut -c1-12)
	mkdir -p "$work"
	local initrd=$work/initramfs-$hash.gz
	if [ ! -f "$initrd" ]; then
		log "building $initrd"
		local root
		root=$(mktemp -d "$work/root.XXXXXX")
		mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,root,lib/modules/$kver}
		cp /bin/busybox "$root/bin/busybox"
		ln -s busybox "$root/bin/sh"
		gcc -static -O2 -Wall -Wextra -o "$root/bin/mountnfs" "$here/test/kernel/c/mountnfs.c"
		# The module closure, in load order. The layout drivers must be
		# in memory before the root is mounted (see dist/diskless/init).
		# autofs4 and binfmt_misc are what systemd wants at once; the
		# shared root carries no kernel modules (docs/diskless.md).
		local mods="virtio_pci virtio_net nfsv4 nfs_layout_nfsv41_files nfs_layout_flexfiles overlay autofs4 binfmt_misc"
		: >"$root/modules.order"
		for m in $mods; do
			modprobe -d "$tree" -S "$kver" --show-depends "$m"
		done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r ko; do
			local rel=${ko#"$tree/lib/modules/$kver/"}
			mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
			case "$rel" in
			*.xz) xz -dc "$ko" >"$root/lib/modules/$kver/${rel%.xz}"; rel=${rel%.xz} ;;
			*.zst) zstd -qdc "$ko" >"$root/lib/modules/$kver/${rel%.zst}"; rel=${rel%.zst} ;;
			*) cp "$ko" "$root/lib/modules/$kver/$rel" ;;
			esac
			echo "$rel" >>"$root/modules.order"
		done
		cp "$here/dist/diskless/init" "$root/init"
		chmod 755 "$root/init"
		echo "$kver" >"$root/kver"
		(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -6 >"$initrd.tmp"
		mv "$initrd.tmp" "$initrd"
		rm -rf "$root"
		ls -1t "$work"/initramfs-*.gz | tail -n +4 | xargs -r rm -f
	fi
	echo "KVER=$kver"
	echo "KERNEL=$kernel"
	echo "INITRD=$initrd"
}

# --- boot ---------------------------------------------------------------

ns= vmns= work= keep= pids=() nss=() servers=()
# cleanup stops what the run started: the servers (their PIDs, as started
# with ip netns exec, which execs them; a server restarted by --kill is in
# $work/restarted.pids) and anything else still running in the run's own
# namespaces (a VM left by an interrupted run), then deletes the
# namespaces. Nothing outside them is touched.
cleanup() {
	local p i left n
	[ ${#nss[@]} -gt 0 ] || { [ -n "$work" ] && [ -z "$keep" ] && rm -rf "$work"; return 0; }
	for p in "${pids[@]}" $(cat "$work/restarted.pids" 2>/dev/null); do
		kill "$p" 2>/dev/null || true
	done
	for n in "${nss[@]}"; do
		for p in $(ip netns pids "$n" 2>/dev/null); do
			kill "$p" 2>/dev/null || true
		done
	done
	for ((i = 0; i < 50; i++)); do
		left=
		for n in "${nss[@]}"; do left+=$(ip netns pids "$n" 2>/dev/null); done
		[ -z "$left" ] && break
		sleep 0.2
	done
	for n in "${nss[@]}"; do
		for p in $(ip netns pids "$n" 2>/dev/null); do
			kill -9 "$p" 2>/dev/null || true
		done
		ip netns del "$n" 2>/dev/null
	done
	[ -n "$work" ] && [ -z "$keep" ] && rm -rf "$work"
	return 0
}

# inns runs a command where the servers are reached from (the cluster's
# namespace; svc in the failover topology).
inns() { ip netns exec "$ns" "$@"; }

# scrape prints "name value" for the counters the report uses, from the
# metrics endpoint at $1 (inside the namespace).
scrape() {
	local m
	m=$(inns curl -sf --max-time 5 "http://$1/metrics") || return 1
	awk '
		/^shoal_nfs_bytes_total\{/ && /dir="read"/  { r += $NF }
		/^shoal_nfs_bytes_total\{/ && /dir="write"/ { w += $NF }
		/^shoal_nfs_ops_total\{/ && /op="READ"/     { rd += $NF }
		/^shoal_nfs_ops_total\{/ && /op="LAYOUTGET"/ { lg += $NF }
		/^shoal_nfs_ops_total\{/ && /op="GETDEVICEINFO"/ { gd += $NF }
		END { printf "read_bytes %d\nwrite_bytes %d\nREAD %d\nLAYOUTGET %d\nGETDEVICEINFO %d\n", r, w, rd, lg, gd }' <<<"$m"
}

# scrape_ganesha prints the same names as scrape from NFS-Ganesha's own
# statistics of export 1 (D-Bus, org.ganesha.nfsd.exportstats, NFSv4.1 and
# 4.2 summed): bytes transferred and operations of reads and writes.
scrape_ganesha() {
	local v out all=
	for v in 41 42; do
		out=$(dbus-send --system --print-reply --reply-timeout=3000 --dest=org.ganesha.nfsd /org/ganesha/nfsd/ExportMgr \
			"org.ganesha.nfsd.exportstats.GetNFSv${v}IO" uint16:1) || return 1
		all+=$(tr -s ' \n' ' ' <<<"$out")$'\n'
	done
	# A reply: boolean ok, string, struct {time}, struct {read: requested,
	# transferred, ops, errors, latency, ...}, struct {write: the same}.
	awk '
		$0 ~ /boolean true/ {
			n = split($0, w, " "); k = 0
			for (i = 1; i <= n; i++) if (w[i] == "uint64") v[++k] = w[i + 1]
			# v[1], v[2]: time; v[3..8]: read; v[9..14]: write
			r += v[4]; rd += v[5]; wr += v[10]
		}
		END { printf "read_bytes %d\nwrite_bytes %d\nREAD %d\nLAYOUTGET 0\nGETDEVICEINFO 0\n", r, wr, rd }' <<<"$all"
}

# scrape_server ADDRESS: a Shoal metrics endpoint, or "dbus" for Ganesha.
scrape_server() {
	if [ "$1" = dbus ]; then scrape_ganesha; else scrape "$1"; fi
}

# up_ds prints how many data servers are up and active, by the MDS(es) at
# $mds_list.
up_ds() {
	inns "$shoal" admin status --mds "$mds_list" --join-secret-file "$secret" --json 2>/dev/null |
		python3 -c 'import json,sys; print(sum(1 for d in json.load(sys.stdin)["data_servers"] if d.get("Up") and d.get("State") == "active"))' 2>/dev/null || echo 0
}

# The exports of docs/diskless.md: the images read-only for the nodes and
# writable only for the image builder ($1, the address shoal cp connects
# from), root not squashed (a root tree is root's); one writable directory
# per node.
write_exports() {
	cat >"$work/mds.yaml" <<-EOF
		exports:
		  - path: /images
		    ro: true
		    rw_clients: [$1/32]
		    clients: [$subnet.0/24]
		    root_squash: false
		  - path: /nodes
		    clients: [$subnet.0/24]
		    root_squash: false
	EOF
}

# start_ds I [MDS]: data server I in $ns, in the background; prints its
# PID (ip netns exec execs the server).
start_ds() {
	ip netns exec "$ns" "$shoal" ds --mds "$mds_list" --join-secret-file "$secret" --dir "$work/ds$1" \
		--listen "${ds_ips[$1]}:2049" --http "${ds_ips[$1]}:9100" >>"$work/logs/ds$1.log" 2>&1 &
	echo $!
}

# cluster_single TARGET NODES: one namespace with a bridge, the VMs' taps
# on it, and the root's server(s) on its addresses: shoal, shoal mds (the
# data servers are started by cmd_boot); serve, one shoal serve, no pNFS,
# the same exports; ganesha, a private D-Bus for NFS-Ganesha's statistics
# (Ganesha itself starts once its tree is copied).
cluster_single() {
	local target=$1 nodes=$2 a i
	ns=shdl$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
	vmns=$ns
	ip netns add "$ns"
	nss+=("$ns")
	inns ip link set lo up
	inns ip link add br0 type bridge
	inns ip link set br0 up
	for a in "$mds_ip" "${ds_ips[@]}"; do
		inns ip addr add "$a/24" dev br0
	done
	for ((i = 0; i < nodes; i++)); do
		inns ip tuntap add dev "tap$i" mode tap
		inns ip link set "tap$i" master br0 up
	done
	svc_addr=$mds_ip mds_list=$mds_ip:2049 secret=$work/mds/join-secret
	write_exports "$mds_ip"
	case "$target" in
	shoal)
		servers=("mds=$mds_ip:9100")
		mkdir -p "$work/mds"
		ip netns exec "$ns" "$shoal" mds --config "$work/mds.yaml" --listen "$mds_ip:2049" --dir "$work/mds" --mirrors 2 \
			--lease 15s --http "$mds_ip:9100" >"$work/logs/mds.log" 2>&1 &
		pids+=($!)
		for ((i = 0; i < 100; i++)); do
			[ -s "$secret" ] && break
			sleep 0.1
		done
		[ -s "$secret" ] || die "the MDS wrote no join secret (log: $work/logs/mds.log)"
		;;
	serve)
		# One Shoal server, no pNFS: the NFSv4 baseline of the same code.
		servers=("serve=$mds_ip:9100")
		mkdir -p "$work/serve"
		ip netns exec "$ns" "$shoal" serve --config "$work/mds.yaml" --listen "$mds_ip:2049" --dir "$work/serve" \
			--lease 15s --http "$mds_ip:9100" >"$work/logs/serve.log" 2>&1 &
		pids+=($!)
		# The metrics endpoint comes up before the NFS listener: wait
		# for both.
		local up=0
		for ((i = 0; i < 150; i++)); do
			inns curl -sf --max-time 2 -o /dev/null "http://$mds_ip:9100/metrics" &&
				inns bash -c "exec 3<>/dev/tcp/$mds_ip/2049" 2>/dev/null && { up=1; break; }
			sleep 0.2
		done
		[ "$up" = 1 ] || die "shoal serve not up after 30 s (log: $work/logs/serve.log)"
		log "shoal serve up in $ns: $mds_ip:2049"
		;;
	ganesha)
		# NFS-Ganesha (VFS backend) serving a local copy of the tree:
		# one export, /export, no root squash (scripts/ganesha.sh). Its
		# statistics are read over D-Bus, from a private bus.
		servers=("ganesha=dbus")
		command -v ganesha.nfsd >/dev/null || die "needs ganesha.nfsd (apt-get install nfs-ganesha nfs-ganesha-vfs)"
		command -v dbus-daemon >/dev/null || die "needs dbus-daemon"
		mkdir -p "$work/dbus"
		cat >"$work/dbus/bus.conf" <<-EOF
			<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
			 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
			<busconfig>
			  <type>system</type>
			  <listen>unix:path=$work/dbus/bus.sock</listen>
			  <auth>EXTERNAL</auth>
			  <policy context="default">
			    <allow user="root"/>
			    <allow own="org.ganesha.nfsd"/>
			    <allow send_type="method_call"/>
			    <allow send_type="method_return"/>
			    <allow send_type="signal"/>
			    <allow send_type="error"/>
			    <allow receive_type="method_call"/>
			    <allow receive_type="method_return"/>
			    <allow receive_type="signal"/>
			    <allow receive_type="error"/>
			  </policy>
			</busconfig>
		EOF
		dbus-daemon --config-file="$work/dbus/bus.conf" --nofork --nopidfile >"$work/logs/dbus.log" 2>&1 &
		pids+=($!)
		export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$work/dbus/bus.sock
		for ((i = 0; i < 50; i++)); do
			[ -S "$work/dbus/bus.sock" ] && break
			sleep 0.1
		done
		;;
	esac
}

# The failover topology (as test/kernel's shoal-failover kind builds it,
# failover_net_test.go): namespaces lan (bridge br0 and the VMs' taps), a
# and b (one MDS host each: shoal mds and shoal vip) and svc (3 etcd
# members on .10, the data servers on .11-.13), joined by veths to br0.
# The service address .100 sits on the leading MDS's host; the nodes
# mount it.
fo_vip=$subnet.100
fo_etcd=$subnet.10
declare -A fo_ip=([a]=$subnet.1 [b]=$subnet.2) mds_pid=()

# start_mds HOST: shoal mds on host HOST (a or b), in the background;
# prints its PID.
start_mds() {
	local h=$1
	ip netns exec "$fo_prefix-$h" "$shoal" mds --config "$work/mds.yaml" --listen 0.0.0.0:2049 --advertise "${fo_ip[$h]}:2049" \
		--dir "$work/mds-$h" --meta "$fo_meta" --node "mds-$h" --join-secret-file "$secret" \
		--http 0.0.0.0:9100 --mirrors 2 --lease 15s --leader-lease 3s >>"$work/logs/mds-$h.log" 2>&1 &
	echo $!
}

# leader prints the host (a or b) whose MDS says it leads, or nothing.
leader() {
	local h v
	for h in a b; do
		v=$(inns curl -sf --max-time 2 "http://${fo_ip[$h]}:9100/metrics" 2>/dev/null | awk '$1 == "shoal_mds_leader" { print $2 }')
		[ "$v" = 1 ] && { echo "$h"; return; }
	done
}

cluster_failover() {
	local nodes=$1 i h r
	command -v etcd >/dev/null || die "--kill mds needs etcd (Debian package etcd-server)"
	local p
	p=shdf$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
	ns=$p-svc vmns=$p-lan fo_prefix=$p
	for r in lan a b svc; do
		ip netns add "$p-$r"
		nss+=("$p-$r")
	done
	ip -n "$vmns" link add br0 type bridge
	ip -n "$vmns" link set br0 up
	for ((i = 0; i < nodes; i++)); do
		ip -n "$vmns" tuntap add dev "tap$i" mode tap
		ip -n "$vmns" link set "tap$i" master br0 up
	done
	declare -A addrs=([a]="${fo_ip[a]}" [b]="${fo_ip[b]}" [svc]="$fo_etcd ${ds_ips[*]}")
	for r in a b svc; do
		ip link add eth0 netns "$p-$r" type veth peer name "v$r" netns "$vmns"
		ip -n "$vmns" link set "v$r" master br0 up
		ip -n "$p-$r" link set lo up
		ip -n "$p-$r" link set eth0 up
		for a in ${addrs[$r]}; do
			ip -n "$p-$r" addr add "$a/24" dev eth0
		done
	done
	local initial= eps=
	for i in 0 1 2; do
		initial+=${initial:+,}e$i=http://$fo_etcd:$((2380 + 100 * i))
		eps+=${eps:+,}$fo_etcd:$((2379 + 100 * i))
	done
	for i in 0 1 2; do
		local c=http://$fo_etcd:$((2379 + 100 * i)) pe=http://$fo_etcd:$((2380 + 100 * i))
		inns etcd --name "e$i" --data-dir "$work/etcd$i" --listen-client-urls "$c" --advertise-client-urls "$c" \
			--listen-peer-urls "$pe" --initial-advertise-peer-urls "$pe" --initial-cluster "$initial" \
			--initial-cluster-state new --initial-cluster-token "$p" --heartbeat-interval 100 \
			--election-timeout 1000 --log-level warn >"$work/logs/etcd$i.log" 2>&1 &
		pids+=($!)
	done
	for ((i = 0; i < 300; i++)); do
		inns curl -sf --max-time 2 "http://$fo_etcd:2379/health" 2>/dev/null | grep -q '"true"' && break
		sleep 0.2
	done
	fo_meta=etcd://$eps/shoal-diskless
	svc_addr=$fo_vip mds_list=${fo_ip[a]}:2049,${fo_ip[b]}:2049 secret=$work/mds-a/join-secret
	servers=("mds-a=${fo_ip[a]}:9100" "mds-b=${fo_ip[b]}:9100")
	mkdir -p "$work/mds-a" "$work/mds-b"
	# shoal cp runs in svc, whose first address is etcd's.
	write_exports "$fo_etcd"
	mds_pid[a]=$(start_mds a)
	pids+=("${mds_pid[a]}")
	for ((i = 0; i < 300; i++)); do
		[ "$(leader)" = a ] && [ -s "$secret" ] && break
		sleep 0.2
	done
	[ -s "$secret" ] || die "MDS a does not lead within 60 s (log: $work/logs/mds-a.log)"
	mds_pid[b]=$(start_mds b)
	pids+=("${mds_pid[b]}")
	for h in a b; do
		ip netns exec "$p-$h" "$shoal" vip --meta "$fo_meta" --node "mds-$h" --address "$fo_vip/24" \
			--interface eth0 --http 0.0.0.0:9103 >"$work/logs/vip-$h.log" 2>&1 &
		pids+=($!)
	done
	for ((i = 0; i < 150; i++)); do
		inns curl -s --max-time 1 -o /dev/null "http://$fo_vip:9100/metrics" && break
		sleep 0.2
	done
}

# console_now prints the time on node0's console log's clock (seconds
# since its qemu started).
console_now() {
	local us=$((${EPOCHREALTIME/./} - $(cat "$work/start-node0")))
	printf '%d.%02d' $((us / 1000000)) $((us % 1000000 / 10000))
}

# fault_driver KIND DOWN: wait until node0's loop has run 3 rounds, kill
# -9 a data server (ds0; with 3 data servers and --mirrors 2 every file
# larger than a stripe unit has units on each) or the leading MDS, and
# start it again DOWN seconds later. What it did goes to $work/fault.
fault_driver() {
	local kind=$1 down=$2 j f=$work/console-node0.log out=$work/fault
	for ((j = 0; j < 2400; j++)); do
		grep -q 'DISKLESS loop iter 3 ' "$f" 2>/dev/null && break
		sleep 0.5
	done
	if ! grep -q 'DISKLESS loop iter 3 ' "$f" 2>/dev/null; then
		echo "FAULT none: node0's loop never reached round 3" >"$out"
		return
	fi
	local at t0=$EPOCHREALTIME
	at="console $(console_now) s, after $(grep -o 'DISKLESS loop iter [0-9]*' "$f" | tail -n 1 | cut -d' ' -f3-)"
	case "$kind" in
	ds)
		local reads
		reads=$(scrape "${ds_ips[0]}:9100" | awk '$1 == "READ" { print $2 }')
		kill -9 "${ds_pids[0]}"
		echo "FAULT killed ds0 (pid ${ds_pids[0]}, ${reads:-?} READs served so far) at $at" >>"$out"
		sleep "$down"
		start_ds 0 >>"$work/restarted.pids"
		echo "FAULT restarted ds0 $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s after the kill, at console $(console_now) s" >>"$out"
		;;
	mds)
		local h o
		h=$(leader)
		[ -n "$h" ] || { echo "FAULT none: no MDS leads" >>"$out"; return; }
		o=b
		[ "$h" = b ] && o=a
		kill -9 "${mds_pid[$h]}"
		echo "FAULT killed the leading MDS mds-$h (pid ${mds_pid[$h]}) at $at" >>"$out"
		sleep "$down"
		start_mds "$h" >>"$work/restarted.pids"
		echo "FAULT restarted mds-$h $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s after the kill, at console $(console_now) s" >>"$out"
		for ((j = 0; j < 600; j++)); do
			[ "$(leader)" = "$o" ] && break
			sleep 0.1
		done
		echo "FAULT mds-$o leads $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s after the kill ($(leader || true))" >>"$out"
		;;
	esac
}

cmd_boot() {
	local which=6.1 nodes=1 kill_ds= loop= kill= down= target=shoal
	while [ $# -gt 0 ]; do
		case "$1" in
		--kill-ds) kill_ds=$2; shift 2 ;;
		--kernel) which=$2; shift 2 ;;
		--nodes) nodes=$2; shift 2 ;;
		--target) target=$2; shift 2 ;;
		--keep) keep=$2; shift 2 ;;
		--loop) loop=$2; shift 2 ;;
		--kill) kill=$2; shift 2 ;;
		--down) down=$2; shift 2 ;;
		*) die "boot: unknown argument $1" ;;
		esac
	done
	[ "$nodes" -ge 1 ] && [ "$nodes" -le 8 ] || die "--nodes $nodes: want 1 to 8"
	case "$kill" in
	"") ;;
	ds | mds) [ -n "$loop" ] || die "--kill $kill needs --loop SECS" ;;
	*) die "--kill $kill: want ds or mds" ;;
	esac
	[ -z "$loop" ] || [ "$loop" -ge 1 ] || die "--loop $loop: want seconds"
	case "$target" in
	shoal) ;;
	serve | ganesha)
		# The faults are a data server's and the MDS's: the baselines
		# have neither.
		[ -z "$kill" ] || die "--kill $kill needs --target shoal (--target $target has no data servers or MDS to kill)"
		[ -z "$kill_ds" ] || die "--kill-ds needs --target shoal (--target $target has no data servers)"
		;;
	*) die "--target $target: want shoal, serve or ganesha" ;;
	esac
	# How long the killed server stays down: long enough for a data
	# server's loss to be seen; a second for the MDS, as
	# test/kernel/failover.sh's kill round does.
	[ -n "$down" ] || { down=10; [ "$kill" = mds ] && down=1; }
	command -v curl >/dev/null || die "needs curl"
	local t0=$EPOCHREALTIME
	local rootfs kout kver kernel initrd
	rootfs=$(cmd_rootfs --check | sed -n 's/^ROOTFS=//p')
	kout=$(cmd_initramfs "$which")
	kver=$(sed -n 's/^KVER=//p' <<<"$kout")
	kernel=$(sed -n 's/^KERNEL=//p' <<<"$kout")
	initrd=$(sed -n 's/^INITRD=//p' <<<"$kout")
	log "root tree $rootfs ($(du -sh "$rootfs" | cut -f1)), kernel $kver"

	if [ -n "$keep" ]; then
		work=$keep
		rm -rf "$work"
		mkdir -p "$work"
	else
		work=$(mktemp -d /tmp/shoal-diskless.XXXXXX)
	fi
	trap cleanup EXIT
	trap 'exit 130' INT TERM
	shoal=${SHOAL_BIN:-}
	if [ -z "$shoal" ]; then
		shoal=$work/shoal
		(cd "$here" && go build -o "$shoal" ./cmd/shoal) || die "go build ./cmd/shoal failed"
	fi
	mkdir -p "$work/logs"

	# The cluster: separate processes, as on real servers. Two copies of
	# every stripe unit, so a node survives the loss of a data server.
	# --kill mds: two MDSes on etcd with the service address, as
	# docs/availability.md deploys them. servers: the NAME=ADDRESS of
	# every server whose own counters the report reads (ADDRESS is the
	# metrics endpoint; ganesha: dbus).
	if [ "$kill" = mds ]; then
		cluster_failover "$nodes"
	else
		cluster_single "$target" "$nodes"
	fi
	local i root_path=/images/current state_path=/nodes pnfs_opt=
	ds_pids=()
	if [ "$target" = shoal ]; then
		for i in 0 1 2; do
			ds_pids+=("$(start_ds "$i")")
			pids+=("${ds_pids[$i]}")
			servers+=("ds$i=${ds_ips[$i]}:9100")
		done
		local up=0
		for ((i = 0; i < 150; i++)); do
			up=$(up_ds)
			[ "$up" = 3 ] && break
			sleep 0.2
		done
		[ "$up" = 3 ] || die "3 data servers not in service after 30 s (logs: $work/logs)"
		inns curl -s --max-time 5 -o /dev/null "http://$svc_addr:9100/metrics" || die "nothing answers at $svc_addr (logs: $work/logs)"
		log "cluster up in $ns: MDS $svc_addr:2049 ($mds_list), data servers ${ds_ips[*]}"
	else
		# The baselines have no layouts to give.
		pnfs_opt=" shoal.pnfs=prefer"
	fi

	# The image: copied beside any older one, then the symlink switched
	# with one RENAME (docs/diskless.md: atomic image update). Ganesha
	# serves a local directory: there the copy is cp -a.
	local name
	name=$(basename "$rootfs")
	local tc=$EPOCHREALTIME copy_s
	if [ "$target" = ganesha ]; then
		root_path=/export/images/current state_path=/export/nodes
		mkdir -p "$work/ganesha/export/images" "$work/ganesha/export/nodes"
		cp -a "$rootfs" "$work/ganesha/export/images/$name"
		ln -sfn "$name" "$work/ganesha/export/images/current"
		for ((i = 0; i < nodes; i++)); do mkdir -p "$work/ganesha/export/nodes/node$i"; done
		copy_s=$(awk -v a="$tc" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
		inns env GANESHA_BIND="$mds_ip" GANESHA_LEASE=15 "$here/scripts/ganesha.sh" start "$work/ganesha" 2049 >/dev/null ||
			die "ganesha did not start (log: $work/ganesha/ganesha.log)"
		pids+=("$("$here/scripts/ganesha.sh" pid "$work/ganesha")")
		for ((i = 0; i < 20; i++)); do
			scrape_ganesha >/dev/null 2>&1 && break
			sleep 0.5
		done
		log "ganesha up in $ns: $mds_ip:2049, /export = $work/ganesha/export (copied in ${copy_s}s)"
	else
		inns "$shoal" cp -a "$rootfs" "nfs://$svc_addr:2049/images/$name" | sed 's/^/diskless: cp: /' >&2
		copy_s=$(awk -v a="$tc" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
		mkdir -p "$work/link"
		ln -sfn "$name" "$work/link/current"
		inns "$shoal" cp -q "$work/link/current" "nfs://$svc_addr:2049/images/.current.new"
		inns "$shoal" mv "nfs://$svc_addr:2049/images/.current.new" "nfs://$svc_addr:2049/images/current"
		log "root tree copied in ${copy_s}s; /images/current -> $name"
		for ((i = 0; i < nodes; i++)); do
			inns "$shoal" mkdir -p "nfs://$svc_addr:2049/nodes/node$i" >/dev/null
		done
	fi

	local before=$work/before s sv
	mkdir -p "$before"
	for sv in "${servers[@]}"; do
		scrape_server "${sv#*=}" >"$before/${sv%%=*}" || die "no counters from ${sv%%=*}"
	done
	# The bytes the bridge delivers to each node: its tap's transmit
	# counter, in the namespace of the VMs' bridge.
	for ((i = 0; i < nodes; i++)); do
		ip netns exec "$vmns" cat "/sys/class/net/tap$i/statistics/tx_bytes" >"$before/tap$i"
	done

	# SHOAL_DISKLESS_CAPTURE=1: capture the nodes' traffic (first 300
	# bytes of each frame) on the bridge into capture.pcap (with --keep).
	if [ "${SHOAL_DISKLESS_CAPTURE:-0}" = 1 ]; then
		ip netns exec "$vmns" dumpcap -q -i br0 -s 300 -w "$work/capture.pcap" 2>"$work/logs/dumpcap.log" &
		pids+=($!)
		sleep 1
	fi

	# The nodes, all at once.
	local vmto=${SHOAL_DISKLESS_VM_TIMEOUT:-600} mem=${SHOAL_DISKLESS_MEM:-768}
	local vpids=() tb=$EPOCHREALTIME
	for ((i = 0; i < nodes; i++)); do
		local ip=$subnet.$((15 + i)) host=node$i
		local append="console=ttyS0 panic=-1 quiet root=nfs4:$svc_addr:$root_path ip=$ip::$svc_addr:255.255.255.0:$host:eth0:off nfs.nfs4_unique_id=$host shoal.state=nfs4:$svc_addr:$state_path/$host$pnfs_opt"
		[ -n "$loop" ] && append+=" shoal.loop=$loop"
		(
			start=${EPOCHREALTIME/./}
			echo "$start" >"$work/start-$host"
			ip netns exec "$vmns" timeout --kill-after=10 "$vmto" qemu-system-x86_64 -accel tcg,thread=multi -cpu max \
				-m "$mem" -smp 1 -display none -no-reboot -nodefaults -monitor none -serial stdio \
				-kernel "$kernel" -initrd "$initrd" -append "$append" \
				-netdev "tap,id=n0,ifname=tap$i,script=no,downscript=no" \
				-device "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:$(printf %02x $((0x56 + i)))" </dev/null 2>&1 |
				while IFS= read -r l; do
					l=${l%$'\r'}
					us=$((${EPOCHREALTIME/./} - start))
					printf '%d.%02d %s\n' $((us / 1000000)) $((us % 1000000 / 10000)) "$l"
				done >"$work/console-$host.log"
		) &
		vpids+=($!)
	done
	# --kill-ds S: kill -9 the first data server S seconds after node0's
	# initramfs mounted the root, while systemd starts from it. With two
	# copies of every stripe unit the nodes must not notice.
	if [ -n "$kill_ds" ]; then
		(
			for ((j = 0; j < 1200; j++)); do
				grep -q 'shoal-initramfs: root ' "$work/console-node0.log" 2>/dev/null && break
				sleep 0.5
			done
			sleep "$kill_ds"
			kill -9 "${ds_pids[0]}"
			echo "KILLED ds0 (pid ${ds_pids[0]}) at node0 console time $(tail -n 1 "$work/console-node0.log" | cut -d' ' -f1)" >"$work/killed"
		) &
	fi
	# --kill ds|mds: the same under running nodes (fault_driver).
	[ -n "$kill" ] && fault_driver "$kill" "$down" &
	local rc=0
	for p in "${vpids[@]}"; do
		wait "$p" || rc=1
	done
	local boot_s
	boot_s=$(awk -v a="$tb" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')

	# Report. wire_rx_bytes: what the bridge delivered to the node (its
	# tap's transmit counter), whichever server sent it.
	local ok=0 rx=()
	for ((i = 0; i < nodes; i++)); do
		rx[i]=$(($(ip netns exec "$vmns" cat "/sys/class/net/tap$i/statistics/tx_bytes") - $(cat "$before/tap$i")))
	done
	for ((i = 0; i < nodes; i++)); do
		local f=$work/console-node$i.log
		local first done
		first=$(awk '$2 == "DISKLESS" && $3 == "first-line" { print $1; exit }' "$f")
		done=$(awk '$2 == "DISKLESS" && $3 == "done" { print $1; exit }' "$f")
		if [ -n "$first" ] && [ -n "$done" ]; then
			ok=$((ok + 1))
			echo "NODE node$i ok first_line_s=$first done_s=$done wire_rx_bytes=${rx[$i]}"
		else
			echo "NODE node$i FAILED first_line_s=${first:-none} done_s=${done:-none} wire_rx_bytes=${rx[$i]} (console: $f)"
			tail -n 30 "$f" | sed 's/^/  | /'
		fi
		grep -E '^[0-9.]+ (DISKLESS|shoal-initramfs:)' "$f" | sed "s/^/  node$i: /"
	done
	# What each node left in its own directory.
	for ((i = 0; i < nodes; i++)); do
		if [ "$target" = ganesha ]; then
			echo "STATE node$i $(tail -n 1 "$work/ganesha/export/nodes/node$i/boots" 2>&1)"
		else
			echo "STATE node$i $(inns "$shoal" cat "nfs://$svc_addr:2049/nodes/node$i/boots" 2>&1 | tail -n 1)"
		fi
	done
	[ -f "$work/killed" ] && cat "$work/killed"
	[ -f "$work/fault" ] && cat "$work/fault"
	# Each server's counters during the boots (a server restarted by
	# --kill counts from its restart).
	local k v b0 cur
	for sv in "${servers[@]}"; do
		s=${sv%%=*}
		if ! cur=$(scrape_server "${sv#*=}"); then
			echo "SERVER $s down"
			continue
		fi
		printf 'SERVER %s' "$s"
		while read -r k v; do
			b0=$(awk -v k="$k" '$1 == k { print $2 }' "$before/$s")
			[ "$v" -lt "${b0:-0}" ] && b0=0
			printf ' %s=%d' "$k" $((v - ${b0:-0}))
		done <<<"$cur"
		echo
	done
	echo "RESULT target=$target nodes=$nodes ok=$ok kernel=$kver copy_s=$copy_s boot_s=$boot_s total_s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') loop=${loop:-0} kill=${kill:-none} load=$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' /)"
	[ "$ok" = "$nodes" ] && [ $rc = 0 ]
}

case "${1:-}" in
rootfs) shift; cmd_rootfs "$@" ;;
initramfs) shift; cmd_initramfs "$@" ;;
boot) shift; cmd_boot "$@" ;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
