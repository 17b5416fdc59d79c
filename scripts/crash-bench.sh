#!/usr/bin/env bash
# The machine-crash benchmark (test/crash): `shoal serve` in a qemu VM
# with its metadata on an ext4 virtio disk; a client on the host makes
# creates, renames, removes and mkdirs and logs each acknowledgement; the
# harness kills qemu (kill -9: a power cut) at a random moment 3-9 s in,
# boots again on the same disk, runs `shoal admin fsck` in the guest and
# checks the namespace against the acknowledgements. ROUNDS rounds per
# mode, one disk per mode:
#   sync     the default: every acknowledged change must be there;
#   async    --sync=false --commit-interval INTERVAL: what is missing must
#            have been acknowledged less than INTERVAL (+ SLACK, for the
#            fdatasync itself) before the kill, both times on the host;
#   nofsync  the default with the log's fdatasync skipped (a test-only
#            build): the harness must catch the loss (NEG_ROUNDS at most).
# Prints a table per round and a summary per mode; the rows as JSON in
# OUT/crash.json, consoles and op logs in OUT/artifacts.
#
#   ROUNDS=20 MODES=sync,async,nofsync INTERVAL=100ms OUT=crash scripts/crash-bench.sh
#   REPORT=docs/bench/crash-20.json scripts/crash-bench.sh   # the table of an earlier run
#
# Needs qemu-system-x86, busybox-static, e2fsprogs, cpio and the kernel
# test/kernel fetches (test/kernel/setup.sh installs what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${OUT:-crash}")
mkdir -p "$out"
export SHOAL_CRASH=1
export SHOAL_CRASH_ROUNDS=${ROUNDS:-20}
export SHOAL_CRASH_NEG_ROUNDS=${NEG_ROUNDS:-3}
export SHOAL_CRASH_MODES=${MODES:-sync,async,nofsync}
export SHOAL_CRASH_INTERVAL=${INTERVAL:-100ms}
export SHOAL_CRASH_SLACK=${SLACK:-1s}
export SHOAL_CRASH_OUT=$out/crash.json
export SHOAL_CRASH_ARTIFACTS=${SHOAL_CRASH_ARTIFACTS:-$out/artifacts}
echo "crash-bench: $SHOAL_CRASH_ROUNDS rounds of $SHOAL_CRASH_MODES (nofsync: at most $SHOAL_CRASH_NEG_ROUNDS), commit interval $SHOAL_CRASH_INTERVAL; log and JSON in $out; load $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
rc=0
if [ -n "${REPORT:-}" ]; then
	SHOAL_CRASH_OUT=$REPORT
	: >"$out/test.log"
else
	go test -count=1 -timeout 600m -v -run TestMachineCrash ./test/crash/ >"$out/test.log" 2>&1 || rc=$?
fi
python3 - "$SHOAL_CRASH_OUT" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"no results: {e}")
    sys.exit(0)
rows = rows or []
# fsck: ok (nothing found), leaks (only data objects of creates a crash
# took back, async mode), BAD (anything else). leaked: such objects on
# the disk at that boot, earlier rounds' included unless the server's
# sweep of objects no file owns completed in the boot the round ran in
# (swept: y; "-" in runs from before the sweep existed).
print(f"{'mode':8} {'round':>5} {'kill s':>6} {'sent':>5} {'acked':>5} {'lost':>4} {'oldest lost ms':>14} {'in flight':>9} {'leaked':>6} {'swept':>5} {'fsck':>5} {'inodes':>6} {'boot s':>6}  result")
def swept(r):
    return "-" if "swept" not in r else ("y" if r["swept"] else "n")
def fsck(r):
    if r["fsck_ok"]:
        return "ok"
    return "leaks" if r["result"] == "pass" and r["leaked_data_objects"] > 0 else "BAD"
for r in rows:
    print(f"{r['mode']:8} {r['round']:5} {r['kill_after_s']:6.1f} {r['ops_sent']:5} {r['ops_acked']:5} {r['acked_ops_lost']:4} "
          f"{r['max_lost_age_ms']:14.0f} {r['in_flight_found']:9} {r['leaked_data_objects']:6} {swept(r):>5} {fsck(r):>5} "
          f"{r['inodes']:6} {r['boot_to_serving_s']:6.1f}  {r['result']}{(': ' + r['detail'][:160]) if r.get('detail') else ''}")
print()
for mode in dict.fromkeys(r["mode"] for r in rows):
    rs = [r for r in rows if r["mode"] == mode]
    passed = sum(r["result"] == "pass" for r in rs)
    lost = sum(r["acked_ops_lost"] for r in rs)
    acked = sum(r["ops_acked"] for r in rs)
    worst = max((r["max_lost_age_ms"] for r in rs), default=0)
    withloss = sum(r["acked_ops_lost"] > 0 for r in rs)
    leaked = rs[-1]["leaked_data_objects"] if rs else 0
    print(f"{mode}: {passed}/{len(rs)} rounds passed; {acked} changes acknowledged, {lost} of them lost in {withloss} rounds, "
          f"the oldest acknowledged {worst:.0f} ms before its kill; fsck found nothing in {sum(r['fsck_ok'] for r in rs)}, "
          f"only data objects of lost creates in {sum(fsck(r) == 'leaks' for r in rs)} ({leaked} such objects at the end); "
          f"a complete sweep before the kill in {sum(bool(r.get('swept')) for r in rs)}")
PY
grep -E -- '--- (FAIL|PASS)|caught the loss' "$out/test.log" | cut -c1-300 || true
echo "crash-bench: $(( $(date +%s) - start )) s, load $(cut -d' ' -f1-3 /proc/loadavg), exit $rc"
exit "$rc"
