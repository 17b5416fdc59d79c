#!/usr/bin/env bash
# ganesha.sh — run a private NFS-Ganesha (NFSv4.1/4.2, VFS backend) instance
# as a peer/baseline server for Shoal's tests and benchmarks.
#
#   scripts/ganesha.sh start DIR PORT   start serving DIR/export as pseudo path
#                                       /export on 127.0.0.1:PORT; prints the
#                                       pid file path once the port accepts TCP
#   scripts/ganesha.sh stop DIR         SIGTERM (then SIGKILL after 10 s)
#   scripts/ganesha.sh kill DIR         SIGKILL, for crash tests
#   scripts/ganesha.sh pid DIR          print the server's pid
#
# Everything the instance owns lives under DIR: ganesha.conf, ganesha.log,
# ganesha.pid, recov/ and export/. Starting again on the same DIR (after a
# stop or kill) reuses export/ and recov/, which is what restart tests want.
# The process is stopped only through its pid file, never by name, because
# other instances may run on the same machine.
#
# Environment: GANESHA_BIND (default 127.0.0.1), GANESHA_LEASE (default 20),
# GANESHA_START_TIMEOUT seconds (default 30), GANESHA_GRACE: unset (the
# default) runs graceless, so OPEN works at once after a start but clients
# cannot reclaim state after a restart; a number N enables an N-second
# grace period with reclaim (locks survive a server restart).
# GANESHA_DELEGATIONS: the export's Delegations setting, default R (read
# delegations granted to clients with a back channel; the server recalls
# them with CB_RECALL); None turns delegations off, RW adds write ones.
set -euo pipefail

usage() {
	echo "usage: $0 start DIR PORT | stop DIR | kill DIR | pid DIR" >&2
	exit 2
}

port_open() { # port_open HOST PORT
	(exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

alive() { # alive PID
	[ -n "$1" ] && kill -0 "$1" 2>/dev/null
}

readpid() { # readpid DIR
	[ -s "$1/ganesha.pid" ] && tr -dc 0-9 <"$1/ganesha.pid" || true
}

cmd_start() {
	local dir port bind lease timeout
	[ $# -eq 2 ] || usage
	mkdir -p "$1"
	dir=$(cd "$1" && pwd)
	port=$2
	bind=${GANESHA_BIND:-127.0.0.1}
	lease=${GANESHA_LEASE:-20}
	timeout=${GANESHA_START_TIMEOUT:-30}
	local deleg=${GANESHA_DELEGATIONS:-R} nfsv4deleg=true
	case "$deleg" in
	None | none) nfsv4deleg=false ;;
	R | W | RW | r | w | rw | read | write | readwrite) ;;
	*) echo "GANESHA_DELEGATIONS must be None, R, W or RW, not $deleg" >&2; exit 2 ;;
	esac
	local grace="Graceless = true;"
	if [ -n "${GANESHA_GRACE:-}" ]; then
		grace="Graceless = false; Grace_Period = $GANESHA_GRACE;"
	fi
	command -v ganesha.nfsd >/dev/null ||
		{ echo "ganesha.nfsd not found: apt-get install nfs-ganesha nfs-ganesha-vfs" >&2; exit 1; }

	local old
	old=$(readpid "$dir")
	if alive "$old"; then
		echo "ganesha already running in $dir (pid $old)" >&2
		exit 1
	fi
	if port_open "$bind" "$port"; then
		echo "port $bind:$port is already in use" >&2
		exit 1
	fi
	mkdir -p "$dir/export" "$dir/recov"
	rm -f "$dir/ganesha.pid"
	cat >"$dir/ganesha.conf" <<EOF
NFS_CORE_PARAM {
	NFS_Port = $port;
	Bind_addr = $bind;
	Protocols = 4;
	Enable_NLM = false;
	Enable_RQUOTA = false;
	Enable_UDP = false;
}
NFSV4 {
	Minor_Versions = 1, 2;
	$grace
	Lease_Lifetime = $lease;
	RecoveryBackend = fs;
	RecoveryRoot = $dir/recov;
	Only_Numeric_Owners = true;
	Delegations = $nfsv4deleg;
}
NFS_KRB5 { Active_krb5 = false; }
EXPORT {
	Export_Id = 1;
	Path = $dir/export;
	Pseudo = /export;
	Protocols = 4;
	Transports = TCP;
	Access_Type = RW;
	Squash = No_Root_Squash;
	SecType = sys;
	Delegations = $deleg;
	FSAL { Name = VFS; }
}
EOF
	# setsid: the server must not die with the caller's process group.
	setsid ganesha.nfsd -F -f "$dir/ganesha.conf" -L "$dir/ganesha.log" \
		-p "$dir/ganesha.pid" -N NIV_EVENT </dev/null >>"$dir/ganesha.out" 2>&1 &
	local pid=$!
	echo "$pid" >"$dir/ganesha.pid"
	local i
	for ((i = 0; i < timeout * 10; i++)); do
		if ! alive "$pid"; then
			echo "ganesha exited during startup; see $dir/ganesha.log" >&2
			tail -n 20 "$dir/ganesha.log" >&2 || true
			exit 1
		fi
		if port_open "$bind" "$port"; then
			# Ganesha rewrites the pid file itself; make sure it holds our pid.
			echo "$pid" >"$dir/ganesha.pid"
			echo "$dir/ganesha.pid"
			return 0
		fi
		sleep 0.1
	done
	echo "ganesha did not open $bind:$port within ${timeout}s" >&2
	kill -9 "$pid" 2>/dev/null || true
	exit 1
}

cmd_stop() { # cmd_stop DIR SIGNAL
	local pid i
	pid=$(readpid "$1")
	if ! alive "$pid"; then
		rm -f "$1/ganesha.pid"
		return 0
	fi
	kill "-$2" "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		alive "$pid" || { rm -f "$1/ganesha.pid"; return 0; }
		sleep 0.1
	done
	kill -9 "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		alive "$pid" || { rm -f "$1/ganesha.pid"; return 0; }
		sleep 0.1
	done
	echo "ganesha pid $pid did not exit" >&2
	exit 1
}

[ $# -ge 2 ] || usage
case "$1" in
start) shift; cmd_start "$@" ;;
stop) [ $# -eq 2 ] || usage; cmd_stop "$2" TERM ;;
kill) [ $# -eq 2 ] || usage; cmd_stop "$2" KILL ;;
pid) [ $# -eq 2 ] || usage; readpid "$2"; echo ;;
*) usage ;;
esac
