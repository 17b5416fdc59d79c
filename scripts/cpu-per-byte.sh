#!/usr/bin/env bash
# cpu-per-byte.sh: CPU-seconds per GiB that each Shoal process spends on
# large sequential I/O (issue 27, "the data path's CPU per byte").
#
#   scripts/cpu-per-byte.sh                     # 4 jobs x 256 MiB at 1 MiB, fuse and lib
#   SIZE=64m MODES=fuse scripts/cpu-per-byte.sh # smaller, FUSE only
#   SHOAL=/tmp/old/shoal scripts/cpu-per-byte.sh  # another build (an older commit)
#
# One MDS and DS data servers run as separate processes (shoal mds, shoal
# ds) on 127.0.0.1, so that each one's CPU can be read from
# /proc/PID/stat (utime + stime) before and after each phase. Two ways in:
#   fuse: `shoal mount --access cached`; fio writes JOBS files of SIZE with
#         BS blocks (psync, end_fsync), the mount is unmounted, the page
#         cache dropped (when root), a new mount reads them back with fio.
#         The mount's CPU is its own process's.
#   lib:  `shoal cp` (the Go client library) copies JOBS files of SIZE from
#         /dev/shm to the cluster with --chunk BS, the page cache is dropped,
#         and a second `shoal cp` copies them back to /dev/shm. The
#         client's CPU is that of the shoal cp process.
# The write phase ends when the data is on the data servers (fio's
# end_fsync; shoal cp's close), so their CPU for the bytes is counted.
# For each phase it prints MB/s (10^6 bytes/s: fio's aggregate bandwidth
# for fuse, bytes over the copy's time for lib; the JSON has MiB/s too)
# and CPU-s per GiB (2^30 bytes) moved for the client, the MDS, each data
# server, and the sum; then the same as JSON (to OUT too if set).
#
# Environment: SHOAL (binary; default built from this checkout), SIZE
# (per file, fio syntax: 256m), JOBS (4), BS (1m), DS (4), MODES ("fuse
# lib"), PERF=DIR (also record `perf record -g` of every Shoal process
# per phase into DIR/MODE-PHASE.perf.data, for `perf report`), OUT (JSON
# file), KEEP=1 (keep the work directory). Everything listens on
# 127.0.0.1 only; the processes started here are stopped by PID on exit.
set -euo pipefail

