#!/usr/bin/env bash
# glusterfs.sh — run a private GlusterFS (Debian's glusterfs-server and
# glusterfs-client) with a distribute volume of BRICKS bricks on one host
# and mount it with its own FUSE client, as a peer baseline like
# scripts/moosefs.sh (issue 27 compares large-file throughput of Shoal's
# FUSE mount with MooseFS and GlusterFS).
#
#   scripts/glusterfs.sh start DIR [BRICKS]  a glusterd of its own, a volume
#                                           "shoalcmp" of BRICKS bricks
#                                           (default 4), mounted on DIR/mnt;
#                                           returns once a file can be
#                                           written and read there
#   scripts/glusterfs.sh remount DIR         a new FUSE client process (so
#                                           nothing is cached in it)
#   scripts/glusterfs.sh stop DIR            unmount, then SIGTERM (SIGKILL
#                                           after 10 s) every process started,
#                                           by the pids recorded under DIR
#
# The glusterd is private: its configuration file (DIR/glusterd.vol) sets
# its working directory (peers, volumes, brick volfiles: DIR/glusterd), its
# run directory (pid files and sockets of glusterd and the bricks:
# DIR/run) and its CLI socket (DIR/run/glusterd.socket, which every
# `gluster` call here names with --glusterd-sock), so it shares no state
# with a system glusterd and /var/lib/glusterd is not touched. What is not
# private: the brick processes glusterd spawns log under
# /var/log/glusterfs/bricks (glusterd has no option for their log
# directory), in files named after the brick paths, which are under DIR
# (stop moves them into DIR), and their unix sockets are made in /var/run/gluster (stop removes them).
#
# glusterd listens on fixed ports (24007, bricks from 49152) and refuses
# bricks on 127.0.0.1 ("provide a valid hostname/ip other than
# localhost"), so everything runs in a network namespace of its own, made
# here and removed by stop, on a veth pair with both ends inside it and a
# private address that exists only there: no traffic leaves the machine,
# and the ports do not collide with anything on the host. The processes
# enter only that network namespace (nsenter --net), so the FUSE mount is
# visible on the host. The bricks are directories under DIR (on the root
# file system, which gluster accepts with "force").
#
# The volume runs with GlusterFS's defaults (its FUSE client's write-behind
# and read-ahead included), as MooseFS does in moosefs.sh.
set -euo pipefail

HOST=10.252.0.1
VOL=shoalcmp
ns_name() { echo "shoal-gfs-$(basename "$1")"; }

