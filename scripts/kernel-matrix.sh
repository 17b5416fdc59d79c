#!/usr/bin/env bash
# kernel-matrix.sh: every kind of the kernel-client test (test/kernel) on
# both kernels: Debian 12's 6.1 and the newest kernel Debian ships (the
# unstable suite's). CI (scripts/test.sh) runs every kind on 6.1 but only
# the pNFS kinds on the newest kernel; this is the full matrix, about twice
# CI's kernel step (one VM at a time, TCG), plus the MDS-failover kind
# (shoal-failover: root, network namespaces, Debian's etcd; 3.5-10
# minutes per kernel, which keeps it out of CI's default list).
#
#   KINDS=shoal,shoal-pnfs,shoal-pnfs-grow,shoal-pnfs-mirror,shoal-failover,shoal-flex,shoal-flex-mirror,shoal-flex-ganesha
#   KERNELS=6.1,newest     (SHOAL_KERNELS: 6.1 and/or newest)
#   VERS=4.1,4.2           (SHOAL_KERNEL_VERS; shoal-failover runs
#                          SHOAL_KERNEL_FAILOVER_VERS, default 4.2)
#   TIMEOUT=150m           go test -timeout
#   JSON=FILE              also keep the test events (go test -json) here
#   RUN=REGEX              go test -run, e.g. 'TestKernel/7.2/shoal-pnfs/'
#
# Subtests are TestKernel/KERNEL/KIND/vMINOR/..., KERNEL being the major.minor
# of the kernel that booted (6.1, 7.2, ...). If the newest kernel cannot be
# fetched, the run fails; it never falls back to another kernel. Other
# SHOAL_KERNEL_* settings (README.md in test/kernel) pass through.
set -euo pipefail
cd "$(dirname "$0")/.."

export SHOAL_KERNEL=1
export SHOAL_KERNEL_SERVER=${KINDS:-shoal,shoal-pnfs,shoal-pnfs-grow,shoal-pnfs-mirror,shoal-failover,shoal-flex,shoal-flex-mirror,shoal-flex-ganesha}
export SHOAL_KERNELS=${KERNELS:-6.1,newest}
export SHOAL_KERNEL_VERS=${VERS:-4.1,4.2}
timeout=${TIMEOUT:-150m}
run=${RUN:-.}

# setup.sh resolves 6.1 from the machine's own package lists (the newest
# kernel from lists of its own); an empty list has no candidate.
if [[ ,$SHOAL_KERNELS, == *,6.1,* ]] && ! apt-cache policy linux-image-amd64 2>/dev/null | grep -q 'Candidate: [0-9]'; then
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
fi

echo "kernel-matrix: kernels $SHOAL_KERNELS, kinds $SHOAL_KERNEL_SERVER, versions $SHOAL_KERNEL_VERS"
json=${JSON:-}
if [ -z "$json" ]; then
	json=$(mktemp "${TMPDIR:-/tmp}/kernel-matrix.XXXXXX.json")
	trap 'rm -f "$json"' EXIT
fi
start=$(date +%s)
rc=0
if command -v gotestsum >/dev/null; then
	gotestsum --format standard-verbose --jsonfile "$json" -- -count=1 -timeout "$timeout" -run "$run" ./test/kernel/ || rc=$?
else
	# The test events go to $json; the terminal gets the usual -v output.
	go test -json -count=1 -timeout "$timeout" -run "$run" ./test/kernel/ | tee "$json" | python3 -u -c '
import json, sys
for line in sys.stdin:
    try:
        ev = json.loads(line)
    except ValueError:
        print(line, end="")
        continue
    if ev.get("Action") == "output":
        print(ev["Output"], end="")
' || rc=$?
fi
# One closing line, and the failed subtests by name (kernel, kind, version).
python3 - "$json" <<'PY'
import json, sys
p = f = s = 0
failed = []
for line in open(sys.argv[1]):
    try:
        ev = json.loads(line)
    except ValueError:
        continue
    if not ev.get("Test"):
        continue
    a = ev.get("Action")
    p += a == "pass"; f += a == "fail"; s += a == "skip"
    if a == "fail":
        failed.append(ev["Test"])
for t in failed:
    print("FAILED", t)
print(f"{p} passed, {f} failed, {s} skipped")
PY
echo "kernel-matrix: $(($(date +%s) - start)) s, exit $rc"
exit "$rc"