SIZE=${SIZE:-256m}
JOBS=${JOBS:-4}
BS=${BS:-1m}
DS=${DS:-4}
MODES=${MODES:-"fuse lib"}
PERF=${PERF:-}
OUT=${OUT:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-cpu-per-byte.XXXXXX")
shm=
mnt=$work/mnt
pids=() # every process started here (mds, data servers, mounts)

stop_pid() { # stop_pid PID: SIGTERM, SIGKILL after 10 s
	local pid=$1
	kill -0 "$pid" 2>/dev/null || return 0
	kill "$pid" 2>/dev/null
	for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null
}
cleanup() {
	local rc=$?
	set +e
	if mountpoint -q "$mnt" 2>/dev/null; then
		fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
	fi
	local p
	for p in "${pids[@]}"; do stop_pid "$p"; done
	[[ -n $shm ]] && rm -rf "$shm"
	if [[ ${KEEP:-0} == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for t in fio jq bc; do command -v $t >/dev/null || { echo "cpu-per-byte.sh: needs $t" >&2; exit 1; }; done
if [[ -z ${SHOAL:-} ]]; then
	SHOAL=$work/shoal
	(cd "$repo" && go build -o "$SHOAL" ./cmd/shoal)
fi
hz=$(getconf CLK_TCK)
bytes_of() { # bytes_of 256m -> 268435456
	local n=${1%[kmgKMG]} u=${1##*[0-9]}
	case $u in k | K) echo $((n << 10)) ;; m | M) echo $((n << 20)) ;; g | G) echo $((n << 30)) ;; *) echo "$n" ;; esac
}
total=$(($(bytes_of "$SIZE") * JOBS))
bsbytes=$(bytes_of "$BS")

# ticks PID: utime + stime of a live process, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
drop_caches() {
	sync
	if [[ -w /proc/sys/vm/drop_caches ]]; then echo 3 >/proc/sys/vm/drop_caches; fi
}

# 1. The cluster: shoal mds, then DS shoal ds processes.
"$SHOAL" mds --listen 127.0.0.1:0 --no-root-squash --dir "$work/mds" --log-level info >"$work/mds.log" 2>&1 &
mds_pid=$!
pids+=("$mds_pid")
addr=
for _ in $(seq 1 300); do
	addr=$(sed -n 's/.*msg="shoal mds ready".* listen=\([^ ]*\).*/\1/p' "$work/mds.log")
	[[ -n $addr ]] && break
	kill -0 "$mds_pid" 2>/dev/null || { cat "$work/mds.log" >&2; echo "shoal mds died" >&2; exit 1; }
	sleep 0.1
done
[[ $addr == 127.0.0.1:* ]] || { cat "$work/mds.log" >&2; echo "no MDS address" >&2; exit 1; }
secret=$work/mds/join-secret
ds_pids=()
for ((i = 0; i < DS; i++)); do
	"$SHOAL" ds --mds "$addr" --join-secret-file "$secret" --listen 127.0.0.1:0 --dir "$work/ds$i" \
		--log-level warn >"$work/ds$i.log" 2>&1 &
	ds_pids+=($!)
	pids+=($!)
done
up=0
for _ in $(seq 1 300); do
	up=$("$SHOAL" admin status --mds "$addr" --join-secret-file "$secret" --json 2>/dev/null | grep -c '"Up": true' || true)
	((up >= DS)) && break
	sleep 0.1
done
((up >= DS)) || { echo "only $up of $DS data servers up after 30 s" >&2; exit 1; }
echo "cluster: MDS $addr (pid $mds_pid), $DS data servers (pids ${ds_pids[*]}); $JOBS x $SIZE at $BS; $("$SHOAL" version 2>/dev/null | head -1)" >&2
mkdir -p "$mnt"

# Per phase: CPU ticks of each server before and after, and the client's.
names=(mds)
for ((i = 0; i < DS; i++)); do names+=("ds$i"); done
server_pids=("$mds_pid" "${ds_pids[@]}")
declare -A before
snap() { local i; for i in "${!server_pids[@]}"; do before[$i]=$(ticks "${server_pids[$i]}"); done; }
perf_pid=
perf_start() { # perf_start NAME PID...
	[[ -z $PERF ]] && return 0
	mkdir -p "$PERF"
	local name=$1
	shift
	perf record -q -F 499 -g -o "$PERF/$name.perf.data" -p "$(
		IFS=,
		echo "$*"
	)" >/dev/null 2>&1 &
	perf_pid=$!
	sleep 0.2
}
perf_stop() {
	[[ -z $perf_pid ]] && return 0
	kill -INT "$perf_pid" 2>/dev/null
	wait "$perf_pid" 2>/dev/null || true
	perf_pid=
}
results=()
# record MODE PHASE SECONDS CLIENT_TICKS [BYTES_PER_S]: one JSON row from
# the snapshot. The rate is fio's aggregate bandwidth when given, else
# bytes over SECONDS.
record() {
	local mode=$1 phase=$2 secs=$3 client=$4 rate=${5:-} i d sum=$4 row
	local gib
	gib=$(echo "$total / 1073741824" | bc -l)
	[[ -n $rate ]] || rate=$(echo "$total / $secs" | bc -l)
	row=$(printf '{"mode":"%s","phase":"%s","bytes":%d,"seconds":%.3f,"mbps":%.1f,"mibps":%.1f,"cpu_s_per_gib":{"client":%.3f' \
		"$mode" "$phase" "$total" "$secs" "$(echo "$rate / 1000000" | bc -l)" "$(echo "$rate / 1048576" | bc -l)" "$(echo "$client / $hz / $gib" | bc -l)")
	for i in "${!server_pids[@]}"; do
		d=$(($(ticks "${server_pids[$i]}") - ${before[$i]}))
		sum=$((sum + d))
		row+=$(printf ',"%s":%.3f' "${names[$i]}" "$(echo "$d / $hz / $gib" | bc -l)")
	done
	row+=$(printf ',"total":%.3f}}' "$(echo "$sum / $hz / $gib" | bc -l)")
	results+=("$row")
}
now() { date +%s.%N; }

fio_run() { # fio_run RW EXTRA...
	local rw=$1
	shift
	(cd "$work" && fio --name=c --rw="$rw" --bs="$BS" --size="$SIZE" --numjobs="$JOBS" --ioengine=psync \
		--directory="$mnt" --group_reporting --output-format=json "$@") >"$work/fio.$rw.json"
	[[ $(jq '[.jobs[].error] | add' "$work/fio.$rw.json") == 0 ]] || { echo "fio $rw failed" >&2; exit 1; }
}
fio_rate() { jq "[.jobs[].$1.bw_bytes] | add" "$work/fio.$1.json"; } # fio_rate RW: aggregate bytes/s
mount_shoal() { # starts the mount in the foreground as a child; sets mount_pid
	"$SHOAL" mount --access cached "nfs://$addr/" "$mnt" >>"$work/mount.log" 2>&1 &
	mount_pid=$!
	pids+=("$mount_pid")
	for _ in $(seq 1 300); do
		mountpoint -q "$mnt" && return 0
		kill -0 "$mount_pid" 2>/dev/null || { cat "$work/mount.log" >&2; echo "mount died" >&2; exit 1; }
		sleep 0.1
	done
	echo "mount not up after 30 s" >&2
	exit 1
}
unmount_shoal() {
	fusermount3 -u "$mnt" 2>/dev/null || "$SHOAL" umount "$mnt"
	for _ in $(seq 1 100); do kill -0 "$mount_pid" 2>/dev/null || break; sleep 0.1; done
	stop_pid "$mount_pid"
}

