#!/usr/bin/env bash
# The MDS failover benchmark: TRIALS trials (default 20) each of kill -9,
# SIGSTOP and `shoal admin step-down` of the leading MDS under Shoal's
# client workload (3 etcd members, 2 MDS nodes, 3 data servers with 2
# copies, all real processes on 127.0.0.1), printing per trial the time to
# detect, to the first metadata change at the new leader and to resumed
# I/O, with median and maximum; JSON in OUT (default failover.json).
#
#   TRIALS=20 BIG_MB=32 OUT=failover.json scripts/failover-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v etcd >/dev/null || { echo "failover-bench: needs etcd (apt-get install etcd-server)" >&2; exit 1; }
# A trial whose workload saw an error or lost a change fails the run (the
# table is still printed and the JSON written).
rc=0
SHOAL_FAILOVER_BENCH=1 SHOAL_FAILOVER_TRIALS="${TRIALS:-20}" SHOAL_FAILOVER_BIG_MB="${BIG_MB:-32}" \
	SHOAL_FAILOVER_OUT="$(realpath -m "${OUT:-failover.json}")" \
	go test -count=1 -timeout 180m -run '^TestFailoverBench$' -v ./test/failover >"${TMPDIR:-/tmp}/failover-bench.$$.log" 2>&1 || rc=$?
grep -Ev '^\s*(=== RUN|PASS|ok )|^\s+\S+ \S+ W \||^\s+time=|^\s+raft|^\{' "${TMPDIR:-/tmp}/failover-bench.$$.log" | grep -Ev '^\s+harness.go|^\s{8}' || true
rm -f "${TMPDIR:-/tmp}/failover-bench.$$.log"
test -s "$(realpath -m "${OUT:-failover.json}")"
exit "$rc"
