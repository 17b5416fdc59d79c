// Package diskless tests the recipe of docs/diskless.md: Debian booted in
// qemu VMs with / on a Shoal cluster. TestDiskless runs
// scripts/diskless.sh boot, which builds (and caches) a debootstrap root
// tree and an initramfs, starts shoal mds and three shoal ds (--mirrors 2)
// in a network namespace it creates and deletes, copies the tree with
// shoal cp -a, and boots the VMs; boot-check.service in the tree prints
// DISKLESS lines on each node's console and powers it off. The test checks
// those lines and the servers' own counters, which the script prints.
//
// It needs root, qemu and Debian's package mirror (the first run), so it
// only runs with SHOAL_DISKLESS=1:
//
//	SHOAL_DISKLESS=1 go test ./test/diskless -v -timeout 30m
//	SHOAL_DISKLESS=1 SHOAL_DISKLESS_KERNELS=6.1,newest SHOAL_DISKLESS_NODES=2 go test ./test/diskless -v -timeout 60m
//	SHOAL_DISKLESS=1 SHOAL_DISKLESS_KILL_DS=1 go test ./test/diskless -v -timeout 30m   # kill -9 a data server during the boot
//
// TestDisklessFaults (SHOAL_DISKLESS_FAULTS=1) boots a node that runs
// programs from its root in a loop (run-loop.sh) and kills -9 a data
// server, then the leading MDS of a failover cluster, under it
// (scripts/diskless.sh boot --loop SECS --kill ds|mds); the loop must see
// no error:
//
//	SHOAL_DISKLESS_FAULTS=1 go test ./test/diskless -run TestDisklessFaults -v -timeout 60m
//	SHOAL_DISKLESS_FAULTS=1 SHOAL_DISKLESS_KERNELS=6.1,newest go test ./test/diskless -run TestDisklessFaults -v -timeout 60m
package diskless
