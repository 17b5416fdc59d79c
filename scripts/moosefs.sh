#!/usr/bin/env bash
# moosefs.sh — run a private MooseFS 3.0 cluster (Debian's moosefs-master,
# moosefs-chunkserver, moosefs-client) on 127.0.0.1 and mount it with its
# own FUSE client, as the peer baseline for scripts/fuse-meta.sh (issue 13
# compares Shoal's FUSE mount with MooseFS and GlusterFS).
#
#   scripts/moosefs.sh start DIR PORT [CS]  a master on PORT..PORT+2, CS chunk
#                                          servers (default 4) on PORT+10..,
#                                          mounted on DIR/mnt; returns once
#                                          the mount answers and every chunk
#                                          server has registered
#   scripts/moosefs.sh remount DIR          a new mfsmount process (so nothing
#                                          is cached in it)
#   scripts/moosefs.sh stop DIR             unmount, then SIGTERM (SIGKILL
#                                          after 10 s) every process started
#
# Everything lives under DIR: configs, the master's metadata and change
# logs, the chunk servers' chunk directories, logs, and the pid files the
# processes are stopped through (never by name: other instances may run).
#
# MOOSEFS_CHANGELOG_SAVE_MODE sets the master's CHANGELOG_SAVE_MODE:
#   0 (MooseFS's default): change logs are written in the background, not
#     synced; a crash of the machine loses the last changes.
#   2: the master writes and fsyncs its change log after every change
#     before answering, which is the durability Shoal's MDS always has.
# Both run at nice 0 (MooseFS raises itself to -19 by default), so the
# comparison with Shoal on a shared machine is fair.
set -euo pipefail

# A chunk server refuses to register with a master on any loopback address
# ("use ip address of network controller"), so the cluster runs in a network
# namespace of its own, made here and removed by stop, on a veth pair with
# both ends inside it and a private address that exists only there: no
# traffic leaves the machine. The processes enter only that network namespace (nsenter --net),
# so the FUSE mount is visible on the host.
HOST=10.251.0.1
ns_name() { echo "shoal-mfs-$(basename "$1")"; }
# nsenter execs the command in place (no fork without --fork), so $! of
# "nsenter ... &" is the daemon's own pid. (A shell function run with &
# would be a subshell, and its pid not the daemon's.)

