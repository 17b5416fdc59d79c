#!/usr/bin/env bash
# Shoal's full test run: installs what the tests need (Debian packages, Go
# modules), then runs vet, the unit and integration tests with the race
# detector, the fuzz smoke, the Go client suite against NFS-Ganesha, and the
# Linux kernel client workload in qemu, then smoke runs of the benchmark
# scripts at tiny sizes.
#
#   SHOAL_FUZZTIME=30s   time per fuzz target (0 to skip; 15 targets, so CI stays under 45 min with the failover tests and the newest kernel)
#   SHOAL_KERNEL=0       skip the qemu kernel-client test
#   SHOAL_KERNEL_NEWEST_SERVER=shoal-pnfs,shoal-pnfs-mirror,shoal-flex
#                        kinds run on the newest Debian kernel (all kinds
#                        run on 6.1; scripts/kernel-matrix.sh runs all on both)
#   SHOAL_CRASH_SMOKE=0  skip the machine-crash smoke (test/crash, qemu)
#   SHOAL_DISKLESS=0     skip the diskless-node boot (Debian booted in qemu with / on Shoal)
#   SHOAL_GANESHA=0      skip the Ganesha peer tests
#   SHOAL_SCRIPTS=0      skip the smoke runs of the benchmark scripts
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${SHOAL_FUZZTIME:-30s}
export SHOAL_KERNEL=${SHOAL_KERNEL:-1}
export SHOAL_GANESHA=${SHOAL_GANESHA:-1}
export SHOAL_KERNEL_SERVER=${SHOAL_KERNEL_SERVER:-shoal}
# test/deploy follows docs/deploy.md with Debian's etcd and etcdctl; it
# fails rather than skips when they are missing.
export SHOAL_DEPLOY=${SHOAL_DEPLOY:-1}
# test/statuspage opens the MDS's status page in Debian's chromium; it
# fails rather than skips when chromium is missing.
export SHOAL_BROWSER=${SHOAL_BROWSER:-1}

step() { printf '\n==== %s ====\n' "$*"; }

# This run's own files (the test event logs the summary counts, fuzz
# output) live in a fresh directory, removed when the script exits.
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

