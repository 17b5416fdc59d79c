#!/usr/bin/env bash
# fio-access.sh: sequential fio write/read throughput of `shoal mount` for
# each access method (cached, odirect, direct) and block size, plus a
# postmark small-file run on the cached mount. Prints a table and writes it
# as markdown to docs/access-methods.md.
#
#   scripts/fio-access.sh                       # 256 MiB file, bs 4k 64k 1m 4m, 3 runs
#   SIZE=512m RUNS=5 scripts/fio-access.sh      # bigger file, more runs
#
# Environment: SHOAL (binary; default: built from this checkout), SIZE (fio
# --size of the one-stream pass), BSS (its block sizes), JOBS (stream
# counts of the parallel passes; JOBS=0 skips them), PSIZE (--size per
# stream in them; default SIZE), PBSS (their block sizes),
# METHODS, RUNS (runs per cell; the table shows
# the median), RUNTIME (fio --runtime cap per pass, seconds), DOC (markdown
# output; DOC= to skip), KEEP=1 (keep work dir), VERDICT_SIZE and
# VERDICT_RUNS (below these, 128m per stream and 3 runs, the checks say
# "no verdict at this size").
#
# Each (method, bs): mount, fio write (crc32c verify headers, end_fsync),
# unmount and remount so the read cannot come from the FUSE page cache, fio
# read with --verify=crc32c --do_verify=1 (data checked, read MB/s includes
# the crc32c check), unmount. Passes: one stream (one fio process, one
# request at a time), and for each N in JOBS, N streams (fio --numjobs=N,
# each process streaming its own PSIZE file, aggregate MB/s), the shape of
# an MPI-IO application whose processes each move large blocks, for PBSS
# block sizes. The runs go round all cells in turn (run 1 of
# every cell, then run 2, ...) so that a noisy stretch of the shared
# machine does not land on one cell only. Everything listens on 127.0.0.1
# only; the cluster and mounts started here are stopped and the work
# directory removed on exit, also on error or Ctrl-C.
set -euo pipefail

SIZE=${SIZE:-256m}
BSS=${BSS:-"4k 64k 1m 4m"}
JOBS=${JOBS:-"4 8"}
PSIZE=${PSIZE:-$SIZE}
PBSS=${PBSS:-"64k 1m 4m"}
METHODS=${METHODS:-"cached odirect direct"}
RUNS=${RUNS:-3}
RUNTIME=${RUNTIME:-120}
repo=$(cd "$(dirname "$0")/.." && pwd)
DOC=${DOC-$repo/docs/access-methods.md}
cmdline="$0${*:+ $*}"
envline="SIZE=$SIZE BSS=\"$BSS\" JOBS=\"$JOBS\" PSIZE=$PSIZE PBSS=\"$PBSS\" METHODS=\"$METHODS\" RUNS=$RUNS RUNTIME=$RUNTIME"
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-fio-access.XXXXXX")
mnt=$work/mnt
DS=2
# shellcheck source=lib/shoal-cluster.sh
. "$repo/scripts/lib/shoal-cluster.sh"

