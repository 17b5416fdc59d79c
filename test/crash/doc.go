// Package crash is the machine-crash harness: Shoal's metadata server
// runs inside a qemu VM with its database on a virtual ext4 disk, a
// client on the host makes namespace changes (creates, renames, removes,
// a few directories) and logs each one the moment it is acknowledged,
// and the harness kills the qemu process with SIGKILL at a random moment:
// a power cut, which takes the guest's page cache and everything the
// guest had not flushed to its disk. The VM then boots again on the same
// disk; the guest runs `shoal admin fsck` (meta.Check) before it serves,
// and the host compares the namespace it finds with the acknowledgement
// log.
//
// What each mode must show:
//
//   - sync (the default, --sync): every acknowledged change is there; a
//     change in flight at the kill (sent, not answered) may or may not
//     be;
//   - async (--sync=false --commit-interval I): the namespace is the
//     result of a prefix of each worker's changes, and every acknowledged
//     change missing was acknowledged less than I (plus
//     SHOAL_CRASH_SLACK for the fdatasync itself and the guest's timer)
//     before the kill. Both times are taken on the host, by the same
//     clock: the acknowledgement when the client's call returns, the
//     kill just before the signal. The guest's clock plays no part. A
//     record is written before its change is answered and is durable at
//     most I plus one fdatasync after it was written, so a change lost
//     was answered less than that before the kill;
//   - nofsync: the default mode with the log's fdatasync skipped
//     (SHOAL_TEST_SKIP_WAL_FSYNC=1 in a binary built with the
//     shoal_crashtest tag): the harness must catch a loss, and the
//     subtest fails if it does not.
//
// In every mode the database must open, fsck must find nothing, every
// earlier round's tree must be as it was, and a file whose create (with
// its 64 bytes written and committed) was answered must have its data.
//
// The test is opt-in (SHOAL_CRASH=1) and needs qemu, the kernel that
// test/kernel fetches, e2fsprogs and cpio; README.md says how to run it,
// and scripts/crash-bench.sh runs many rounds and prints a table.
package crash
