#!/usr/bin/env bash
# The MDS failover benchmark under the Linux kernel client: ROUNDS rounds
# (default 20) each of kill -9, SIGSTOP and `shoal admin step-down` of the
# leading MDS while the guest of the shoal-failover kernel kind runs its
# application (a paced dd with fsync and its read-back, a small-file
# create/rename/remove loop, a held lock); one VM boot and one cluster per
# kernel, the faults taking turns. Prints per round the time to detect, to
# the first metadata change in the guest, to resumed data-server I/O and
# the longest data-server I/O pause, with the median and maximum per fault;
# JSON per kernel in OUT. A round whose application saw an error, lost a
# change or a byte, or whose lock was granted elsewhere fails the run (the
# table is still printed). Shoal's own client: scripts/failover-bench.sh.
#
#   ROUNDS=20 KERNELS=6.1,newest MB=64 FAULTS=kill,stop,stepdown \
#     OUT=kernel-failover scripts/kernel-failover-bench.sh
#
# MB is the big file's size (at least 36: the fault comes once 32 MiB are
# written); 64 keeps a round near a minute under TCG, the kernel kind's
# default 256 takes 1-3. Needs root, iproute2 and Debian's etcd-server
# (scripts/test.sh installs what the kernel harness needs).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${OUT:-kernel-failover}")
mkdir -p "$out"
export SHOAL_KERNEL=1 SHOAL_KERNEL_SERVER=shoal-failover
export SHOAL_KERNELS=${KERNELS:-6.1,newest}
export SHOAL_KERNEL_FAILOVER_ROUNDS=${ROUNDS:-20}
export SHOAL_KERNEL_FAILOVER_FAULTS=${FAULTS:-kill,stop,stepdown}
export SHOAL_KERNEL_FAILOVER_MB=${MB:-64}
export SHOAL_KERNEL_FAILOVER_OUT=$out
export SHOAL_KERNEL_ARTIFACTS=${SHOAL_KERNEL_ARTIFACTS:-$out/artifacts}
if [[ ,$SHOAL_KERNELS, == *,6.1,* ]] && ! apt-cache policy linux-image-amd64 2>/dev/null | grep -q 'Candidate: [0-9]'; then
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
fi
echo "kernel-failover-bench: kernels $SHOAL_KERNELS, $SHOAL_KERNEL_FAILOVER_ROUNDS rounds of $SHOAL_KERNEL_FAILOVER_FAULTS, $SHOAL_KERNEL_FAILOVER_MB MiB; log and JSON in $out"
rc=0
go test -count=1 -timeout 600m -v ./test/kernel/ >"$out/test.log" 2>&1 || rc=$?
# The tables (printed unindented by the test), then what failed.
grep -E '^(failover under|round |fault |[a-z]+(\.[0-9]+)? +-?[0-9])|^$' "$out/test.log" | cat -s || true
grep -E -- '--- FAIL' "$out/test.log" || true
echo "kernel-failover-bench: exit $rc"
exit "$rc"
