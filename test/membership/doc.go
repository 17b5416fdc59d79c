// Package membership tests cluster membership the way an operator meets it:
// with real processes over loopback. It builds the shoal command once, runs
// `shoal mds` and several `shoal ds` as separate processes (each in its own
// process group, logs in files that are shown when a test fails), and
// drives them only through the command line: `shoal put`, `shoal get`,
// `shoal stat` and `shoal admin status|drain|remove`.
//
// TestMembership tells one story, once with the bbolt metadata engine and
// once with etcd (a real etcd embedded in the test process, package
// meta/etcdtest):
//
//  1. an MDS and two data servers; files of sizes around the stripe unit
//     (0, 1, 1 MiB-1, 1 MiB, 3 MiB+17, 20 MiB) are written and their
//     sha256 recorded;
//  2. a third data server joins: every file still reads back identical and
//     a new 20 MiB file is striped over all three;
//  3. one of the first two data servers is killed with SIGKILL: the files
//     with no stripe on it read back identical, the others fail (within
//     --ds-down-after plus slack, with a non-zero exit, no local file left
//     behind and a message naming the problem); which files have data on
//     it is read from its directory, and `shoal admin status` must list
//     every one of them as not fully available;
//  4. it restarts on the same directory and every file reads back;
//  5. it is drained while a writer and a reader keep working; the drain
//     succeeds, every file reads back, the data server holds no objects any
//     more, and `shoal admin remove` retires it (its process exits);
//  6. the MDS is killed and the data servers stopped, then all restart (the
//     data servers in reverse order) and every file reads back identical.
//
// Nothing is retried in a way that could hide wrong bytes: every read is
// compared with the sha256 taken when the file was written.
package membership
