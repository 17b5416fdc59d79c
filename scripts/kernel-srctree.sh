#!/bin/sh
# kernel-srctree.sh: what the Linux NFS client sends for a source tree's
# small files (issue 27). Boots the kernel-client harness's qemu VM
# (test/kernel; root, qemu and the cached kernels: see test/kernel/README.md)
# against `shoal serve`, unpacks a tarball of this repository's source
# (git archive HEAD, about 570 files; or SRCTREE_TAR) onto a 4.2 mount with
# busybox tar x, syncs, and removes it with rm -r; the driver scrapes the
# server's shoal_nfs_ops_total around each part and prints COMPOUNDs and
# operations per file, and writes srctree.json under ARTIFACTS.
#
#   scripts/kernel-srctree.sh
#   SERVER_ARGS="--delegations=false" scripts/kernel-srctree.sh
#   SERVER_ARGS="--sync=false" KERNELS=6.1,newest VERS=4.1,4.2 scripts/kernel-srctree.sh
#
# Environment: SHOAL (a prebuilt binary; default: built from this
# checkout), SERVER_ARGS (more `shoal serve` flags), KERNELS (6.1), VERS
# (4.2), SRCTREE_TAR, ARTIFACTS (default: a directory under /tmp, kept).
set -eu
cd "$(dirname "$0")/.."
art=${ARTIFACTS:-$(mktemp -d /tmp/kernel-srctree.XXXXXX)}
echo "artifacts: $art"
cd test/kernel
SHOAL_KERNEL=1 SHOAL_KERNEL_SRCTREE=1 \
	SHOAL_KERNELS="${KERNELS:-6.1}" SHOAL_KERNEL_VERS="${VERS:-4.2}" \
	SHOAL_KERNEL_SRCTREE_ARGS="${SERVER_ARGS:-}" SHOAL_KERNEL_SRCTREE_TAR="${SRCTREE_TAR:-}" \
	SHOAL_KERNEL_SHOAL_BIN="${SHOAL:-}" SHOAL_KERNEL_ARTIFACTS="$art" \
	go test . -run TestKernelSrcTree -count=1 -v -timeout 20m 2>&1 |
	grep -E 'srctree_test.go|--- |^(ok|FAIL)|vm: (PASS|FAIL)'
