#!/usr/bin/env bash
# large-files.sh: large-file throughput of Shoal's FUSE mount against
# MooseFS's and GlusterFS's, in one run on this machine (issue 27: Shoal at
# least 1.1x both on write and on read), with the CPU-seconds per GiB of
# every process of each system.
#
#   scripts/large-files.sh                    # 4 fio jobs x 256 MiB at 1 MiB, each system
#   SIZE=16m scripts/large-files.sh           # a smoke run
#   ROUNDS=3 scripts/large-files.sh           # three rounds, the table shows medians
#
# Each system gets 4 servers for its data on this machine, all on private
# addresses (127.0.0.1 for Shoal; a network namespace of their own for
# MooseFS and GlusterFS, see their scripts):
#   shoal:     shoal mds and 4 shoal ds processes, `shoal mount --access
#              cached` (scripts/cpu-per-byte.sh, MODES=fuse)
#   moosefs:   mfsmaster, 4 mfschunkserver, mfsmount (scripts/moosefs.sh,
#              its defaults, at nice 0)
#   glusterfs: a private glusterd, a distribute volume of 4 bricks (4
#              glusterfsd), its FUSE client (scripts/glusterfs.sh)
# For each: fio writes JOBS files of SIZE with BS blocks (psync, one
# process per file, end_fsync so the data is on the servers), the mount
# is replaced by a new one and the page cache dropped, and fio reads the
# files back. MiB/s is fio's aggregate bandwidth (2^20 bytes/s). The systems
# run one after another, each started and stopped here; ROUNDS goes round
# all of them ROUNDS times (a noisy stretch of the shared machine then
# does not land on one system only). The machine's load average is
# printed with the results: on a busy machine the absolute numbers say
# little, and the ratios only a little more.
#
# Environment: SHOAL (binary; default built from this checkout), SIZE
# (256m), JOBS (4), BS (1m), SYSTEMS ("shoal moosefs glusterfs"), ROUNDS
# (1), OUT (JSON file), KEEP=1 (keep the work directory). Needs root (FUSE
# mounts of the peers, network namespaces, drop_caches).
set -euo pipefail

SIZE=${SIZE:-256m}
JOBS=${JOBS:-4}
BS=${BS:-1m}
SYSTEMS=${SYSTEMS:-"shoal moosefs glusterfs"}
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-large-files.XXXXXX")
running= # the peer whose stop is owed: "moosefs DIR" or "glusterfs DIR"

cleanup() {
	local rc=$?
	set +e
	if [[ -n $running ]]; then
		"$repo/scripts/${running%% *}.sh" stop "${running#* }"
	fi
	if [[ ${KEEP:-0} == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

((EUID == 0)) || { echo "large-files.sh: run as root (FUSE mounts, network namespaces, drop_caches)" >&2; exit 1; }
for t in fio jq bc; do command -v $t >/dev/null || { echo "large-files.sh: needs $t" >&2; exit 1; }; done
if [[ -z ${SHOAL:-} ]]; then
	SHOAL=$work/shoal
	(cd "$repo" && go build -o "$SHOAL" ./cmd/shoal)
fi
hz=$(getconf CLK_TCK)
bytes_of() {
	local n=${1%[kmgKMG]} u=${1##*[0-9]}
	case $u in k | K) echo $((n << 10)) ;; m | M) echo $((n << 20)) ;; g | G) echo $((n << 30)) ;; *) echo "$n" ;; esac
}
total=$(($(bytes_of "$SIZE") * JOBS))
gib=$(echo "$total / 1073741824" | bc -l)

ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# procs_of SYSTEM DIR: "name pid" per process of a running peer.
procs_of() {
	local d=$2 f
	case $1 in
	moosefs)
		echo "master $(cat "$d/master.pid")"
		for f in "$d"/cs*.pid; do echo "$(basename "$f" .pid) $(cat "$f")"; done
		echo "mount $(cat "$d/mount.pid")"
		;;
	glusterfs)
		echo "glusterd $(cat "$d/glusterd.pid.started")"
		local i=0 p
		for f in $(find "$d/run/vols" -name '*.pid' | sort); do
			p=$(cat "$f")
			[[ $(cat "/proc/$p/comm" 2>/dev/null) == glusterfsd ]] && echo "brick$i $p" && i=$((i + 1))
		done
		echo "mount $(cat "$d/mount.pid")"
		;;
	esac
}

rows=() # JSON rows: {system, round, phase, mibps, cpu_s_per_gib: {...}}

fio_run() { # fio_run DIR RW EXTRA... -> aggregate bytes/s
	local dir=$1 rw=$2
	shift 2
	(cd "$work" && fio --name=c --rw="$rw" --bs="$BS" --size="$SIZE" --numjobs="$JOBS" --ioengine=psync \
		--directory="$dir" --group_reporting --output-format=json "$@") >"$work/fio.json"
	[[ $(jq '[.jobs[].error] | add' "$work/fio.json") == 0 ]] || { echo "fio $rw on $dir failed" >&2; exit 1; }
	jq "[.jobs[].$rw.bw_bytes] | add" "$work/fio.json"
}