usage() {
	echo "usage: $0 start DIR PORT [CS] | remount DIR | stop DIR" >&2
	exit 2
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

stop_pid() { # stop_pid PIDFILE
	local pid
	pid=$(cat "$1" 2>/dev/null || true)
	alive "$pid" || return 0
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do alive "$pid" || return 0; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true
}

install_moosefs() {
	command -v mfsmaster >/dev/null && command -v mfschunkserver >/dev/null && command -v mfsmount >/dev/null && return 0
	echo "moosefs.sh: installing moosefs-master, moosefs-chunkserver, moosefs-client" >&2
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq moosefs-master moosefs-chunkserver moosefs-client >/dev/null
}

start() {
	local dir=$1 port=$2 cs=${3:-4}
	local mode=${MOOSEFS_CHANGELOG_SAVE_MODE:-0}
	install_moosefs
	mkdir -p "$dir/master" "$dir/mnt"
	dir=$(cd "$dir" && pwd)
	# A new, empty file system (what the package installs as
	# /var/lib/mfs/metadata.mfs.empty).
	[ -s "$dir/master/metadata.mfs" ] || printf 'MFSM NEW' >"$dir/master/metadata.mfs"
	echo "$HOST / rw,alldirs,maproot=0" >"$dir/mfsexports.cfg"
	: >"$dir/mfstopology.cfg"
	cat >"$dir/mfsmaster.cfg" <<-EOF
		WORKING_USER = root
		WORKING_GROUP = root
		NICE_LEVEL = 0
		DATA_PATH = $dir/master
		EXPORTS_FILENAME = $dir/mfsexports.cfg
		TOPOLOGY_FILENAME = $dir/mfstopology.cfg
		CHANGELOG_SAVE_MODE = $mode
		MATOML_LISTEN_HOST = $HOST
		MATOML_LISTEN_PORT = $port
		MATOCS_LISTEN_HOST = $HOST
		MATOCS_LISTEN_PORT = $((port + 1))
		MATOCL_LISTEN_HOST = $HOST
		MATOCL_LISTEN_PORT = $((port + 2))
	EOF
	local ns
	ns=$(ns_name "$dir")
	ip netns add "$ns"
	echo "$ns" >"$dir/netns"
	ip -n "$ns" link set lo up
	ip -n "$ns" link add mfs0 type veth peer name mfs1
	ip -n "$ns" link set mfs1 up
	ip -n "$ns" addr add "$HOST/24" dev mfs0
	ip -n "$ns" link set mfs0 up
	nsenter --net="/run/netns/$ns" mfsmaster -f -c "$dir/mfsmaster.cfg" start >"$dir/master.log" 2>&1 &
	echo $! >"$dir/master.pid"
	local i
	for ((i = 0; i < cs; i++)); do
		mkdir -p "$dir/cs$i/chunks"
		echo "$dir/cs$i/chunks" >"$dir/cs$i/mfshdd.cfg"
		cat >"$dir/cs$i/mfschunkserver.cfg" <<-EOF
			WORKING_USER = root
			WORKING_GROUP = root
			NICE_LEVEL = 0
			DATA_PATH = $dir/cs$i
			HDD_CONF_FILENAME = $dir/cs$i/mfshdd.cfg
			BIND_HOST = $HOST
			MASTER_HOST = $HOST
			MASTER_PORT = $((port + 1))
			CSSERV_LISTEN_HOST = $HOST
			CSSERV_LISTEN_PORT = $((port + 10 + i))
		EOF
		nsenter --net="/run/netns/$ns" mfschunkserver -f -c "$dir/cs$i/mfschunkserver.cfg" start >"$dir/cs$i.log" 2>&1 &
		echo $! >"$dir/cs$i.pid"
	done
	# The master must be listening before the mount connects.
	for _ in $(seq 1 300); do
		nsenter --net="/run/netns/$ns" bash -c "exec 3<>/dev/tcp/$HOST/$((port + 2))" 2>/dev/null && break
		alive "$(cat "$dir/master.pid")" || { cat "$dir/master.log" >&2; echo "mfsmaster died" >&2; exit 1; }
		sleep 0.1
	done
	nsenter --net="/run/netns/$ns" mfsmount -f "$dir/mnt" -H "$HOST" -P $((port + 2)) >"$dir/mount.log" 2>&1 &
	echo $! >"$dir/mount.pid"
	for _ in $(seq 1 300); do
		mountpoint -q "$dir/mnt" && break
		alive "$(cat "$dir/mount.pid")" || { cat "$dir/mount.log" >&2; echo "mfsmount died" >&2; exit 1; }
		sleep 0.1
	done
	mountpoint -q "$dir/mnt" || { echo "mfsmount not up after 30 s" >&2; exit 1; }
	# Writes need the chunk servers: wait until all have registered and a
	# file can be written.
	for _ in $(seq 1 300); do
		[ "$(grep -c "chunkserver register begin" "$dir/master.log" 2>/dev/null)" -ge "$cs" ] && probe "$dir/mnt" && break
		sleep 0.1
	done
	probe "$dir/mnt" || { echo "MooseFS accepts no writes after 30 s" >&2; exit 1; }
	echo "$dir/mnt"
}

# remount DIR: unmount, stop the mount process, and mount again with the
# master port of DIR's configuration.
remount() {
	local dir port ns
	dir=$(cd "$1" && pwd)
	port=$(sed -n 's/^[[:space:]]*MATOCL_LISTEN_PORT = //p' "$dir/mfsmaster.cfg")
	ns=$(cat "$dir/netns")
	if mountpoint -q "$dir/mnt" 2>/dev/null; then
		fusermount3 -u "$dir/mnt" 2>/dev/null || fusermount -u "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
	fi
	stop_pid "$dir/mount.pid"
	nsenter --net="/run/netns/$ns" mfsmount -f "$dir/mnt" -H "$HOST" -P "$port" >"$dir/mount.log" 2>&1 &
	echo $! >"$dir/mount.pid"
	for _ in $(seq 1 300); do
		mountpoint -q "$dir/mnt" && probe "$dir/mnt" && return 0
		alive "$(cat "$dir/mount.pid")" || { cat "$dir/mount.log" >&2; echo "mfsmount died" >&2; exit 1; }
		sleep 0.1
	done
	echo "mfsmount not up after 30 s" >&2
	exit 1
}

# probe MNT: a 4 KiB file can be written, synced and read back.
probe() {
	local f=$1/.moosefs-probe
	{ head -c 4096 /dev/zero >"$f" && sync "$f" && [ "$(stat -c %s "$f")" = 4096 ] && rm -f "$f"; } 2>/dev/null
}

stop() {
	local dir=$1
	[ -d "$dir" ] || return 0
	if mountpoint -q "$dir/mnt" 2>/dev/null; then
		fusermount3 -u "$dir/mnt" 2>/dev/null || fusermount -u "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
	fi
	stop_pid "$dir/mount.pid"
	local f
	for f in "$dir"/cs*.pid; do [ -e "$f" ] && stop_pid "$f"; done
	stop_pid "$dir/master.pid"
	if [ -s "$dir/netns" ]; then
		ip netns del "$(cat "$dir/netns")" 2>/dev/null || true
		rm -f "$dir/netns"
	fi
}

case "${1:-}" in
start) [ $# -ge 3 ] || usage; start "$2" "$3" "${4:-4}" ;;
remount) [ $# -eq 2 ] || usage; remount "$2" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
