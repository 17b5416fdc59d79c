#!/usr/bin/env bash
# cp-vs-fuse.sh: time `shoal cp -r` between two local `shoal up` clusters
# against `cp -r` between the same clusters' FUSE mounts (`shoal mount`),
# and check that both copies have the source's SHA-256 sums.
#
#   scripts/cp-vs-fuse.sh                 # 64 x 32 MiB = 2 GiB, 4 data servers each
#   FILES=16 SIZE_MB=8 scripts/cp-vs-fuse.sh
#
# Environment: SHOAL (binary; default: built from this checkout), FILES,
# SIZE_MB, DS (data servers per cluster), JOBS (shoal cp --jobs), ACCESS
# (shoal mount --access), KEEP=1 (keep the work directory).
# Everything listens on 127.0.0.1 only; everything started is stopped and
# removed on exit, also on error or Ctrl-C.
set -euo pipefail

FILES=${FILES:-64}
SIZE_MB=${SIZE_MB:-32}
DS=${DS:-4}
JOBS=${JOBS:-8}
ACCESS=${ACCESS:-cached}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-cp-vs-fuse.XXXXXX")
pids=()
mounts=()

cleanup() {
	local rc=$?
	set +e
	for m in "${mounts[@]}"; do
		"$SHOAL" umount "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
	done
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null
	done
	for p in "${pids[@]}"; do
		for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$p" 2>/dev/null
	done
	if [[ ${KEEP:-0} == 1 ]]; then
		echo "kept $work"
	else
		rm -rf "$work"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -z ${SHOAL:-} ]]; then
	SHOAL=$work/shoal
	(cd "$repo" && go build -o "$SHOAL" ./cmd/shoal)
fi

# start_cluster NAME: starts `shoal up` on a kernel-chosen port and sets
# the global addr to its MDS address.
start_cluster() {
	local name=$1
	"$SHOAL" up --dir "$work/$name" --ds "$DS" --listen 127.0.0.1:0 --ready-file "$work/$name.ready" \
		--log-level warn >"$work/$name.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 300); do
		[[ -s $work/$name.ready ]] && break
		kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/$name.log" >&2; echo "cluster $name died" >&2; exit 1; }
		sleep 0.1
	done
	[[ -s $work/$name.ready ]] || { echo "cluster $name not ready after 30s" >&2; exit 1; }
	addr=$(sed -n 's/.*"mds":"\([^"]*\)".*/\1/p' "$work/$name.ready")
}

start_cluster a
A=$addr
start_cluster b
B=$addr
echo "clusters: A=$A B=$B, $DS data servers each"

# The source tree: FILES files of SIZE_MB MiB in nested directories,
# generated locally (for reference checksums), put on A, then deleted.
gen=$work/gen/tree
for i in $(seq 0 $((FILES - 1))); do
	d=$gen/d$((i % 4))/e$((i % 3))
	mkdir -p "$d"
	head -c $((SIZE_MB << 20)) /dev/urandom >"$d/f$i"
done
ln -s d0/e0/f0 "$gen/link"
(cd "$gen" && find . -type f | sort | xargs sha256sum) >"$work/sums.src"
"$SHOAL" cp -r -q "$gen" "nfs://$A/"
rm -rf "$work/gen"
total_mb=$((FILES * SIZE_MB))
echo "source: $FILES files, $total_mb MiB on A"

sums_via_cat() { # sums_via_cat ADDR DIR: SHA-256 of every file, read with `shoal cat`
	local f
	while read -r _ f; do
		printf '%s  %s\n' "$("$SHOAL" cat "nfs://$1/$2/${f#./}" | sha256sum | cut -d' ' -f1)" "$f"
	done <"$work/sums.src"
}

# 1. shoal cp, cluster to cluster.
sync
t0=$(date +%s.%N)
"$SHOAL" cp -r -j "$JOBS" "nfs://$A/tree" "nfs://$B/cp-tree"
t1=$(date +%s.%N)
cp_s=$(echo "$t1 - $t0" | bc)
sums_via_cat "$B" cp-tree >"$work/sums.cp"
cp_ok=$(cmp -s "$work/sums.src" "$work/sums.cp" && echo equal || echo DIFFERENT)

# 2. cp -r between FUSE mounts.
fuse_s=- fuse_ok=-
if "$SHOAL" mount --help >/dev/null 2>&1 && [[ -e /dev/fuse ]]; then
	mkdir -p "$work/ma" "$work/mb"
	if "$SHOAL" mount --foreground=false --access "$ACCESS" "nfs://$A/" "$work/ma" 2>"$work/ma.log" &&
		mounts+=("$work/ma") &&
		"$SHOAL" mount --foreground=false --access "$ACCESS" "nfs://$B/" "$work/mb" 2>"$work/mb.log" &&
		mounts+=("$work/mb"); then
		sync
		t0=$(date +%s.%N)
		cp -r "$work/ma/tree" "$work/mb/fuse-tree"
		t1=$(date +%s.%N)
		fuse_s=$(echo "$t1 - $t0" | bc)
		sums_via_cat "$B" fuse-tree >"$work/sums.fuse"
		fuse_ok=$(cmp -s "$work/sums.src" "$work/sums.fuse" && echo equal || echo DIFFERENT)
	else
		echo "note: shoal mount failed ($(cat "$work/ma.log" "$work/mb.log" 2>/dev/null | tail -1)); FUSE half skipped"
	fi
else
	echo "note: shoal mount is not available (or no /dev/fuse); FUSE half skipped"
fi

rate() { [[ $1 == - ]] && echo - || echo "scale=1; $total_mb * 1.048576 / $1" | bc; }
printf '\n%-28s %10s %10s %12s\n' method seconds MB/s checksums
printf '%-28s %10s %10s %12s\n' "shoal cp -r (pNFS, -j $JOBS)" "$(printf %.2f "$cp_s")" "$(rate "$cp_s")" "$cp_ok"
printf '%-28s %10s %10s %12s\n' "cp -r on FUSE ($ACCESS)" "$([[ $fuse_s == - ]] && echo - || printf %.2f "$fuse_s")" "$(rate "$fuse_s")" "$fuse_ok"
[[ $cp_ok == equal && $fuse_ok != DIFFERENT ]]
