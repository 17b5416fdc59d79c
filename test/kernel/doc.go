// Package kernel tests an NFSv4.1/4.2 server with the unmodified Linux
// kernel NFS client, the client most deployments will use.
//
// # Why a VM
//
// The host kernel of the CI machines has no NFS client, and mounting needs
// root in any case, so the client runs in a small qemu VM: a Debian kernel
// (downloaded and unpacked by setup.sh, never installed) and a busybox
// initramfs carrying the NFS modules, two static helpers (mountnfs,
// locktest) and the workload script. There is no usable KVM on these
// machines, so qemu runs with TCG; a boot takes about 5 s and the whole
// workload a few tens of seconds.
//
// # Kernels
//
// SHOAL_KERNELS selects the client kernels, a comma-separated list of
// "6.1" (Debian 12's kernel, the default) and "newest" (the kernel Debian's
// unstable suite ships, 7.2 in November 2026; its package lists come from
// a private apt configuration in the cache directory, so the machine's apt
// sources are never changed). Both use the same initramfs, workload and
// driver. Each kernel is a level of the subtest names, its major.minor:
// TestKernel/6.1/shoal-pnfs/v4.1/io/64M, TestKernel/7.2/shoal-pnfs/...,
// so a failure names the kernel. A kernel that cannot be fetched fails
// the test; the run never falls back to another kernel.
//
// # What runs
//
// For each minor version (4.1, 4.2) the driver starts the server under test
// on a free loopback port, boots the VM in phase "main" (mount, I/O of edge
// sizes with sha256 verification, namespace and attribute operations,
// concurrent O_APPEND, byte-range locks within one client and across two
// clients, unmount/remount re-verification, crash-test writes), kill -9s
// the server, restarts it on the same directory and boots phase "verify",
// which remounts and checks what phase "main" wrote. Each PASS/FAIL line
// the workload prints becomes a subtest, so a failure names the step.
// The guest's traffic is captured with qemu's filter-dump and, when tshark
// is installed, dissected as an independent check of the server's XDR (the
// "wire" subtest).
//
// # pNFS
//
// With SHOAL_KERNEL_SERVER=shoal-pnfs the server is `shoal up` (an MDS
// and four data servers). The checks that need the servers' view come from
// its Prometheus endpoint: the workload prints "SYNC tag" around the steps
// to be measured and waits until the driver has scraped the endpoint and
// typed "OK tag" on the console. The driver then compares the scrapes: each
// data server's share of the 64 MiB file, and the layout recalls of the
// truncate and remove steps. Whether the client gave a recalled layout
// back is read from the capture, because Linux answers a recall of an idle
// layout with NFS4ERR_NOMATCHING_LAYOUT and sends no LAYOUTRETURN.
// The small-file steps (tar x, read back, rm -r of 200 files up to
// 24 KiB) must leave the data servers without a READ, WRITE or COMMIT:
// the MDS keeps such files inline and its mdsthreshold attribute sends
// their I/O to it; an rm -r of larger files the guest had read must send
// each REMOVE once (the MDS waits for the layout recall it starts).
// The pNFS workload also reads files that end on or inside a 1 MiB stripe
// unit back with O_DIRECT after a cache drop (c/odirect.c). The last
// request then goes past the end of the file on a data server, which must
// answer with a short read and eof. A limit in the reader and guest
// timeouts turn a server that keeps returning data into a failure rather
// than a hang.
//
// With SHOAL_KERNEL_SERVER=shoal-pnfs-grow the driver runs `shoal mds` and
// two `shoal ds` processes (grow.go) and boots one VM per version, in
// phase "grow". The guest writes files, then prints "SYNC grow-add-ds".
// The driver starts a third data server, waits until `shoal admin status`
// shows it in service, and answers. The guest, still mounted, reads the
// old files back and writes new ones, then remounts and reads everything
// again. The driver checks from the status that the old files stayed on
// the first two data servers, and that the new files were striped over
// all three. From each process's metrics it checks that every data server
// carried its share of the new files' I/O.
//
// # Delegations
//
// For the kinds in SHOAL_KERNEL_DELEG (default "shoal"), each version
// first runs the delegation phases on fresh servers (deleg_test.go). Two
// VMs boot at once, each with its own NFSv4 client ID, and meet through
// the driver: the guest prints "POST tag value" and "WAIT tag", and the
// driver relays. One VM holds a file open under a read delegation while
// the other opens it for write: the server must recall the delegation
// (CB_RECALL, seen in the holder's capture), the holder must return it
// (DELEGRETURN in its mountstats), and the holder must then read the
// writer's bytes. Then the roles swap. A loop that opens, reads and
// closes 200 small files twice counts the mount's calls per operation
// in /proc/self/mountstats, with delegations on and, on a second
// server, off: with delegations the second pass sends no OPEN.
//
// # Running
//
// The test is skipped unless SHOAL_KERNEL=1 or -kernel is given, so that
// `go test ./...` stays fast. See README.md for the environment variables
// that select the server
// (SHOAL_KERNEL_SERVER=ganesha|shoal|shoal-pnfs|shoal-pnfs-grow|shoal-pnfs-mirror|shoal-failover|cmd)
// and the kernels (SHOAL_KERNELS=6.1,newest). scripts/test.sh runs every
// kind but shoal-failover on 6.1 and shoal-pnfs and shoal-pnfs-mirror on
// the newest kernel; scripts/kernel-matrix.sh runs every kind on both.
// shoal-failover (failover_test.go, failover.sh) takes the leading MDS
// of two away under the mounted client, in network namespaces.
package kernel