usage() {
	echo "usage: $0 start DIR [BRICKS] | remount DIR | stop DIR" >&2
	exit 2
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

stop_pid() { # stop_pid PID
	local pid=$1
	alive "$pid" || return 0
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do alive "$pid" || return 0; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true
}

install_glusterfs() {
	command -v glusterd >/dev/null && command -v gluster >/dev/null && command -v glusterfs >/dev/null && return 0
	echo "glusterfs.sh: installing glusterfs-server, glusterfs-client" >&2
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq glusterfs-server glusterfs-client >/dev/null
}

# cli DIR ARGS...: the gluster CLI against this glusterd only.
cli() {
	local dir=$1
	shift
	nsenter --net="/run/netns/$(cat "$dir/netns")" gluster --mode=script --glusterd-sock="$dir/run/glusterd.socket" \
		--log-file="$dir/cli.log" "$@"
}

start() {
	local dir=$1 bricks=${2:-4}
	install_glusterfs
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	mkdir -p "$dir/glusterd" "$dir/run" "$dir/mnt"
	cat >"$dir/glusterd.vol" <<-EOF
		volume management
		    type mgmt/glusterd
		    option working-directory $dir/glusterd
		    option run-directory $dir/run
		    option glusterd-sockfile $dir/run/glusterd.socket
		    option transport-type socket
		    option transport.address-family inet
		    option transport.socket.listen-port 24007
		    option transport.socket.bind-address $HOST
		    option ping-timeout 0
		    option event-threads 1
		    option base-port 49152
		    option max-port 49252
		end-volume
	EOF
	local ns
	ns=$(ns_name "$dir")
	ip netns add "$ns"
	echo "$ns" >"$dir/netns"
	ip -n "$ns" link set lo up
	ip -n "$ns" link add gfs0 type veth peer name gfs1
	ip -n "$ns" link set gfs1 up
	ip -n "$ns" addr add "$HOST/24" dev gfs0
	ip -n "$ns" link set gfs0 up
	# -N: glusterd stays in the foreground, so $! (nsenter execs it) is
	# its pid.
	nsenter --net="/run/netns/$ns" glusterd -N -f "$dir/glusterd.vol" -p "$dir/glusterd.pid" \
		-l "$dir/glusterd.log" >"$dir/glusterd.out" 2>&1 &
	echo $! >"$dir/glusterd.pid.started"
	for _ in $(seq 1 300); do
		cli "$dir" volume list >/dev/null 2>&1 && break
		alive "$(cat "$dir/glusterd.pid.started")" || { cat "$dir/glusterd.log" "$dir/glusterd.out" >&2; echo "glusterd died" >&2; exit 1; }
		sleep 0.1
	done
	cli "$dir" volume list >/dev/null 2>&1 || { echo "glusterd does not answer after 30 s" >&2; exit 1; }
	local i list=()
	for ((i = 0; i < bricks; i++)); do
		mkdir -p "$dir/brick$i"
		list+=("$HOST:$dir/brick$i/data")
	done
	cli "$dir" volume create "$VOL" transport tcp "${list[@]}" force >"$dir/create.log" 2>&1 ||
		{ cat "$dir/create.log" >&2; echo "volume create failed" >&2; exit 1; }
	cli "$dir" volume start "$VOL" >"$dir/vstart.log" 2>&1 ||
		{ cat "$dir/vstart.log" >&2; echo "volume start failed" >&2; exit 1; }
	# The brick processes' pids, for stop (glusterd writes a pid file per
	# brick under its run directory).
	for _ in $(seq 1 300); do
		[ "$(find "$dir/run" -name '*.pid' -path "*$VOL*" 2>/dev/null | wc -l)" -ge "$bricks" ] && break
		sleep 0.1
	done
	mount_vol "$dir"
	echo "$dir/mnt"
}

# mount_vol DIR: the FUSE client, in the foreground of its own process
# (-N; its pid in DIR/mount.pid), once a file can be written there.
mount_vol() {
	local dir=$1
	nsenter --net="/run/netns/$(cat "$dir/netns")" glusterfs -N --volfile-server="$HOST" --volfile-id="$VOL" \
		-l "$dir/mount.log" "$dir/mnt" >"$dir/mount.out" 2>&1 &
	echo $! >"$dir/mount.pid"
	for _ in $(seq 1 300); do
		mountpoint -q "$dir/mnt" && probe "$dir/mnt" && break
		alive "$(cat "$dir/mount.pid")" || { cat "$dir/mount.log" >&2; echo "glusterfs mount died" >&2; exit 1; }
		sleep 0.1
	done
	probe "$dir/mnt" || { echo "GlusterFS accepts no writes after 30 s" >&2; exit 1; }
}

unmount_vol() {
	local dir=$1
	if mountpoint -q "$dir/mnt" 2>/dev/null; then
		fusermount3 -u "$dir/mnt" 2>/dev/null || fusermount -u "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
	fi
	stop_pid "$(cat "$dir/mount.pid" 2>/dev/null || true)"
}

# remount DIR: a new FUSE client process, with nothing cached.
remount() {
	local dir
	dir=$(cd "$1" && pwd)
	unmount_vol "$dir"
	mount_vol "$dir"
}

# probe MNT: a 4 KiB file can be written, synced and read back.
probe() {
	local f=$1/.glusterfs-probe
	{ head -c 4096 /dev/zero >"$f" && sync "$f" && [ "$(stat -c %s "$f")" = 4096 ] && rm -f "$f"; } 2>/dev/null
}

# pids DIR: the brick processes' pids from the pid files of this glusterd.
brick_pids() {
	local f
	for f in $(find "$1/run" -name '*.pid' 2>/dev/null); do
		[ "$f" = "$1/run/glusterd.pid" ] && continue
		cat "$f" 2>/dev/null || true
	done
}

stop() {
	local dir=$1
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	unmount_vol "$dir"
	# glusterd first (it would restart bricks it sees die), then the
	# bricks it started, each by the pid it recorded, all signalled at once
	# (each takes about 2 s to exit). Only glusterfsd processes: a stale
	# pid file must not kill another process. Their unix sockets, which
	# glusterd puts in /var/run/gluster whatever its run directory, go too.
	local bp=() socks=() p
	for p in $(brick_pids "$dir"); do
		[ "$(cat "/proc/$p/comm" 2>/dev/null)" = glusterfsd ] || continue
		bp+=("$p")
		socks+=("$(tr '\0' '\n' <"/proc/$p/cmdline" | sed -n '/^-S$/{n;p}')")
	done
	stop_pid "$(cat "$dir/glusterd.pid.started" 2>/dev/null || true)"
	for p in "${bp[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${bp[@]}"; do stop_pid "$p"; done
	for p in "${socks[@]}"; do [[ $p == /var/run/gluster/*.socket ]] && rm -f "$p"; done
	# The bricks' logs (named after their paths) move into DIR.
	local b
	for b in "$dir"/brick*/data; do
		p=${b#/}
		p=/var/log/glusterfs/bricks/${p//\//-}.log
		[ -e "$p" ] && mv "$p" "$dir/" 2>/dev/null
	done
	if [ -s "$dir/netns" ]; then
		ip netns del "$(cat "$dir/netns")" 2>/dev/null || true
		rm -f "$dir/netns"
	fi
}

case "${1:-}" in
start) [ $# -ge 2 ] || usage; start "$2" "${3:-4}" ;;
remount) [ $# -eq 2 ] || usage; remount "$2" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
