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
// # The ior workload: pNFS scaling
//
// [RunIOR] asks a different question: does striping I/O over data servers
// (pNFS) scale, and what does it cost compared with sending every byte
// through the metadata server? It is modelled on IOR's file-per-process
// mode: Clients processes each write their own file sequentially in
// TransferSize calls, one at a time, with OPEN, COMMIT and CLOSE (which
// carries LAYOUTCOMMIT) inside the timed region; once every writer has
// finished, each reads its file back and checks it. The bandwidth is all
// bytes over the span from the earliest client's start to the latest
// client's end, as IOR computes it, so a straggler counts.
//
// The matrix is data-server counts × copies × pNFS on/off × repetitions.
// Each count gets a fresh cluster ([ClusterStarter]; the CLI runs `shoal
// up` as a child and learns its kernel-chosen port from --ready-file;
// [ClusterSplit] runs `shoal mds` and one `shoal ds` per data server, so
// the MDS's CPU can be told from the data servers'), so one count's files
// and caches do not leak into the next; so does each number of copies of
// every stripe unit (IORConfig.Mirrors, the cluster's `--mirrors`), which
// needs a starter with the [MirroredStarter] capability. Within a
// repetition the two pNFS modes alternate, so a noisy spell on a shared
// machine hits both.
//
// Clients are separate processes ([ProcessLauncher], the hidden `shoal
// bench client`) rather than goroutines, for the same reason as the
// server: each has its own CPU account and its own Go runtime, as real
// clients would. They speak a two-line protocol on stdin and stdout: a
// client dials, says it is ready, and waits for "go", so connection setup
// is outside the measurement and all clients start together (a barrier);
// then it reports its bytes, wall-clock start and end, its CPU time and its
// client.Stats deltas. Those deltas say how many bytes really went to the
// data servers and how many through the metadata server: the report states
// what happened, not what was asked for, and marks a pNFS-on cell in which
// the client fell back.
//
// On one machine over loopback, more data servers add no hardware: every
// server and client shares the same cores, so the figures mostly measure
// CPU cost per byte. The report therefore gives the servers' and the
// clients' CPU use for every cell next to the bandwidth, and says whether
// the cores were saturated.
//
// Each workload runs Reps times; the report gives the median with min and
// max, because on a shared machine the mean is dominated by whichever
// neighbour was busy. The load average before and after the run is recorded
// for the same reason. Every loop is bounded by a count and by the run's
// context, and servers started by the harness are stopped (by the pid the
// harness started) whatever way the run ends.
//
// # IOR's other modes, the metadata workloads and the emulated cluster
//
// The ior workload also runs IOR's segmented shared-file mode (every
// client its own segment of one file: the layout and LAYOUTCOMMIT paths
// see concurrent writers), random order (a permutation seeded by the
// client's index, so the reader, another process, revisits exactly the
// writer's transfers) and a stonewall (a phase stops after a time limit
// and reports what it moved; the reader then reads only the transfers its
// writer completed, so a stonewalled run still checks every byte). The
// first transfer always runs, which keeps a stonewalled phase meaningful
// and makes a 1 ns stonewall a deterministic test.
//
// [RunMeta] is mdtest and postmark in the same client-process harness:
// the md-* phases create, stat, read and remove many small files, with a
// barrier between phases, in a directory per client or in one shared
// directory (where the server serialises the directory's updates); the
// postmark phase builds a pool of files before the barrier and times only
// its transactions, whose choices come from a RNG seeded by the seed and
// the client's index, so a run can be repeated exactly.
//
// Over loopback none of this can show what pNFS is for. [TestbedCluster]
// runs the same clients and servers on an emulated cluster (package
// testbed): every role in a network namespace of its own behind a
// rate-limited link, and client i in client namespace i mod M, so each
// client has its own link as in the papers. The harness's own client
// (which only makes and removes directories) dials from inside a client
// namespace, as the testbed's addresses exist nowhere else.
// [GaneshaTestbed] puts the single-server baseline in the MDS namespace, so
// it crosses the same one link the MDS would. Every cell gets its ceiling,
// the raw capacity of the links its traffic crosses (min(clients, data
// servers) links with pNFS, one link through a single server; writes with
// m copies enter the data servers m times, so min(clients, data
// servers/m) links, see ceilingMBps), and the
// machine-wide CPU use over the phase: on a shared 2-core machine that is
// what tells a network-bound figure from a CPU-bound one. [Results] reads
// the JSON reports of a sweep back and writes their tables; package
// benchplot draws their plots (gonum.org/v1/plot), apart so that this
// package, and a shoal built with -tags noplot, do not link the plotting
// library.
package bench
