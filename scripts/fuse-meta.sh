#!/usr/bin/env bash
# fuse-meta.sh: small-file metadata rates of `shoal mount` (issue 13's
# workload): PROCS processes each create FILES files of SIZE bytes in a
# directory of its own, then stat them all, then delete them, phase by phase
# with a barrier in between, through the FUSE mount of a local
# `shoal up --ds DS` cluster on loopback. Prints a table (creates/s,
# stats/s, deletes/s, and what each file cost at the MDS: COMPOUNDs,
# operations, LOOKUPs and COMMITs per file, from the MDS's
# shoal_nfs_ops_total counters, the metadata log's fdatasyncs per file
# (shoal_metadata_log_syncs_total, and the median fdatasync from
# shoal_metadata_log_sync_seconds on servers that have it), and the mean
# time the MDS spent in each operation from shoal_nfs_op_seconds_total)
# and the same as one JSON line.
#
#   scripts/fuse-meta.sh                       # 4 x 500 files of 4 KiB, 4 DS, cached, 3 runs
#   RUNS=1 ACCESS=direct scripts/fuse-meta.sh
#   OUT=/tmp/meta.json scripts/fuse-meta.sh    # also write the JSON there
#   TARGET=moosefs scripts/fuse-meta.sh        # the same through MooseFS's mfsmount
#   TARGET=moosefs MOOSEFS_CHANGELOG_SAVE_MODE=2 scripts/fuse-meta.sh
#   UP_ARGS=--sync=false scripts/fuse-meta.sh  # Shoal's MDS in async mode
#
# TARGET=moosefs runs the same workload on a MooseFS 3.0 cluster of DS chunk
# servers (scripts/moosefs.sh: Debian's packages, installed on first use,
# in a network namespace of its own) through its own FUSE client, the peer
# issue 13 measured. MOOSEFS_CHANGELOG_SAVE_MODE=2 makes its master fsync
# every change before answering, as Shoal's MDS does; MooseFS's default (0)
# does not sync its change log. There are no per-operation counts for it.
#
# Environment: SHOAL (binary; default: built from this checkout), DS, PROCS,
# FILES, SIZE, ACCESS (cached, odirect, direct), RUNS (the table shows the
# median rate; ops per file are the same in every run), TIMEOUT (seconds
# for the whole workload, default 300), OUT, KEEP=1 (keep the work dir),
# UP_ARGS (more `shoal up` flags, split on spaces), MOUNT_ARGS (more
# `shoal mount` flags), MOUNT_ENV (NAME=VALUE words for the mount's
# environment only, e.g. MOUNT_ENV=GOGC=100), DROP_CACHES and DIAG (see
# below).
#
# DIAG=1 adds, per run and phase, counters to read when rates alone
# mislead (a loaded machine; or the quiet 2-CPU VM, whose per-operation
# CPU moves by 15-20% for minutes at a time: docs/benchmarks.md, "Async
# deletes through the mount: two speeds"), per thousand files over the
# phase itself: CPU-ms, run-queue wait, context switches, migrations and
# page faults of the server, the mount and the workers; the CPU the rest
# of the machine used meanwhile ("other_ms"); each CPU's busy time; the
# Go collections and their CPU when run with GODEBUG=gctrace=1; whether
# the MDS's metadata log changed files; and a CPU-speed probe taken after
# the phase (ns of thread CPU per round of a fixed loop). They go to
# stderr as "diag" lines and into the JSON. scripts/fuse-meta-ab.sh runs
# two configurations in alternating sittings with DIAG=1.
#
# DROP_CACHES=1 (the default, as root) drops the kernel's dentries and
# inodes (echo 2 >/proc/sys/vm/drop_caches) between the create and the
# stat phase, so every stat starts from a cold kernel cache, as `find` or
# `ls -l` on a tree another process wrote does (issue 27); DROP_CACHES=0
# keeps them (the runs before issue 27). Page caches are left alone. The
# drop is machine-wide: other processes' dentries and inodes go too.
#
# CPU: the table also shows the CPU-seconds per thousand files of each
# phase for the server and the mount process, from /proc/PID/stat
# (utime+stime) at the same points as the operation counts: for Shoal
# the `shoal up` process (the MDS and its DS data servers in one process)
# and `shoal mount`; for MooseFS mfsmaster (the chunk servers are not
# counted) and mfsmount.
#
# The rates are wall-clock: from the barrier that starts a phase until the
# last process finished it. The operations of a phase are counted from the
# start of the phase to the start of the next one, after a 1 s pause in
# which the kernel's asynchronous RELEASEs (CLOSE at the MDS) arrive.
# Everything listens on 127.0.0.1 only; the cluster and the mount started
# here are stopped by PID, and the work directory removed, on exit, also on
# error or Ctrl-C.
set -euo pipefail

