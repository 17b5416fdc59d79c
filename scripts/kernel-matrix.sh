#!/usr/bin/env bash
# kernel-matrix.sh: every kind of the kernel-client test (test/kernel) on
# both kernels: Debian 12's 6.1 and the newest kernel Debian ships (the
# unstable suite's). CI (scripts/test.sh) runs every kind on 6.1 but only
# the pNFS kinds on the newest kernel; this is the full matrix, about twice
# CI's kernel step (one VM at a time, TCG).
#
#   KINDS=shoal,shoal-pnfs,shoal-pnfs-grow,shoal-pnfs-mirror
#   KERNELS=6.1,newest     (SHOAL_KERNELS: 6.1 and/or newest)
#   VERS=4.1,4.2           (SHOAL_KERNEL_VERS)
#   TIMEOUT=120m           go test -timeout
#   JSON=FILE              also keep the test events (go test -json) here
#
# Subtests are TestKernel/KERNEL/KIND/vMINOR/..., KERNEL being the major.minor
# of the kernel that booted (6.1, 7.2, ...). If the newest kernel cannot be
# fetched, the run fails; it never falls back to another kernel. Other
# SHOAL_KERNEL_* settings (README.md in test/kernel) pass through.
set -euo pipefail
cd "$(dirname "$0")/.."

export SHOAL_KERNEL=1
export SHOAL_KERNEL_SERVER=${KINDS:-shoal,shoal-pnfs,shoal-pnfs-grow,shoal-pnfs-mirror}
export SHOAL_KERNELS=${KERNELS:-6.1,newest}
export SHOAL_KERNEL_VERS=${VERS:-4.1,4.2}
timeout=${TIMEOUT:-120m}

# setup.sh resolves 6.1 from the machine's own package lists (the newest
# kernel from lists of its own); an empty list has no candidate.
if [[ ,$SHOAL_KERNELS, == *,6.1,* ]] && ! apt-cache policy linux-image-amd64 2>/dev/null | grep -q 'Candidate: [0-9]'; then
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
fi

echo "kernel-matrix: kernels $SHOAL_KERNELS, kinds $SHOAL_KERNEL_SERVER, versions $SHOAL_KERNEL_VERS"
start=$(date +%s)
rc=0
if command -v gotestsum >/dev/null; then
	gotestsum --format standard-verbose ${JSON:+--jsonfile "$JSON"} -- -count=1 -timeout "$timeout" ./test/kernel/ || rc=$?
elif [ -n "${JSON:-}" ]; then
	go test -json -count=1 -timeout "$timeout" ./test/kernel/ | tee "$JSON" || rc=$?
else
	go test -v -count=1 -timeout "$timeout" ./test/kernel/ || rc=$?
fi
echo "kernel-matrix: $(($(date +%s) - start)) s, exit $rc"
exit "$rc"