run_fuse() {
	local t0 t1 c0
	mount_shoal
	snap
	c0=$(ticks "$mount_pid")
	perf_start fuse-write "$mount_pid" "${server_pids[@]}"
	t0=$(now)
	fio_run write --end_fsync=1
	t1=$(now)
	perf_stop
	record fuse write "$(echo "$t1 - $t0" | bc -l)" $(($(ticks "$mount_pid") - c0)) "$(fio_rate write)"
	unmount_shoal
	drop_caches
	mount_shoal
	snap
	c0=$(ticks "$mount_pid")
	perf_start fuse-read "$mount_pid" "${server_pids[@]}"
	t0=$(now)
	fio_run read
	t1=$(now)
	perf_stop
	record fuse read "$(echo "$t1 - $t0" | bc -l)" $(($(ticks "$mount_pid") - c0)) "$(fio_rate read)"
	rm -f "$mnt"/c.*
	unmount_shoal
}

# cp_timed SRC DST: runs shoal cp, prints "SECONDS CLIENT_TICKS".
cp_timed() {
	local t0 t1 p c=0 n
	t0=$(now)
	"$SHOAL" cp -r --chunk "$bsbytes" --log-level warn "$1" "$2" >"$work/cp.log" 2>&1 &
	p=$!
	perf_start "$phase_name" "$p" "${server_pids[@]}"
	# Its last reading of /proc before it exits is its CPU (a child's
	# rusage is not visible to bash); read every 20 ms.
	while n=$(ticks "$p" 2>/dev/null); do
		c=$n
		sleep 0.02
	done
	wait "$p" || { cat "$work/cp.log" >&2; echo "shoal cp $1 $2 failed" >&2; exit 1; }
	t1=$(now)
	perf_stop
	echo "$(echo "$t1 - $t0" | bc -l) $c"
}

run_lib() {
	local r
	shm=$(mktemp -d /dev/shm/shoal-cpb.XXXXXX)
	mkdir -p "$shm/src"
	for ((j = 0; j < JOBS; j++)); do
		head -c "$(bytes_of "$SIZE")" /dev/urandom >"$shm/src/f$j"
	done
	snap
	phase_name=lib-write
	r=$(cp_timed "$shm/src" "nfs://$addr/lib")
	record lib write ${r% *} ${r#* }
	drop_caches
	snap
	phase_name=lib-read
	r=$(cp_timed "nfs://$addr/lib" "$shm/back")
	record lib read ${r% *} ${r#* }
	cmp -s "$shm/src/f0" "$shm/back/f0" || { echo "lib: read back differs" >&2; exit 1; }
	rm -rf "$shm"
	shm=
}

for m in $MODES; do
	case $m in
	fuse) run_fuse ;;
	lib) run_lib ;;
	*) echo "unknown mode $m" >&2; exit 2 ;;
	esac
done

# 2. The table and the JSON.
{
	printf '%-5s %-6s %8s %8s' mode phase MB/s client
	for n in "${names[@]}"; do printf ' %7s' "$n"; done
	printf ' %7s\n' total
	for r in "${results[@]}"; do
		jq -r --argjson n "$(printf '%s\n' "${names[@]}" | jq -R . | jq -s .)" \
			'[.mode, .phase, (.mbps|tostring), (.cpu_s_per_gib.client|tostring)] + [$n[] as $k | .cpu_s_per_gib[$k]|tostring] + [(.cpu_s_per_gib.total|tostring)] | @tsv' <<<"$r" |
			awk -F'\t' '{printf "%-5s %-6s %8.1f %8.3f", $1, $2, $3, $4; for (i = 5; i < NF; i++) printf " %7.3f", $i; printf " %7.3f\n", $NF}'
	done
	echo "(CPU-seconds per GiB moved, per process; client = shoal mount or shoal cp; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
} >&2
json=$(printf '%s\n' "${results[@]}" | jq -s --arg load "$(cut -d' ' -f1-3 /proc/loadavg)" --arg size "$SIZE" --argjson jobs "$JOBS" --arg bs "$BS" --argjson ds "$DS" \
	'{size: $size, jobs: $jobs, bs: $bs, data_servers: $ds, load_after: $load, results: .}')
echo "$json"
[[ -n $OUT ]] && echo "$json" >"$OUT"
exit 0
