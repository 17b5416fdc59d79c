#!/usr/bin/env bash
# diskless-bench.sh: several diskless nodes boot at once from one root
# tree (issue 26), on Shoal and on the single-server baselines. For every
# target and node count it runs `scripts/diskless.sh boot --target T
# --nodes N` (a fresh network namespace, fresh servers, the cached root
# tree and initramfs) and prints one table, and the same as JSON: each
# node's boot time to the boot check's first line (median and max across
# the nodes), and the bytes each server served, from the server's own
# counters (Shoal's Prometheus metrics, NFS-Ganesha's D-Bus statistics).
#
#   scripts/diskless-bench.sh [--kernel 6.1|newest] [--nodes "1 2 4"]
#                             [--targets "shoal serve ganesha"] [--out DIR]
#   scripts/diskless-bench.sh --report --out DIR [--targets ...] [--nodes ...]
#       only the table and JSON of the runs already in DIR (after one run
#       was redone with --targets T --nodes N --out DIR)
#
# Targets:
#   shoal    shoal mds + 3 shoal ds, --mirrors 2, pNFS files layout
#   serve    shoal serve: one Shoal server, no pNFS
#   ganesha  NFS-Ganesha (VFS backend), one server, the tree copied to
#            its local disk, NFSv4.2
#
# DIR (default a new /tmp/shoal-dlbench.XXXXXX) keeps each run's output
# (T-N.log), the table (table.md) and results.json. The machine's load
# average before and after each run is in the JSON and the table: the
# VMs run under TCG, so the numbers mean little on a busy machine.
#
# Environment: what scripts/diskless.sh reads (SHOAL_DISKLESS_MEM, default
# here 256 MiB per VM; SHOAL_DISKLESS_VM_TIMEOUT, default 600 s per boot);
# SHOAL_DLBENCH_RUN_TIMEOUT bounds one run (default 900 s).
#
# Needs root, qemu, curl, python3, and for ganesha nfs-ganesha,
# nfs-ganesha-vfs and dbus (dbus-daemon, dbus-send).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
kernel=6.1 counts="1 2 4" targets="shoal serve ganesha" out= report=0
while [ $# -gt 0 ]; do
	case "$1" in
	--report) report=1; shift ;;
	--kernel) kernel=$2; shift 2 ;;
	--nodes) counts=$2; shift 2 ;;
	--targets) targets=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
	esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/shoal-dlbench.XXXXXX)
mkdir -p "$out"
export SHOAL_DISKLESS_MEM=${SHOAL_DISKLESS_MEM:-256}
runto=${SHOAL_DLBENCH_RUN_TIMEOUT:-900}

fail=0
# --report (with --out): no runs, only the table of the logs in DIR.
if [ $report = 0 ]; then
# One shoal binary for every run.
bin=$out/shoal
(cd "$here" && go build -o "$bin" ./cmd/shoal) || { echo "go build ./cmd/shoal failed" >&2; exit 1; }
export SHOAL_BIN=$bin

# Node counts outside, targets inside: the three targets of one count run
# close together in time, under about the same load.
for n in $counts; do
	for t in $targets; do
		log=$out/$t-$n.log
		echo "diskless-bench: $t, $n node(s) ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
		{
			echo "LOAD before $(cut -d' ' -f1-3 /proc/loadavg)"
			rc=0
			timeout --kill-after=30 "$runto" "$here/scripts/diskless.sh" boot --target "$t" --nodes "$n" --kernel "$kernel" 2>&1 || rc=$?
			echo "LOAD after $(cut -d' ' -f1-3 /proc/loadavg)"
			echo "EXIT $rc"
		} >"$log"
		grep -q '^EXIT 0$' "$log" || { fail=1; echo "diskless-bench: $t, $n node(s) failed (see $log)" >&2; }
	done
done
fi

# The table and the JSON, from the runs' NODE, SERVER, RESULT and LOAD lines.
python3 - "$out" $targets -- $counts <<'PY'
import json, os, re, statistics, sys