# peer_phase SYSTEM DIR ROUND PHASE RW EXTRA...: one fio pass with the
# CPU of each process of the peer.
peer_phase() {
	local sys=$1 d=$2 round=$3 phase=$4 rw=$5
	shift 5
	local -a names pids before
	local n p i rate row sum=0 dt
	while read -r n p; do names+=("$n"); pids+=("$p"); before+=("$(ticks "$p")"); done < <(procs_of "$sys" "$d")
	rate=$(fio_run "$d/mnt" "$rw" "$@")
	row=$(printf '{"system":"%s","round":%d,"phase":"%s","mibps":%.1f,"cpu_s_per_gib":{' "$sys" "$round" "$phase" "$(echo "$rate / 1048576" | bc -l)")
	for i in "${!pids[@]}"; do
		dt=$(($(ticks "${pids[$i]}") - ${before[$i]}))
		sum=$((sum + dt))
		row+=$(printf '"%s":%.3f,' "${names[$i]}" "$(echo "$dt / $hz / $gib" | bc -l)")
	done
	row+=$(printf '"total":%.3f}}' "$(echo "$sum / $hz / $gib" | bc -l)")
	rows+=("$row")
}

run_peer() { # run_peer SYSTEM ROUND
	local sys=$1 round=$2 d=$work/$1
	rm -rf "$d"
	case $sys in
	moosefs) "$repo/scripts/moosefs.sh" start "$d" 9520 4 >/dev/null ;;
	glusterfs) "$repo/scripts/glusterfs.sh" start "$d" 4 >/dev/null ;;
	esac
	running="$sys $d"
	peer_phase "$sys" "$d" "$round" write write --end_fsync=1
	"$repo/scripts/$sys.sh" remount "$d"
	drop_caches
	peer_phase "$sys" "$d" "$round" read read
	rm -f "$d/mnt"/c.*
	"$repo/scripts/$sys.sh" stop "$d"
	running=
	rm -rf "$d"
}

run_shoal() { # run_shoal ROUND: cpu-per-byte.sh's fuse mode, its rows relabelled
	local round=$1
	SHOAL=$SHOAL SIZE=$SIZE JOBS=$JOBS BS=$BS DS=4 MODES=fuse OUT="$work/shoal.json" \
		"$repo/scripts/cpu-per-byte.sh" >/dev/null 2>"$work/shoal.log" || { cat "$work/shoal.log" >&2; exit 1; }
	local r
	while read -r r; do rows+=("$r"); done < <(jq -c --argjson round "$round" \
		'.results[] | {system: "shoal", round: $round, phase, mibps, cpu_s_per_gib: (.cpu_s_per_gib | with_entries(if .key == "client" then .key = "mount" else . end))}' \
		"$work/shoal.json")
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "large files: $JOBS fio jobs x $SIZE at $BS, systems: $SYSTEMS, rounds: $ROUNDS; load average before: $load0" >&2
for round in $(seq 1 "$ROUNDS"); do
	for sys in $SYSTEMS; do
		echo "round $round: $sys (load $(cut -d' ' -f1 /proc/loadavg))" >&2
		case $sys in
		shoal) run_shoal "$round" ;;
		moosefs | glusterfs) run_peer "$sys" "$round" ;;
		*) echo "unknown system $sys" >&2; exit 2 ;;
		esac
	done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

json=$(printf '%s\n' "${rows[@]}" | jq -s --arg size "$SIZE" --argjson jobs "$JOBS" --arg bs "$BS" --argjson rounds "$ROUNDS" \
	--arg load0 "$load0" --arg load1 "$load1" '
	def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	. as $rows
	| {size: $size, jobs: $jobs, bs: $bs, rounds: $rounds, load_before: $load0, load_after: $load1, runs: $rows,
	   median: ([$rows[] | {system, phase}] | unique | map(. as $k | {system: $k.system, phase: $k.phase,
	     mibps: ([$rows[] | select(.system == $k.system and .phase == $k.phase) | .mibps] | median),
	     cpu_s_per_gib: ([$rows[] | select(.system == $k.system and .phase == $k.phase) | .cpu_s_per_gib.total] | median)}))}')

# The table: median MiB/s and total CPU-s/GiB per system and phase, the
# ratios Shoal / peer, then Shoal's CPU per process.
{
	echo
	printf '%-10s %10s %10s %12s %12s\n' system "write MiB/s" "read MiB/s" "write CPU-s/GiB" "read CPU-s/GiB"
	for sys in $SYSTEMS; do
		jq -r --arg s "$sys" '[.median[] | select(.system == $s)] as $m
			| [$s, ($m[] | select(.phase == "write") | .mibps), ($m[] | select(.phase == "read") | .mibps),
			   ($m[] | select(.phase == "write") | .cpu_s_per_gib), ($m[] | select(.phase == "read") | .cpu_s_per_gib)] | @tsv' <<<"$json" |
			awk -F'\t' '{printf "%-10s %10.1f %10.1f %12.2f %12.2f\n", $1, $2, $3, $4, $5}'
	done
	if [[ " $SYSTEMS " == *" shoal "* ]]; then
		for peer in moosefs glusterfs; do
			[[ " $SYSTEMS " == *" $peer "* ]] || continue
			jq -r --arg p "$peer" '
				def m($s; $ph): [.median[] | select(.system == $s and .phase == $ph) | .mibps][0];
				"shoal / \($p): write \(m("shoal"; "write") / m($p; "write") * 100 | round / 100)x, read \(m("shoal"; "read") / m($p; "read") * 100 | round / 100)x (target: 1.1x on both)"' <<<"$json"
		done
		echo "Shoal's CPU-s per GiB by process (median of rounds):"
		jq -r '[.runs[] | select(.system == "shoal")] | group_by(.phase)[] | .[0].phase as $ph
			| (map(.cpu_s_per_gib) | .[0] | keys_unsorted) as $ks
			| "  \($ph): " + ([$ks[] as $k | "\($k) \([.[].cpu_s_per_gib[$k]] | sort | .[length / 2 | floor])"] | join(", "))' <<<"$json"
	fi
	echo "load average before: $load0; after: $load1 ($(nproc) CPUs)"
} >&2
echo "$json"
[[ -n $OUT ]] && echo "$json" >"$OUT"
exit 0
