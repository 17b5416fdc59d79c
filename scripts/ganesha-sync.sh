#!/usr/bin/env bash
# ganesha-sync.sh: what each server of issue 27's `shoal bench` comparison
# does to make a metadata change durable before it answers. For NFS-Ganesha
# (VFS backend, scripts/ganesha.sh), `shoal serve` (synced, the default) and
# `shoal serve --sync=false`, one after the other on loopback, it starts the
# server, attaches strace to every thread of it, drives FILES creates
# (OPEN(CREATE)+CLOSE of an empty file), stats and removes with
# `shoal bench --addr` (Shoal's Go client, one operation at a time), and
# prints the system calls that can make data or metadata durable
# (fsync, fdatasync, syncfs, sync, sync_file_range, msync) per change and
# the opens with O_SYNC or O_DSYNC.
#
# Why: the remove target of `scripts/ganesha-bench.sh` compares rates, and a
# rate means little without knowing whether the reply waited for stable
# storage. A server that makes no such call answers before its change is
# durable (ext4 commits its journal every 5 s by default), which is what
# `shoal serve --sync=false` offers as the opt-in.
#
# strace slows every server down: read the counts here, the rates from
# scripts/ganesha-bench.sh. Needs root, strace and ganesha.nfsd.
#
#   FILES (1000) files per target; TARGETS (ganesha shoal shoal-async).
set -euo pipefail
cd "$(dirname "$0")/.."
files=${FILES:-1000}
targets=${TARGETS:-ganesha shoal shoal-async}
for tool in strace ganesha.nfsd; do
	command -v "$tool" >/dev/null || { echo "ganesha-sync.sh: $tool not found" >&2; exit 1; }
done
work=$(mktemp -d)
spid= gdir= tpid=
cleanup() {
	[ -n "$tpid" ] && kill "$tpid" 2>/dev/null || true
	[ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null || true
	[ -n "$gdir" ] && scripts/ganesha.sh stop "$gdir" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/shoal" ./cmd/shoal

free_port() { # a free TCP port on 127.0.0.1, from the kernel
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() { # wait_port PORT: up to 30 s for the server to accept
	for _ in $(seq 300); do
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.1
	done
	echo "ganesha-sync.sh: nothing listens on 127.0.0.1:$1" >&2
	return 1
}

printf '%-12s %8s %8s %9s %10s %8s %8s  %s\n' target changes fsync fdatasync other-sync per-change sync-opens root
for t in $targets; do
	port=$(free_port)
	case $t in
	ganesha)
		gdir=$work/ganesha
		scripts/ganesha.sh start "$gdir" "$port" >/dev/null
		pid=$(scripts/ganesha.sh pid "$gdir")
		root=/export
		;;
	shoal | shoal-async)
		sync=true
		[ "$t" = shoal-async ] && sync=false
		mkdir -p "$work/data-$t"
		"$work/shoal" serve --listen "127.0.0.1:$port" --dir "$work/data-$t" --sync="$sync" \
			--no-root-squash --log-level warn >"$work/$t.log" 2>&1 &
		spid=$!
		pid=$spid
		wait_port "$port"
		root=/
		;;
	*) echo "ganesha-sync.sh: unknown target $t" >&2; exit 2 ;;
	esac
	# One tracer per process (ptrace allows no second one); -f follows
	# every thread, and each call is counted where it starts.
	strace -f -qq -o "$work/$t.trace" -p "$pid" \
		-e trace=fsync,fdatasync,syncfs,sync,sync_file_range,msync,open,openat &
	tpid=$!
	sleep 1
	"$work/shoal" bench --addr "127.0.0.1:$port" --root "$root" --workloads small \
		--files "$files" --reps 1 >"$work/$t.bench" 2>&1 ||
		{ cat "$work/$t.bench" >&2; exit 1; }
	kill -INT "$tpid"
	wait "$tpid" 2>/dev/null || true
	tpid=
	count() { grep -cE "^[0-9]+ +$1\\(" "$work/$t.trace" || true; }
	fs=$(count fsync) fds=$(count fdatasync)
	other=$(($(count syncfs) + $(count sync) + $(count sync_file_range) + $(count msync)))
	opens=$(grep -E '^[0-9]+ +open(at)?\(' "$work/$t.trace" | grep -cE 'O_D?SYNC' || true)
	changes=$((2 * files))
	printf '%-12s %8d %8d %9d %10d %8.2f %8d  %s\n' "$t" "$changes" "$fs" "$fds" "$other" \
		"$(awk -v n=$((fs + fds + other)) -v d=$changes 'BEGIN { print n / d }')" "$opens" "$root"
	case $t in
	ganesha) scripts/ganesha.sh stop "$gdir" >/dev/null; gdir= ;;
	*) kill "$spid"; wait "$spid" 2>/dev/null || true; spid= ;;
	esac
done
echo "changes = $files creates + $files removes (stats change nothing); per-change = durable-making calls per change"