step "install dependencies"
pkgs=(qemu-system-x86 busybox-static tshark nfs-ganesha nfs-ganesha-vfs rpcbind fuse3 cpio kmod gcc libc6-dev iproute2 rsync git fio postmark jq bc etcd-server etcd-client chromium debootstrap curl)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# The kernel-client test fetches Debian's kernel package with apt-get
# download, which needs package lists even when nothing is missing.
if [ ${#missing[@]} -gt 0 ] || ! apt-cache policy linux-image-amd64 2>/dev/null | grep -q 'Candidate: [0-9]'; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
go mod download
go install gotest.tools/gotestsum@v1.12.3
export PATH="$(go env GOPATH)/bin:$PATH"

step "vet"
go vet ./...

step "unit and integration tests (race detector)"
# The kernel test runs separately below (it is long and not race-relevant).
gotestsum --format pkgname-and-test-fails --jsonfile "$work/test.json" -- \
	-race -count=1 -timeout 20m $(go list ./... | grep -v /test/kernel)

# fuzz_one PKG TARGET runs one fuzz target for $FUZZTIME. Go up to 1.26 has
# a race in its fuzzing coordinator (go.dev/issue/75804, fixed in 1.27): when
# the -fuzztime deadline fires while a worker is busy, the target can fail
# with a bare "context deadline exceeded" and no failing input. A loaded CI
# machine hits it now and then. Only that exact shape is forgiven, and only
# after the target's corpus replays clean; a crasher, a hang or any other
# error still fails the run.
fuzz_clean=0 fuzz_race=0
fuzz_one() {
	local pkg=$1 target=$2 out rc=0
	out=$(mktemp "$work/fuzz.XXXXXX")
	local corpus="$pkg/testdata/fuzz/$target"
	local before
	before=$(ls "$corpus" 2>/dev/null | sort | md5sum || true)
	go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$out" || rc=$?
	if [ "$rc" = 0 ]; then
		fuzz_clean=$((fuzz_clean + 1))
	elif grep -q '^    context deadline exceeded$' "$out" &&
		! grep -q 'Failing input written' "$out" &&
		[ "$(ls "$corpus" 2>/dev/null | sort | md5sum || true)" = "$before" ]; then
		echo "--- $target: bare coordinator deadline (go.dev/issue/75804), no failing input; replaying the corpus"
		go test -count=1 -run "^${target}\$" "$pkg"
		fuzz_race=$((fuzz_race + 1))
	else
		rm -f "$out"
		return 1
	fi
	rm -f "$out"
}

if [ "$FUZZTIME" != "0" ]; then
	step "fuzz smoke ($FUZZTIME per target)"
	# Every decoder that reads bytes from the network has a fuzz target.
	while read -r pkg target; do
		echo "--- $pkg $target"
		fuzz_one "$pkg" "$target"
	done < <(grep -rl --include='*_test.go' 'func Fuzz' . | while read -r f; do
		d=$(dirname "$f")
		grep -o 'func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/func //' | while read -r t; do echo "./${d#./} $t"; done
	done | sort -u)
fi

if [ "$SHOAL_KERNEL" = "1" ]; then
	# Two kernels (test/kernel/README.md): Debian 12's 6.1 runs every
	# kind; the newest kernel Debian ships (the unstable suite's, fetched
	# through a private apt configuration) runs two pNFS kinds: the files
	# layout over four data servers, and mirrored stripes under data-server
	# failures. scripts/kernel-matrix.sh runs every kind on both. Subtests are TestKernel/KERNEL/KIND/..., e.g.
	# TestKernel/6.1/shoal-pnfs/v4.1/io/64M.
	kernel_rc=0
	step "Linux kernel client in qemu: Debian 12 (6.1)"
	# Shoal runs five times: `shoal serve`, the pNFS cluster (`shoal up`,
	# 4 data servers), and a cluster of separate `shoal mds`/`shoal ds`
	# processes that gains a third data server under the mounted client
	# (shoal-pnfs-grow), and a cluster with two copies of every stripe that
	# loses two of its three data servers under a running dd
	# (shoal-pnfs-mirror), and a flexfiles export with 2 copies the client
	# writes itself (shoal-flex), and a flexfiles export whose data servers
	# are two NFS-Ganesha NFSv3 servers (shoal-flex-ganesha, loosely
	# coupled, with a fence). A list of kinds runs in one `go test`, so one
	# JSON file. The MDS-failover kind (shoal-failover: kill -9, SIGSTOP
	# and step-down of the leading MDS under the mounted client, in
	# network namespaces) takes 3.5-10 minutes per kernel here and is not in the
	# default list; SHOAL_KERNEL_SERVER=...,shoal-failover adds it, and
	# scripts/kernel-matrix.sh runs it on both kernels.
	kinds=$SHOAL_KERNEL_SERVER
	[ "$kinds" = shoal ] && kinds=shoal,shoal-pnfs,shoal-pnfs-grow,shoal-pnfs-mirror,shoal-flex,shoal-flex-ganesha
	SHOAL_KERNELS=6.1 SHOAL_KERNEL_SERVER=$kinds gotestsum --format standard-verbose --jsonfile "$work/kernel.json" -- \
		-count=1 -timeout 45m ./test/kernel/ || kernel_rc=1
	step "Linux kernel client in qemu: the newest Debian kernel"
	# If the newest kernel cannot be fetched, setup fails and so does
	# this step: it never falls back to another kernel.
	newest_kinds=${SHOAL_KERNEL_NEWEST_SERVER:-shoal-pnfs,shoal-pnfs-mirror,shoal-flex}
	SHOAL_KERNELS=newest SHOAL_KERNEL_SERVER=$newest_kinds gotestsum --format standard-verbose --jsonfile "$work/kernel-newest.json" -- \
		-count=1 -timeout 30m ./test/kernel/ || kernel_rc=1
	# The summary reads kernel.json: one file for both kernels' events.
	cat "$work/kernel-newest.json" >>"$work/kernel.json" 2>/dev/null || true
	[ "$kernel_rc" = 0 ] || { echo "kernel-client tests failed (see above)"; exit 1; }
fi

if [ "$SHOAL_KERNEL" = "1" ] && [ "${SHOAL_CRASH_SMOKE:-1}" = "1" ]; then
	step "machine crash in qemu (1 round per mode and the nofsync check; the 20-round run is scripts/crash-bench.sh)"
	# shoal serve in a VM on an ext4 disk, kill -9 of qemu mid-workload,
	# fsck and the acknowledged changes checked after the reboot
	# (test/crash/README.md). About 2-3 minutes under TCG.
	SHOAL_CRASH=1 SHOAL_CRASH_ROUNDS=1 SHOAL_CRASH_NEG_ROUNDS=2 gotestsum --format standard-verbose --jsonfile "$work/crash.json" -- \
		-count=1 -timeout 20m -run TestMachineCrash ./test/crash/
	cat "$work/crash.json" >>"$work/kernel.json" 2>/dev/null || true
fi

if [ "${SHOAL_DISKLESS:-1}" = "1" ]; then
	step "diskless node: Debian (systemd) booted in qemu with / on a Shoal cluster"
	# docs/diskless.md, test/diskless: a debootstrap root tree (cached in
	# /var/cache/shoal-diskless; the first run fetches it from Debian's
	# mirror) copied with shoal cp -a to shoal mds + 3 shoal ds (--mirrors
	# 2) in a network namespace, one VM on Linux 6.1 booting it through
	# the diskless initramfs. About 1 minute with the tree cached, about 5
	# on the first run (debootstrap).
	SHOAL_DISKLESS=1 gotestsum --format standard-verbose --jsonfile "$work/diskless.json" -- \
		-count=1 -timeout 30m -run TestDiskless ./test/diskless/ || { echo "diskless-node test failed (see above)"; exit 1; }
	cat "$work/diskless.json" >>"$work/kernel.json" 2>/dev/null || true
fi

if [ "${SHOAL_SCRIPTS:-1}" = "1" ] && [ -e /dev/fuse ]; then
	step "benchmark scripts smoke (tiny sizes; the real runs are separate commands)"
	# Keeps the long benchmark commands working: fio through every access
	# method, one stream and two, and shoal cp against cp -r between mounts.
	SIZE=8m RUNS=1 BSS="4k 1m" PBSS=1m JOBS=2 DOC= ./scripts/fio-access.sh
	FILES=4 SIZE_MB=2 DS=2 ./scripts/cp-vs-fuse.sh
fi
if [ "${SHOAL_SCRIPTS:-1}" = "1" ]; then
	step "scale benchmark smoke (2000 files; the 1M-file run is scripts/scale-bench.sh)"
	QUICK=1 OUT="$work/scale.json" ./scripts/scale-bench.sh
	step "failover benchmark smoke (1 trial of each fault; the 20-trial run is scripts/failover-bench.sh)"
	TRIALS=1 OUT="$work/failover.json" ./scripts/failover-bench.sh
fi

step "Debian package: build, dpkg -i, run as installed, dpkg -P"
# The example configurations as installed, with etcd-server's etcd on
# loopback; see the script for what it checks.
./scripts/deb-check.sh

step "summary"
# One closing line over every test event of the run (unit, integration, kernel).
cat "$work/test.json" "$work/kernel.json" 2>/dev/null | python3 -c '
import json, sys
p = f = s = 0
for line in sys.stdin:
    try:
        ev = json.loads(line)
    except ValueError:
        continue
    if not ev.get("Test"):
        continue
    a = ev.get("Action")
    p += a == "pass"; f += a == "fail"; s += a == "skip"
print(f"{p} passed, {f} failed, {s} skipped")
'
if [ "$FUZZTIME" != "0" ]; then
	echo "fuzz: $((fuzz_clean + fuzz_race)) targets passed ($fuzz_race after the Go coordinator's deadline race, corpus replayed clean)"
fi