DS=${DS:-4}
PROCS=${PROCS:-4}
FILES=${FILES:-500}
SIZE=${SIZE:-4096}
ACCESS=${ACCESS:-cached}
RUNS=${RUNS:-3}
TARGET=${TARGET:-shoal}
TIMEOUT=${TIMEOUT:-300}
OUT=${OUT:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-fuse-meta.XXXXXX")
mnt=$work/mnt
# MooseFS's directory: its base name names the network namespace, so it
# is unique to this run (two runs at once would share one otherwise).
mfsdir=$work/mfs-$$
# shellcheck source=lib/shoal-cluster.sh
. "$repo/scripts/lib/shoal-cluster.sh"

perf_pid=
cleanup() {
	local rc=$?
	set +e
	[[ -n $perf_pid ]] && kill -INT "$perf_pid" 2>/dev/null && wait "$perf_pid"
	if [[ $TARGET == shoal ]]; then
		shoal_stop "$mnt"
	fi
	[[ $TARGET == moosefs ]] && "$repo/scripts/moosefs.sh" stop "$mfsdir"
	if [[ ${KEEP:-0} == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v python3 >/dev/null || { echo "fuse-meta.sh needs python3" >&2; exit 1; }
case $TARGET in
shoal) ;;
moosefs)
	mnt=$("$repo/scripts/moosefs.sh" start "$mfsdir" 19419 "$DS" | tail -n 1)
	metrics=
	server_pid=$(cat "$mfsdir/master.pid")
	mount_cpu_pid=$(cat "$mfsdir/mount.pid")
	echo "MooseFS: $DS chunk servers, CHANGELOG_SAVE_MODE=${MOOSEFS_CHANGELOG_SAVE_MODE:-0}; mount: mfsmount defaults; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	;;
*) echo "TARGET must be shoal or moosefs" >&2; exit 2 ;;
esac
if [[ $TARGET == moosefs ]]; then :
else
	shoal_build
fi

# 1. The cluster, with its metrics on a kernel-chosen port.
if [[ $TARGET == shoal ]]; then
shoal_up

# 2. The mount, in the foreground of a background job so its PID is ours.
shoal_mount "$ACCESS" "$mnt"
server_pid=$up_pid
mount_cpu_pid=$mount_pid
echo "cluster: $addr, $DS data servers; mount: --access $ACCESS; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
fi

# 3. The workload.
cat >"$work/meta.py" <<'EOF'
import json, multiprocessing as mp, os, re, signal, statistics, sys, time, urllib.request

# timeout(1) sends SIGTERM: exit normally, so the daemonic workers are
# terminated too.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))

mnt, metrics, procs, files, size, runs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
server_pid, mount_pid, drop = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1"
logs, want_diag = sys.argv[10:13], sys.argv[13] == "1"
PHASES = ["create", "stat", "delete"]
TICK = os.sysconf("SC_CLK_TCK")

def cpu(pid):
    """CPU-seconds (user+system) the process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK

def cpus():
    return {"server": cpu(server_pid), "mount": cpu(mount_pid)}

def sched(pid):
    """Scheduler counters of a process, summed over its threads: CPU and
    run-queue wait in ms (schedstat), timeslices, migrations between
    CPUs, voluntary and involuntary context switches, and the threads."""
    out = {"run_ms": 0.0, "wait_ms": 0.0, "slices": 0, "migrations": 0, "vcsw": 0, "ivcsw": 0, "threads": 0, "minflt": 0}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(base + "/schedstat") as f:
                run, wait, slices = map(int, f.read().split())
            with open(base + "/status") as f:
                st = f.read()
            mig = 0
            if os.path.exists(base + "/sched"):
                with open(base + "/sched") as f:
                    m = re.search(r"se\.nr_migrations\s*:\s*(\d+)", f.read())
                    mig = int(m.group(1)) if m else 0
        except OSError:
            continue  # the thread exited
        out["run_ms"] += run / 1e6
        out["wait_ms"] += wait / 1e6
        out["slices"] += slices
        out["migrations"] += mig
        out["vcsw"] += int(re.search(r"^voluntary_ctxt_switches:\s*(\d+)", st, re.M).group(1))
        out["ivcsw"] += int(re.search(r"^nonvoluntary_ctxt_switches:\s*(\d+)", st, re.M).group(1))
        out["threads"] += 1
    try:
        with open(f"/proc/{pid}/stat") as f:
            out["minflt"] = int(f.read().rsplit(")", 1)[1].split()[7])
    except OSError:
        pass
    return out

def machine():
    """The whole machine's CPU time by kind, and each CPU's busy time
    ("busyN": all but idle and iowait), in ms (/proc/stat); and the
    machine's page faults (/proc/vmstat)."""
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            cpu, *v = line.split()
            v = [1000 * int(x) / TICK for x in v[:8]]
            if cpu == "cpu":
                out.update(zip(names, v))
            else:
                out["busy" + cpu[3:]] = sum(v) - v[3] - v[4]
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in ("pgfault", "pgmajfault"):
                out[k] = int(v)
    return out

def gcs(path):
    """Garbage collections a Go process logged with GODEBUG=gctrace=1,
    and the CPU-ms they took (the sum of gctrace's "ms cpu" parts)."""
    n, ms = 0, 0.0
    if not path:
        return n, ms
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"gc \d+ @.*?, ([0-9.+/]+) ms cpu", line)
                if m:
                    n += 1
                    ms += sum(float(x) for x in re.split(r"[+/]", m.group(1)))
    except OSError:
        pass
    return n, ms

