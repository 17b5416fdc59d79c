#!/usr/bin/env bash
# fio-access.sh: sequential fio write/read throughput of `shoal mount` for
# each access method (cached, odirect, direct) and block size, plus a
# postmark small-file run on the cached mount. Prints a table and writes it
# as markdown to docs/access-methods.md.
#
#   scripts/fio-access.sh                       # 256 MiB file, bs 4k 64k 1m 4m
#   SIZE=64m scripts/fio-access.sh              # smaller file when time is short
#
# Environment: SHOAL (binary; default: built from this checkout), SIZE (fio
# --size), BSS (block sizes), METHODS, RUNTIME (fio --runtime cap per pass,
# seconds), DOC (markdown output; DOC= to skip), KEEP=1 (keep work dir).
#
# Each (method, bs): mount, fio write (crc32c verify headers, end_fsync),
# unmount and remount so the read cannot come from the FUSE page cache, fio
# read with --verify=crc32c --do_verify=1 (data checked, read MB/s includes
# the crc32c check), unmount. Everything listens on 127.0.0.1 only; the
# cluster and mounts started here are stopped and the work directory removed
# on exit, also on error or Ctrl-C.
set -euo pipefail

SIZE=${SIZE:-256m}
BSS=${BSS:-"4k 64k 1m 4m"}
METHODS=${METHODS:-"cached odirect direct"}
RUNTIME=${RUNTIME:-120}
repo=$(cd "$(dirname "$0")/.." && pwd)
DOC=${DOC-$repo/docs/access-methods.md}
cmdline="$0${*:+ $*}"
envline="SIZE=$SIZE BSS=\"$BSS\" METHODS=\"$METHODS\" RUNTIME=$RUNTIME"
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-fio-access.XXXXXX")
up_pid=
mnt=$work/mnt