out = sys.argv[1]
sep = sys.argv.index("--")
targets, counts = sys.argv[2:sep], [int(c) for c in sys.argv[sep + 1:]]
runs = []
for n in counts:
    for t in targets:
        path = os.path.join(out, f"{t}-{n}.log")
        if not os.path.exists(path):
            continue
        r = {"target": t, "nodes": n, "node_first_line_s": {}, "node_wire_rx_bytes": {},
             "node_guest_uptime_s": {}, "node_root_mounted_s": {}, "servers": {}, "failed_nodes": [], "load": {}}
        for line in open(path, errors="replace"):
            f = line.split()
            if not f:
                continue
            m = re.match(r"\s+(node\d+): \S+ DISKLESS first-line .*uptime=([0-9.]+)", line)
            if m:
                r["node_guest_uptime_s"][m.group(1)] = float(m.group(2))
                continue
            m = re.match(r"\s+(node\d+): ([0-9.]+) shoal-initramfs: mounted \S+ on /run/lower ", line)
            if m:
                r["node_root_mounted_s"][m.group(1)] = float(m.group(2))
                continue
            if f[0] == "NODE" and len(f) >= 3:
                kv = dict(x.split("=", 1) for x in f[3:] if "=" in x)
                if f[2] != "ok":
                    r["failed_nodes"].append(f[1])
                try:
                    r["node_first_line_s"][f[1]] = float(kv.get("first_line_s", ""))
                except ValueError:
                    pass
                if kv.get("wire_rx_bytes", "").isdigit():
                    r["node_wire_rx_bytes"][f[1]] = int(kv["wire_rx_bytes"])
            elif f[0] == "SERVER" and len(f) >= 3:
                if f[2] == "down":
                    r["servers"][f[1]] = None
                else:
                    r["servers"][f[1]] = {k: int(v) for k, v in (x.split("=", 1) for x in f[2:])}
            elif f[0] == "RESULT":
                r["result"] = dict(x.split("=", 1) for x in f[1:] if "=" in x)
            elif f[0] == "LOAD":
                r["load"][f[1]] = " ".join(f[2:])
            elif f[0] == "EXIT":
                r["exit"] = int(f[1])
        times = list(r["node_first_line_s"].values())
        if times:
            r["first_line_median_s"] = round(statistics.median(times), 2)
            r["first_line_max_s"] = round(max(times), 2)
        # From the initramfs's root mount to the first line: the part of
        # the boot that reads the root (systemd's start).
        after = [r["node_first_line_s"][k] - v for k, v in r["node_root_mounted_s"].items() if k in r["node_first_line_s"]]
        if after:
            r["mount_to_first_line_median_s"] = round(statistics.median(after), 2)
            r["mount_to_first_line_max_s"] = round(max(after), 2)
        up = list(r["node_guest_uptime_s"].values())
        if up:
            r["guest_uptime_median_s"] = round(statistics.median(up), 2)
            r["guest_uptime_max_s"] = round(max(up), 2)
        runs.append(r)

json.dump(runs, open(os.path.join(out, "results.json"), "w"), indent=1)

def mb(b):
    return "-" if b is None else f"{b / 1e6:.1f}"

rows = ["| target | nodes | ok | first line median / max (s) | guest uptime at it, median / max (s) | root mount to first line, median / max (s) | bytes read by server (MB) | READs | LAYOUTGETs | delivered to the nodes (MB) | load before / after |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
for r in runs:
    srv = r["servers"]
    reads = ", ".join(f"{k} {mb(v['read_bytes']) if v else 'down'}" for k, v in srv.items())
    ops = ", ".join(f"{k} {v['READ']}" for k, v in srv.items() if v)
    lg = sum(v.get("LAYOUTGET", 0) for v in srv.values() if v)
    ok = r.get("result", {}).get("ok", "0")
    tm = f"{r['first_line_median_s']} / {r['first_line_max_s']}" if "first_line_median_s" in r else "-"
    gu = f"{r['guest_uptime_median_s']} / {r['guest_uptime_max_s']}" if "guest_uptime_median_s" in r else "-"
    mf = f"{r['mount_to_first_line_median_s']} / {r['mount_to_first_line_max_s']}" if "mount_to_first_line_median_s" in r else "-"
    wire = mb(sum(r["node_wire_rx_bytes"].values())) if r["node_wire_rx_bytes"] else "-"
    load = f"{r['load'].get('before', '?').split()[0]} / {r['load'].get('after', '?').split()[0]}"
    rows.append(f"| {r['target']} | {r['nodes']} | {ok}/{r['nodes']} | {tm} | {gu} | {mf} | {reads} | {ops} | {lg} | {wire} | {load} |")
table = "\n".join(rows) + "\n"
open(os.path.join(out, "table.md"), "w").write(table)
print(table)
print(f"JSON: {os.path.join(out, 'results.json')}")
PY
exit $fail