def cpu_speed(rounds=5, n=100000):
    """ns of this thread's CPU time per round of a fixed loop, the lowest
    of a few: how fast the machine runs plain code at the moment, apart
    from waiting for a CPU (which thread CPU time does not count)."""
    best = None
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        x = 0
        for i in range(n):
            x += i ^ (x & 7)
        ns = (time.thread_time_ns() - t0) / n
        best = ns if best is None else min(best, ns)
    return round(best, 2)

def wal_files():
    """The MDS's metadata log files (a new name: the log switched
    files, which starts a checkpoint)."""
    try:
        return sorted(n for n in os.listdir(logs[2]) if "-wal" in n)
    except (OSError, IndexError):
        return []

def diag(workers):
    """Counters that tell the runs' modes apart (DIAG=1): see diag_diff."""
    d = {"wal": wal_files(), "machine": machine(), "server": sched(server_pid), "mount": sched(mount_pid), "main": sched(os.getpid()),
         "gc_server": gcs(logs[0]), "gc_mount": gcs(logs[1])}
    ws = [sched(w.pid) for w in workers]
    d["workers"] = {k: sum(w[k] for w in ws) for k in ws[0]} if ws else {}
    return d

def diag_diff(a, b, n):
    """Per thousand files between two diag() readings, threads as read at b."""
    out = {}
    for k in ("machine", "server", "mount", "workers", "main"):
        out[k] = {kk: round(1000 * (b[k][kk] - a[k].get(kk, 0)) / n, 2) for kk in b[k] if kk != "threads"}
        if "threads" in b[k]:
            out[k]["threads"] = b[k]["threads"]
    out["wal"] = b["wal"] if b["wal"] != a["wal"] else "same"
    for k in ("gc_server", "gc_mount"):
        # collections in the phase, and their CPU-ms per thousand files
        out[k] = [b[k][0] - a[k][0], round(1000 * (b[k][1] - a[k][1]) / n, 2)]
    # CPU the rest of the machine used meanwhile (ms per thousand files;
    # /proc/stat counts in ticks, so a short phase reads coarsely).
    busy = sum(v for k, v in out["machine"].items() if k in ("user", "nice", "system", "irq", "softirq", "steal"))
    out["other_ms"] = round(busy - sum(out[k]["run_ms"] for k in ("server", "mount", "workers", "main")), 1)
    return out