cleanup() {
	local rc=$?
	set +e
	if mountpoint -q "$mnt" 2>/dev/null; then
		"$SHOAL" umount "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
	fi
	if [[ -n $up_pid ]]; then
		kill "$up_pid" 2>/dev/null
		for _ in $(seq 1 100); do kill -0 "$up_pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$up_pid" 2>/dev/null
	fi
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
if ((${#need[@]})); then
	sudo=; ((EUID == 0)) || sudo=sudo
	$sudo apt-get install -y "${need[@]}" >/dev/null 2>&1 ||
		{ $sudo apt-get update >/dev/null && $sudo apt-get install -y "${need[@]}" >/dev/null; }
fi

if [[ -z ${SHOAL:-} ]]; then
	SHOAL=$work/shoal
	(cd "$repo" && go build -o "$SHOAL" ./cmd/shoal)
fi

# 2. One cluster with 2 data servers on a kernel-chosen loopback port.
"$SHOAL" up --dir "$work/cluster" --ds 2 --listen 127.0.0.1:0 --ready-file "$work/ready" \
	--log-level warn >"$work/up.log" 2>&1 &
up_pid=$!
for _ in $(seq 1 300); do
	[[ -s $work/ready ]] && break
	kill -0 "$up_pid" 2>/dev/null || { cat "$work/up.log" >&2; echo "shoal up died" >&2; exit 1; }
	sleep 0.1
done
[[ -s $work/ready ]] || { echo "shoal up not ready after 30s" >&2; exit 1; }
addr=$(sed -n 's/.*"mds":"\([^"]*\)".*/\1/p' "$work/ready")
[[ $addr == 127.0.0.1:* ]] || { echo "unexpected MDS address '$addr'" >&2; exit 1; }
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
fio_pass() { # fio_pass RW BS EXTRA... -> prints MB/s (10^6 bytes/s)
	local rw=$1 bs=$2 out=$work/fio.$1.json
	shift 2
	fio --name=w --rw="$rw" --bs="$bs" --size="$SIZE" --ioengine=psync --runtime="$RUNTIME" \
		--directory="$mnt" --output-format=json --verify=crc32c "$@" >"$out"
	local errs
	errs=$(jq '.jobs[0].error' "$out")
	[[ $errs == 0 ]] || { echo "fio $rw bs=$bs: error $errs" >&2; exit 1; }
	printf '%.1f\n' "$(jq -r ".jobs[0].$rw.bw_bytes / 1e6" "$out")"
}

# 3. fio per method and block size.
declare -A W R
for m in $METHODS; do
	for bs in $BSS; do
		mount_as "$m"
		rm -f "$mnt"/w.0.0
		W[$m,$bs]=$(fio_pass write "$bs" --end_fsync=1 --do_verify=0)
		unmount
		mount_as "$m"
		R[$m,$bs]=$(fio_pass read "$bs" --do_verify=1 --invalidate=1)
		rm -f "$mnt"/w.0.0
		unmount
		printf '%-8s %-4s write %8s MB/s  read+verify %8s MB/s\n' "$m" "$bs" "${W[$m,$bs]}" "${R[$m,$bs]}"
	done
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

# 5. Table.
table() {
	echo "| method | bs | write MB/s | read MB/s |"
	echo "|---|---|---:|---:|"
	for m in $METHODS; do
		for bs in $BSS; do echo "| $m | $bs | ${W[$m,$bs]} | ${R[$m,$bs]} |"; done
	done
}
echo
table | sed '2d;s/^| //;s/ |$//;s/ | /\t/g' | column -t -s $'\t'

# The issue's checks: cached 4k writes >= 80% of cached 1m writes; direct
# 1m the fastest for large sequential I/O (bs 1m and 4m, all methods).
checks() {
	local c4=${W[cached,4k]:-} c1=${W[cached,1m]:-}
	if [[ -n $c4 && -n $c1 ]]; then
		local pct
		pct=$(echo "scale=0; 100 * $c4 / $c1" | bc)
		echo "- cached 4k write = $pct% of cached 1m write (want >= 80%): $( ((pct >= 80)) && echo holds || echo DOES NOT HOLD)"
	fi
	[[ -n ${W[direct,1m]:-} ]] || return 0
	local dir best_w=direct,1m best_r=direct,1m k
	for m in $METHODS; do
		for bs in 1m 4m; do
			k=$m,$bs
			[[ -n ${W[$k]:-} ]] || continue
			(($(echo "${W[$k]} > ${W[$best_w]}" | bc))) && best_w=$k
			(($(echo "${R[$k]} > ${R[$best_r]}" | bc))) && best_r=$k
		done
	done
	for dir in write read; do
		k=$best_w
		[[ $dir == read ]] && k=$best_r
		echo "- fastest large (1m/4m) sequential $dir: ${k/,/ } ($([[ $dir == write ]] && echo "${W[$k]}" || echo "${R[$k]}") MB/s; direct 1m $([[ $dir == write ]] && echo "${W[direct,1m]}" || echo "${R[direct,1m]}")): direct 1m fastest $([[ $k == direct,1m ]] && echo holds || echo "does not hold")"
	done
}
echo
checks

if [[ -n $DOC ]]; then
	{
		echo "# Access methods: fio sequential throughput"
		echo
		echo "Generated by \`scripts/fio-access.sh\` on $(date -u +%Y-%m-%d) ($(uname -sr), $(nproc) cores)."
		echo
		echo "Machine note: 2 cores, shared and noisy; numbers vary run to run by tens of percent"
		echo "and the client, FUSE, MDS and both data servers all share those cores."
		echo
		echo "Command: \`$envline $cmdline\`"
		echo
		echo "Setup: one \`shoal up --ds 2\` on 127.0.0.1; \`shoal mount --access METHOD\`; per block size"
		echo "\`fio --name=w --rw=write --bs=BS --size=$SIZE --ioengine=psync --end_fsync=1 --verify=crc32c --do_verify=0\`,"
		echo "then unmount and remount (drops the FUSE page cache), then"
		echo "\`fio --name=w --rw=read --bs=BS --size=$SIZE --ioengine=psync --verify=crc32c --do_verify=1 --invalidate=1\`"
		echo "(read MB/s includes the crc32c check of every block). MB/s = 10^6 bytes/s from fio's JSON."
		echo
		table
		echo
		echo "postmark on the cached mount (500 files of 500 B-10 kB, 2000 transactions): $pm_status"
		echo "(${pm_time:-?} s total)."
		echo
		echo "Checks from this run:"
		echo
		checks
	} >"$DOC.tmp"
	mv "$DOC.tmp" "$DOC"
	echo "wrote $DOC"
fi