cleanup() {
	local rc=$?
	set +e
	shoal_stop "$mnt"
	if [[ ${KEEP:-0} == 1 ]]; then echo "kept $work"; else rm -rf "$work"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. Tools.
need=()
command -v fio >/dev/null || need+=(fio)
command -v postmark >/dev/null || need+=(postmark)
command -v jq >/dev/null || need+=(jq)
command -v bc >/dev/null || need+=(bc)
if ((${#need[@]})); then
	sudo=; ((EUID == 0)) || sudo=sudo
	$sudo apt-get install -y "${need[@]}" >/dev/null 2>&1 ||
		{ $sudo apt-get update >/dev/null && $sudo apt-get install -y "${need[@]}" >/dev/null; }
fi

shoal_build

# 2. One cluster with 2 data servers on a kernel-chosen loopback port.
shoal_up
echo "cluster: $addr, 2 data servers"
mkdir -p "$mnt"

mount_as() { # mount_as METHOD
	"$SHOAL" mount --foreground=false --access "$1" "nfs://$addr/" "$mnt" 2>"$work/mount.log" ||
		{ cat "$work/mount.log" >&2; echo "mount ($1) failed" >&2; exit 1; }
}
unmount() {
	"$SHOAL" umount "$mnt" || fusermount3 -u "$mnt"
	for _ in $(seq 1 100); do mountpoint -q "$mnt" || return 0; sleep 0.1; done
	echo "unmount of $mnt timed out" >&2
	exit 1
}
fio_pass() { # fio_pass STREAMS RW BS EXTRA... -> prints aggregate MB/s (10^6 bytes/s)
	local streams=$1 rw=$2 bs=$3 out=$work/fio.$2.json size=$SIZE
	shift 3
	((streams > 1)) && size=$PSIZE
	# From the work directory, without a verify state file: fio would
	# otherwise leave one in the current directory. Each of the STREAMS
	# processes moves its own file; group reporting sums them.
	(cd "$work" && fio --name=w --rw="$rw" --bs="$bs" --size="$size" --ioengine=psync --runtime="$RUNTIME" \
		--numjobs="$streams" --group_reporting --directory="$mnt" --output-format=json \
		--verify=crc32c --verify_state_save=0 "$@") >"$out"
	local errs
	errs=$(jq '[.jobs[].error] | add' "$out")
	[[ $errs == 0 ]] || { echo "fio $rw bs=$bs streams=$streams: error $errs" >&2; exit 1; }
	printf '%.1f\n' "$(jq -r "[.jobs[].$rw.bw_bytes] | add / 1e6" "$out")"
}

median() { # median VALUE... (middle value; mean of the two middle ones for an even count)
	printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {
		if (NR % 2) printf "%.1f\n", v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# 3. fio per pass, method and block size, RUNS times round all cells. Keys
# of W, R (medians) and WRUNS, RRUNS (every run): STREAMS,METHOD,BS.
passes=(1)
for j in $JOBS; do ((j > 1)) && passes+=("$j"); done
bss_of() { if (($1 == 1)); then echo "$BSS"; else echo "$PBSS"; fi; }
declare -A W R WRUNS RRUNS
for run in $(seq 1 "$RUNS"); do
	for p in "${passes[@]}"; do
		for m in $METHODS; do
			for bs in $(bss_of "$p"); do
				mount_as "$m"
				rm -f "$mnt"/w.*
				w=$(fio_pass "$p" write "$bs" --end_fsync=1 --do_verify=0)
				unmount
				mount_as "$m"
				r=$(fio_pass "$p" read "$bs" --do_verify=1 --invalidate=1)
				rm -f "$mnt"/w.*
				unmount
				k=$p,$m,$bs
				WRUNS[$k]+="${WRUNS[$k]:+ }$w"
				RRUNS[$k]+="${RRUNS[$k]:+ }$r"
				printf 'run %d/%d streams %d %-8s %-4s write %8s MB/s  read+verify %8s MB/s\n' \
					"$run" "$RUNS" "$p" "$m" "$bs" "$w" "$r"
			done
		done
	done
done
for k in "${!WRUNS[@]}"; do
	# shellcheck disable=SC2086 # word splitting of the run list is intended
	W[$k]=$(median ${WRUNS[$k]})
	# shellcheck disable=SC2086
	R[$k]=$(median ${RRUNS[$k]})
done

# 4. postmark on the cached mount.
mount_as cached
mkdir -p "$mnt/pm"
cat >"$work/pm.cfg" <<EOF
set location $mnt/pm
set number 500
set transactions 2000
set size 500 10000
run
quit
EOF
pm_status=failed
pm_time=-
if (cd "$work" && timeout 600 postmark "$work/pm.cfg") >"$work/pm.out" 2>&1 && grep -q 'transactions' "$work/pm.out"; then
	pm_status=completed
	pm_time=$(sed -n 's/^Time:$//;s/^[[:space:]]*\([0-9]*\) seconds total$/\1/p' "$work/pm.out" | head -1)
fi
rm -rf "$mnt/pm"
unmount
echo "postmark (cached, 500 files, 2000 transactions): $pm_status in ${pm_time:-?} s"


# 5. Tables.
table() { # table STREAMS
	echo "| method | bs | write MB/s | read MB/s | write runs | read runs |"
	echo "|---|---|---:|---:|---:|---:|"
	local m bs k
	for m in $METHODS; do
		for bs in $(bss_of "$1"); do
			k=$1,$m,$bs
			echo "| $m | $bs | ${W[$k]} | ${R[$k]} | ${WRUNS[$k]// / \/ } | ${RRUNS[$k]// / \/ } |"
		done
	done
}
for p in "${passes[@]}"; do
	echo
	echo "$p stream(s):"
	table "$p" | sed '2d;s/^| //;s/ |$//;s/ | /\t/g' | column -t -s $'\t'
done

# The checks compare medians of throughput. On a few MiB, run once (the
# smoke run of scripts/test.sh), they measure mount, fsync and the noise
# of a shared machine rather than the access methods, so a pass whose
# files are smaller than VERDICT_SIZE, or any run with fewer than
# VERDICT_RUNS runs per cell, shows its numbers with "no verdict at this
# size" instead of holds or DOES NOT HOLD.
VERDICT_SIZE=${VERDICT_SIZE:-128m}
VERDICT_RUNS=${VERDICT_RUNS:-3}
mib() { # mib SIZE: a fio size (4096, 8k, 256m, 1g) in whole MiB
	local s=${1,,}
	s=${s%ib} s=${s%b}
	case $s in
	*k) echo $((${s%k} / 1024)) ;;
	*m) echo "${s%m}" ;;
	*g) echo $((${s%g} * 1024)) ;;
	*t) echo $((${s%t} * 1024 * 1024)) ;;
	*) echo $((s / 1048576)) ;;
	esac
}
judged() { # judged STREAMS: whether that pass was big enough for a verdict
	local size=$SIZE
	(($1 == 1)) || size=$PSIZE
	((RUNS >= VERDICT_RUNS && $(mib "$size") >= $(mib "$VERDICT_SIZE")))
}

# The issue's checks, on the medians: cached 4k writes >= 80% of cached 1m
# writes (one stream); direct 1m the fastest method for large sequential
# I/O, i.e. direct 1m >= cached and odirect at 1m and at 4m, for writes and
# for reads, in each pass.
checks() {
	local p
	for p in "${passes[@]}"; do
		if ! judged "$p"; then
			echo "- no verdicts below $VERDICT_SIZE per stream and $VERDICT_RUNS runs per cell (this run: SIZE=$SIZE, PSIZE=$PSIZE, RUNS=$RUNS); the numbers are shown as measured"
			break
		fi
	done
	local c4=${W[1,cached,4k]:-} c1=${W[1,cached,1m]:-}
	if [[ -n $c4 && -n $c1 ]]; then
		local pct verdict="no verdict at this size"
		pct=$(echo "scale=0; 100 * $c4 / $c1" | bc)
		if judged 1; then
			verdict=$( ((pct >= 80)) && echo holds || echo DOES NOT HOLD)
		fi
		echo "- cached 4k write = $pct% of cached 1m write, one stream (want >= 80%): $verdict"
	fi
	local dir k v d m bs slower beaten
	for p in "${passes[@]}"; do
		[[ -n ${W[$p,direct,1m]:-} ]] || continue
		for dir in write read; do
			slower=() beaten=()
			if [[ $dir == write ]]; then d=${W[$p,direct,1m]}; else d=${R[$p,direct,1m]}; fi
			for m in $METHODS; do
				[[ $m == direct ]] && continue
				for bs in 1m 4m; do
					k=$p,$m,$bs
					[[ -n ${W[$k]:-} ]] || continue
					if [[ $dir == write ]]; then v=${W[$k]}; else v=${R[$k]}; fi
					if (($(echo "$d >= $v" | bc))); then slower+=("$m $bs $v"); else beaten+=("$m $bs $v"); fi
				done
			done
			if ! judged "$p"; then
				local others=("${slower[@]}" "${beaten[@]}")
				echo "- large sequential $dir, $p stream(s): direct 1m ($d MB/s) against $(IFS=,; echo "${others[*]}" | sed 's/,/, /g'): no verdict at this size"
			elif ((${#beaten[@]} == 0)); then
				echo "- large sequential $dir, $p stream(s): direct 1m ($d MB/s) >= $(IFS=,; echo "${slower[*]}" | sed 's/,/, /g'): holds"
			else
				echo "- large sequential $dir, $p stream(s): direct 1m ($d MB/s) is beaten by $(IFS=,; echo "${beaten[*]}" | sed 's/,/, /g'): DOES NOT HOLD"
			fi
		done
	done
}
echo
checks

# The generated part of DOC ends at this marker; what follows it (notes
# added by hand) is kept.
marker='<!-- end of scripts/fio-access.sh output -->'
if [[ -n $DOC ]]; then
	{
		echo "# Access methods: fio sequential throughput"
		echo
		echo "Generated by \`scripts/fio-access.sh\` on $(date -u +%Y-%m-%d) ($(uname -sr), $(nproc) cores)."
		echo
		echo "Machine note: 2 cores, shared and noisy; numbers vary run to run by tens of percent"
		echo "and fio, the FUSE client, the MDS and both data servers all share those cores. Each"
		echo "cell ran $RUNS times (round all cells in turn); the MB/s columns are the medians, the"
		echo "runs columns every run in order."
		echo
		echo "Command: \`$envline $cmdline\`"
		echo
		echo "Setup: one \`shoal up --ds 2\` on 127.0.0.1; \`shoal mount --access METHOD\`; per block size"
		echo "\`fio --name=w --rw=write --bs=BS --size=SIZE --ioengine=psync --numjobs=STREAMS --group_reporting --end_fsync=1 --verify=crc32c --do_verify=0\`,"
		echo "then unmount and remount (drops the FUSE page cache), then"
		echo "\`fio --name=w --rw=read --bs=BS --size=SIZE --ioengine=psync --numjobs=STREAMS --group_reporting --verify=crc32c --do_verify=1 --invalidate=1\`"
		echo "(read MB/s includes the crc32c check of every block). Each stream is one fio process with"
		echo "its own file of SIZE ($SIZE with one stream, $PSIZE each with several); MB/s = 10^6 bytes/s"
		echo "summed over the streams, from fio's JSON."
		echo
		echo "The cached mount uses the kernel's writeback cache: write(2) fills the page cache and"
		echo "the kernel sends large WRITEs later (fio's end_fsync waits for them, so the write MB/s"
		echo "include getting the data to the servers). See fusemount's package documentation."
		echo
		echo "How the methods move large sequential data: direct turns each read(2) or write(2) into"
		echo "one FUSE request (up to 1 MiB) and one library call, done before the next starts; with"
		echo "\`shoal up\`'s 1 MiB stripe unit a 1 MiB request goes to one data server. cached writes"
		echo "are written back by the kernel with several 1 MiB WRITEs in flight, odirect writes are"
		echo "gathered by the library into 4 MiB blocks that span both data servers, and cached and"
		echo "odirect reads get the library's readahead. With one stream, direct pays each request's"
		echo "full round trip while the others overlap requests; with several streams the machine's"
		echo "two cores are the limit and the method that copies least (direct) moves the most."
		for p in "${passes[@]}"; do
			echo
			if ((p == 1)); then
				echo "## One stream (one fio process, one request at a time)"
			else
				echo "## $p streams (fio --numjobs=$p: $p processes, each streaming its own file)"
			fi
			echo
			table "$p"
		done
		echo
		echo "postmark on the cached mount (500 files of 500 B-10 kB, 2000 transactions): $pm_status"
		echo "(${pm_time:-?} s total)."
		echo
		echo "Checks from this run:"
		echo
		checks
		echo
		echo "$marker"
		if [[ -f $DOC ]] && grep -qF "$marker" "$DOC"; then
			sed "1,/^${marker//\//\\/}\$/d" "$DOC"
		fi
	} >"$DOC.tmp"
	mv "$DOC.tmp" "$DOC"
	echo "wrote $DOC"
fi