def drop_caches():
    """Forget the kernel's dentries and inodes (not page caches)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")

def mds_ops():
    """The MDS's operation counts, and the seconds spent in each as
    "<op>_s" (none for a server without Shoal's metrics)."""
    ops = {}
    if not metrics:
        return ops
    with urllib.request.urlopen(metrics, timeout=10) as r:
        for line in r.read().decode().splitlines():
            for metric, suffix in (("shoal_nfs_ops_total{", ""), ("shoal_nfs_op_seconds_total{", "_s")):
                if line.startswith(metric) and 'role="mds"' in line:
                    op = line.split('op="', 1)[1].split('"', 1)[0] + suffix
                    ops[op] = ops.get(op, 0) + float(line.rsplit(" ", 1)[1])
            # fdatasyncs of the metadata log (servers since issue 27)
            if line.startswith("shoal_metadata_log_syncs_total{") and 'role="mds"' in line:
                ops["@syncs"] = ops.get("@syncs", 0) + float(line.rsplit(" ", 1)[1])
            # their durations, a histogram (servers since h1-walsync)
            if line.startswith("shoal_metadata_log_sync_seconds_bucket{") and 'role="mds"' in line:
                le = re.search(r'[{,]le="([^"]*)"', line).group(1)
                ops["@le:" + le] = ops.get("@le:" + le, 0) + float(line.rsplit(" ", 1)[1])
    return ops

def sync_p50(diff):
    """The median fdatasync of the log in µs, interpolated in the
    histogram's buckets (their cumulative counts' differences), or None."""
    b = sorted((float(k[4:]), v) for k, v in diff.items() if k.startswith("@le:"))
    if not b or b[-1][1] <= 0:
        return None
    half, lo, below = b[-1][1] / 2, 0.0, 0.0
    for le, cum in b:
        if cum >= half:
            if le == float("inf"):
                return round(1e6 * lo, 1)
            return round(1e6 * (lo + (le - lo) * (half - below) / max(cum - below, 1)), 1)
        lo, below = le, cum
    return None

def worker(i, run, start, end):
    d = os.path.join(mnt, f"r{run}.p{i}")
    os.mkdir(d)
    data = os.urandom(size)
    names = [os.path.join(d, f"f{j}") for j in range(files)]
    for phase in PHASES:
        start.wait()
        for p in names:
            if phase == "create":
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.write(fd, data)
                os.close(fd)
            elif phase == "stat":
                if os.stat(p).st_size != size:
                    raise SystemExit(f"{p}: wrong size")
            else:
                os.unlink(p)
        end.wait()
    os.rmdir(d)

results = {p: [] for p in PHASES}
per_file = {}
cpu_runs = {}
diags = []
for run in range(runs):
    start, end = mp.Barrier(procs + 1), mp.Barrier(procs + 1)
    ws = [mp.Process(target=worker, args=(i, run, start, end), daemon=True) for i in range(procs)]
    for w in ws:
        w.start()
    before, cbefore = mds_ops(), cpus()
    for phase in PHASES:
        dbefore = diag(ws) if want_diag else None
        start.wait()
        t0 = time.monotonic()
        end.wait()
        dt = time.monotonic() - t0
        dafter = diag(ws) if want_diag else None
        time.sleep(1)  # RELEASEs (CLOSE) arrive asynchronously
        after, cafter = mds_ops(), cpus()
        n = procs * files
        if want_diag:
            dd = diag_diff(dbefore, dafter, n)
            dd.update(run=run, phase=phase, rate=round(n / dt), cpu_speed_ns=cpu_speed(),
                      t=[round(t0, 6), round(t0 + dt, 6)], dev=os.stat(mnt).st_dev)
            diags.append(dd)
            print("diag " + json.dumps(dd), file=sys.stderr, flush=True)
        results[phase].append(n / dt)
        diff = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        secs = {k[:-2]: v for k, v in diff.items() if k.endswith("_s")}
        syncs = diff.pop("@syncs", None)
        p50 = sync_p50(diff)
        diff = {k: v for k, v in diff.items() if not k.startswith("@le:")}
        diff = {k: v for k, v in diff.items() if not k.endswith("_s")}
        per_file[phase] = {
            "compounds": diff.get("SEQUENCE", 0) / n,
            "ops": sum(v for k, v in diff.items() if k != "SEQUENCE") / n,
            "lookups": diff.get("LOOKUP", 0) / n,
            "commits": diff.get("COMMIT", 0) / n,
            "by_op": {k: round(v / n, 3) for k, v in sorted(diff.items()) if v},
            # Mean time the MDS spent running each operation, in µs.
            # (empty from a server without shoal_nfs_op_seconds_total)
            "us_per_op": {k: round(1e6 * secs[k] / v, 1) for k, v in sorted(diff.items()) if v and k in secs},
        }
        if syncs is not None:
            per_file[phase]["log_syncs"] = round(syncs / n, 3)
        if p50 is not None:
            per_file[phase]["log_sync_p50_us"] = p50
        # CPU-seconds per thousand files, the median over the runs.
        for k in cafter:
            cpu_runs.setdefault((phase, k), []).append(1000 * (cafter[k] - cbefore[k]) / n)
        before, cbefore = after, cafter
        if phase == "create" and drop:
            drop_caches()
            time.sleep(0.5)  # the mount handles the kernel's FORGETs
            before, cbefore = mds_ops(), cpus()
    for w in ws:
        w.join()
        if w.exitcode != 0:
            raise SystemExit(f"worker failed with {w.exitcode}")

out = {"procs": procs, "files": files, "size": size, "runs": runs, "drop_caches": drop,
       "load_average": os.getloadavg()}
print(f"{'phase':8} {'median/s':>10} {'runs/s':>24} {'compounds/file':>15} {'ops/file':>9} {'LOOKUP/file':>12} {'COMMIT/file':>12} {'srv CPU-s/1k':>13} {'mnt CPU-s/1k':>13}")
for phase in PHASES:
    r = results[phase]
    pf = per_file[phase]
    cs = {k: round(statistics.median(cpu_runs[(phase, k)]), 3) for k in ("server", "mount")}
    out[phase] = {"per_second": round(statistics.median(r)), "runs": [round(x) for x in r], **pf,
                  "cpu_s_per_1k": cs}
    print(f"{phase:8} {statistics.median(r):10.0f} {' '.join(f'{x:.0f}' for x in r):>24} "
          f"{pf['compounds']:15.2f} {pf['ops']:9.2f} {pf['lookups']:12.2f} {pf['commits']:12.2f} "
          f"{cs['server']:13.3f} {cs['mount']:13.3f}")
if diags:
    out["diag"] = diags
tot = {k: sum(per_file[p][k] for p in PHASES) for k in ("compounds", "ops", "lookups", "commits")}
out["total_per_file"] = tot
print(f"{'total':8} {'':10} {'':>24} {tot['compounds']:15.2f} {tot['ops']:9.2f} {tot['lookups']:12.2f} {tot['commits']:12.2f}")
for phase in PHASES:
    print(f"  {phase} ops per file: " + " ".join(f"{k}={v}" for k, v in per_file[phase]["by_op"].items()))
    if per_file[phase]["us_per_op"]:
        print(f"  {phase} MDS µs per op:  " + " ".join(f"{k}={v}" for k, v in per_file[phase]["us_per_op"].items()))
    if "log_syncs" in per_file[phase]:
        p50 = per_file[phase].get("log_sync_p50_us")
        print(f"  {phase} metadata log fdatasyncs per file: {per_file[phase]['log_syncs']}"
              + (f" (median fdatasync {p50} µs)" if p50 is not None else ""))
print(json.dumps(out))
EOF
# DIAG=1: per run and phase, counters that do not depend on the rate
# (scheduler counters of the server, the mount and the workers, the
# machine's CPU by kind, garbage collections when GODEBUG=gctrace=1),
# per thousand files, as "diag" lines on stderr and in the JSON.
diag_logs=("" "" "")
if [[ $TARGET == shoal ]]; then diag_logs=("$work/up.log" "$work/mount.log" "$work/cluster/mds"); fi
drop=${DROP_CACHES:-1}
if [[ $drop == 1 && ! -w /proc/sys/vm/drop_caches ]]; then
	echo "not root: the kernel's caches are not dropped before the stat phase" >&2
	drop=0
fi
# With DIAG=1, as root, the FUSE requests the kernel sends are counted
# too, by opcode, from the fuse:fuse_request_send tracepoint (perf, the
# whole machine, this mount's connection picked out afterwards; FORGETs
# do not pass through it).
if [[ ${DIAG:-0} == 1 && $EUID == 0 && -d /sys/kernel/tracing/events/fuse/fuse_request_send ]] &&
	command -v perf >/dev/null; then
	perf record -q -e fuse:fuse_request_send -a -k CLOCK_MONOTONIC -o "$work/fuse.data" >/dev/null 2>&1 &
	perf_pid=$!
	sleep 1
fi
timeout "$TIMEOUT" python3 "$work/meta.py" "$mnt" "$metrics" "$PROCS" "$FILES" "$SIZE" "$RUNS" \
	"$server_pid" "$mount_cpu_pid" "$drop" "${diag_logs[@]}" "${DIAG:-0}" | tee "$work/out.txt"
tail -n 1 "$work/out.txt" >"$work/out.json"
if [[ -n $perf_pid ]]; then
	kill -INT "$perf_pid"
	wait "$perf_pid" || true
	perf_pid=
	cat >"$work/fusereq.py" <<'EOF'
import collections, json, re, statistics, sys

out = json.load(open(sys.argv[1]))
events = []
for line in sys.stdin:
    m = re.match(r"\s*([0-9.]+):.*connection (\d+) .*\((\w+)\)", line)
    if m:
        events.append((float(m.group(1)), int(m.group(2)), m.group(3).removeprefix("FUSE_")))
n = out["procs"] * out["files"]
per_phase = collections.defaultdict(list)
for d in out.get("diag", []):
    t0, t1 = d["t"]
    # the phase and the second after it, where the RELEASEs arrive
    c = collections.Counter(op for t, conn, op in events if conn == d["dev"] and t0 <= t < t1 + 1)
    d["fuse_requests"] = {op: round(v / n, 3) for op, v in sorted(c.items())}
    per_phase[d["phase"]].append(d["fuse_requests"])
out["fuse_requests"] = {}
for phase, runs in per_phase.items():
    ops = sorted({op for r in runs for op in r})
    out["fuse_requests"][phase] = {op: round(statistics.median(r.get(op, 0) for r in runs), 3) for op in ops}
    print(f"  {phase} FUSE requests per file: " + " ".join(f"{op}={v}" for op, v in out["fuse_requests"][phase].items()))
json.dump(out, open(sys.argv[1], "w"))
EOF
	perf script -i "$work/fuse.data" -F time,trace 2>/dev/null | python3 "$work/fusereq.py" "$work/out.json"
fi
if [[ -n $OUT ]]; then cp "$work/out.json" "$OUT"; fi
