#!/usr/bin/env bash
# fuse-links.sh: rename, link and unlink rates of `shoal mount`, and what
# each costs at the MDS (COMPOUNDs and SETATTRs per operation, from the
# MDS's shoal_nfs_ops_total). PROCS processes each create FILES files of
# SIZE bytes in a directory of their own, then, phase by phase with a
# barrier in between: rename every f<i> to g<i>, link g<i> as h<i>,
# unlink g<i> (a file that keeps a name), unlink h<i> (its last name).
# Made for the kernel's times flush after link, unlink and rename
# (fusemount/ctimeflush.go): a SETATTR per operation at the MDS before.
#
#   scripts/fuse-links.sh                        # 4 x 500 files, 4 DS, cached, 3 runs
#   SHOAL=/tmp/shoal-base RUNS=5 scripts/fuse-links.sh
#   UP_ARGS=--sync=false scripts/fuse-links.sh   # the MDS in async mode
#
# Environment: SHOAL (binary; default: built from this checkout), DS,
# PROCS, FILES, SIZE, RUNS (the table shows the median rate), TIMEOUT
# (seconds for the whole workload, default 300), UP_ARGS, MOUNT_ARGS,
# OUT (also write the JSON line there). Everything listens on 127.0.0.1;
# the cluster and mount are stopped by PID and the work directory removed
# on exit.
set -euo pipefail

DS=${DS:-4}
PROCS=${PROCS:-4}
FILES=${FILES:-500}
SIZE=${SIZE:-4096}
RUNS=${RUNS:-3}
TIMEOUT=${TIMEOUT:-300}
OUT=${OUT:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-fuse-links.XXXXXX")
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

command -v python3 >/dev/null || { echo "fuse-links.sh needs python3" >&2; exit 1; }
shoal_build

shoal_up

shoal_mount cached "$mnt"
echo "cluster: $addr, $DS data servers; mount: --access cached; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

cat >"$work/links.py" <<'EOF'
import json, multiprocessing as mp, os, signal, statistics, sys, time, urllib.request

signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
mnt, metrics, procs, files, size, runs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
PHASES = ["rename", "link", "unlink-kept", "unlink-last"]

def mds_ops():
    ops = {}
    with urllib.request.urlopen(metrics, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("shoal_nfs_ops_total{") and 'role="mds"' in line:
                op = line.split('op="', 1)[1].split('"', 1)[0]
                ops[op] = ops.get(op, 0) + float(line.rsplit(" ", 1)[1])
    return ops

def worker(i, run, ready, start, end):
    d = os.path.join(mnt, f"r{run}.p{i}")
    os.mkdir(d)
    data = os.urandom(size)
    for j in range(files):
        with open(os.path.join(d, f"f{j}"), "wb") as f:
            f.write(data)
    ready.wait()
    for phase in PHASES:
        start.wait()
        for j in range(files):
            f, g, h = (os.path.join(d, f"{p}{j}") for p in "fgh")
            if phase == "rename":
                os.rename(f, g)
            elif phase == "link":
                os.link(g, h)
            elif phase == "unlink-kept":
                os.unlink(g)
            else:
                os.unlink(h)
        end.wait()
    os.rmdir(d)

rates, per_op = {p: [] for p in PHASES}, {}
for run in range(runs):
    ready, start, end = (mp.Barrier(procs + 1) for _ in range(3))
    ws = [mp.Process(target=worker, args=(i, run, ready, start, end), daemon=True) for i in range(procs)]
    for w in ws:
        w.start()
    ready.wait()
    time.sleep(1)  # the creates' RELEASEs (CLOSE at the MDS) arrive asynchronously
    for phase in PHASES:
        before = mds_ops()
        start.wait()
        t0 = time.monotonic()
        end.wait()
        dt = time.monotonic() - t0
        time.sleep(0.2)
        after = mds_ops()
        n = procs * files
        rates[phase].append(n / dt)
        diff = {k: after[k] - before.get(k, 0) for k in after}
        per_op[phase] = {"compounds": diff.get("SEQUENCE", 0) / n, "setattrs": diff.get("SETATTR", 0) / n}
    for w in ws:
        w.join()
        if w.exitcode != 0:
            raise SystemExit(f"worker failed with {w.exitcode}")

out = {"procs": procs, "files": files, "runs": runs, "load_average": os.getloadavg()}
print(f"{'phase':12} {'median/s':>10} {'runs/s':>24} {'compounds/op':>13} {'SETATTR/op':>11}")
for p in PHASES:
    r = rates[p]
    out[p] = {"per_second": round(statistics.median(r)), "runs": [round(x) for x in r], **per_op[p]}
    print(f"{p:12} {statistics.median(r):10.0f} {' '.join(f'{x:.0f}' for x in r):>24} "
          f"{per_op[p]['compounds']:13.2f} {per_op[p]['setattrs']:11.2f}")
print(json.dumps(out))
EOF
timeout "$TIMEOUT" python3 "$work/links.py" "$mnt" "$metrics" "$PROCS" "$FILES" "$SIZE" "$RUNS" | tee "$work/out.txt"
if [[ -n $OUT ]]; then tail -n 1 "$work/out.txt" >"$OUT"; fi
