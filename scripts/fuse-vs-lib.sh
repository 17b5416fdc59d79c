#!/usr/bin/env bash
# fuse-vs-lib.sh: what the FUSE path adds to a small-file delete. One
# `shoal up --ds DS` cluster on loopback; in each of ROUNDS rounds, first
# PROCS processes each delete FILES files of SIZE bytes through
# `shoal mount --access cached` (fuse-meta.sh's delete phase: the files
# made and stat'ed first, so the kernel has their dentries), then PROCS
# goroutines delete as many with the client library alone
# (BenchmarkMetaOps/async=false/remove against the same MDS: RemoveAt,
# the COMPOUND the mount sends for an unlink). Prints both rates per
# round, their medians, and the mount's CPU per unlink (from
# /proc/PID/stat, 10 ms ticks).
#
#   scripts/fuse-vs-lib.sh                  # 4 x 2000 files, 4 DS, 3 rounds
#   ROUNDS=5 UP_ARGS=--sync=false scripts/fuse-vs-lib.sh
#
# Environment: SHOAL (binary; default: built from this checkout), DS,
# PROCS (the FUSE side; the library side always runs 4 goroutines),
# FILES, SIZE, ROUNDS, UP_ARGS, MOUNT_ARGS. Everything listens on
# 127.0.0.1; the cluster and mount are stopped by PID and the work
# directory removed on exit.
set -euo pipefail

DS=${DS:-4}
PROCS=${PROCS:-4}
FILES=${FILES:-2000}
SIZE=${SIZE:-4096}
ROUNDS=${ROUNDS:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-fuse-vs-lib.XXXXXX")
mnt=$work/mnt
# shellcheck source=lib/shoal-cluster.sh
. "$repo/scripts/lib/shoal-cluster.sh"

cleanup() {
	local rc=$?
	set +e
	shoal_stop "$mnt"
	rm -rf "$work"
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v python3 >/dev/null || { echo "fuse-vs-lib.sh needs python3" >&2; exit 1; }
shoal_build
(cd "$repo" && go test -c -o "$work/client.test" ./client)

shoal_up

shoal_mount cached "$mnt"
echo "cluster: $addr, $DS data servers; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

cat >"$work/del.py" <<'EOF'
import multiprocessing as mp, os, sys, time
mnt, procs, files, size, run, mpid = sys.argv[1], *map(int, sys.argv[2:7])
TICK = os.sysconf("SC_CLK_TCK")

def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK

def worker(i, made, start):
    d = os.path.join(mnt, f"r{run}.p{i}")
    os.mkdir(d)
    data = os.urandom(size)
    names = [os.path.join(d, f"f{j}") for j in range(files)]
    for p in names:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.close(fd)
    for p in names:
        os.stat(p)
    made.wait()
    start.wait()
    for p in names:
        os.unlink(p)
    os.rmdir(d)

made, start = mp.Barrier(procs + 1), mp.Barrier(procs + 1)
ws = [mp.Process(target=worker, args=(i, made, start), daemon=True) for i in range(procs)]
for w in ws:
    w.start()
made.wait()
time.sleep(1)  # the creates' RELEASEs arrive asynchronously
c0 = cpu(mpid)
start.wait()
t0 = time.monotonic()
for w in ws:
    w.join()
    if w.exitcode != 0:
        raise SystemExit(f"worker failed with {w.exitcode}")
dt = time.monotonic() - t0
n = procs * files
print(f"{n / dt:.0f} {1e6 * (cpu(mpid) - c0) / n:.0f}")
EOF

fuse=()
lib=()
printf '%-6s %12s %18s %12s %6s\n' round "fuse del/s" "mount CPU-µs/del" "lib del/s" load
for r in $(seq 1 "$ROUNDS"); do
	read -r f m < <(python3 "$work/del.py" "$mnt" "$PROCS" "$FILES" "$SIZE" "$r" "$mount_pid")
	l=$(cd "$repo/client" && SHOAL_BENCH_ADDR=$addr SHOAL_BENCH_PID=$up_pid "$work/client.test" \
		-test.run '^$' -test.bench 'BenchmarkMetaOps/async=false/remove$' -test.benchtime "$((PROCS * FILES))x" |
		sed -n 's|.* \([0-9.]*\) ops/s.*|\1|p')
	[[ -n $l ]] || { echo "the library benchmark printed no rate" >&2; exit 1; }
	fuse+=("$f")
	lib+=("${l%.*}")
	printf '%-6s %12s %18s %12s %6s\n' "$r" "$f" "$m" "${l%.*}" "$(cut -d' ' -f1 /proc/loadavg)"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
printf '%-6s %12s %18s %12s\n' median "$(median "${fuse[@]}")" "" "$(median "${lib[@]}")"
