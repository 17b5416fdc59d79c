// Package bench is Shoal's benchmark harness: the workloads behind
// `shoal bench` and the report they produce.
//
// # What is measured, and why this way
//
// The numbers answer one question: how does a single Shoal server compare
// with a mature single NFS server (NFS-Ganesha) on the same machine, seen
// through the same client? Both targets are therefore driven by Shoal's own
// Go client library over loopback TCP, so client-side costs are identical
// and any difference comes from the server.
//
// Each target is a [Starter]. The CLI starts Shoal as a child process (the
// same binary running `shoal serve`) rather than in-process, so the server's
// CPU time can be read from /proc and profiled on its own without the
// client's work mixed in. Ganesha is started through scripts/ganesha.sh. A
// server somebody else runs is just an address ([Existing]). The tests use
// [ShoalInProcess], which needs no binary.
//
// The workloads are deliberately few and simple:
//
//   - seq-write: one file written front to back in Block-sized WRITEs, with
//     Depth requests in flight (as a kernel client's write-back would have),
//     then COMMIT and CLOSE. The commit is inside the timed region: the
//     number is the rate at which data becomes durable, not the rate at which
//     the server's page cache absorbs it.
//   - seq-read: the same file read back the same way. Nothing is dropped
//     from the server's page cache, so this measures the server's protocol
//     and copy path, not the disk; the report says so.
//   - create, stat, remove: N empty files in one directory, one operation at
//     a time, so these are latency-bound rates of metadata round trips.
//
// Every block written carries its offset in its first bytes and every block
// read is checked against it, so a server that returns the wrong data fails
// the run instead of producing a fast number.
//
// Each workload runs Reps times; the report gives the median with min and
// max, because on a shared machine the mean is dominated by whichever
// neighbour was busy. The load average before and after the run is recorded
// for the same reason. Every loop is bounded by a count and by the run's
// context, and servers started by the harness are stopped (by the pid the
// harness started) whatever way the run ends.
package bench
