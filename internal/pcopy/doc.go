// Package pcopy is the copy engine of `shoal cp`: a parallel, resumable
// copy of files and directory trees between two NFSv4.1 (pNFS) servers,
// or between a server and the local file system. It is the client side
// of the inter-file-system transfer that the pNFS papers motivate: with a
// pNFS client on both ends, a copy can read from every source data server
// and write to every destination data server at once, so its throughput
// is bounded by the data servers and the network rather than by one
// metadata server or one stream.
//
// # Parallelism
//
// A copy first walks the source (READDIR returns the attributes it
// needs, so there is no per-file GETATTR), creates the directories and
// symlinks, and then copies regular files in chunks (Options.Chunk, 4 MiB
// by default, best a multiple of the stripe unit). One dispatcher hands
// chunks, in tree order and in file order, to Options.Jobs workers: small
// files are thus copied several at a time, and large files several
// chunks at a time. Each chunk is one ReadAt and one WriteAt of the
// client library, which with pNFS splits it at stripe-unit boundaries and
// sends every piece to its data server in parallel; Jobs x Chunk bytes
// are in flight, spread over all data servers of both clusters.
//
// Memory is bounded by a pool of Jobs chunk buffers: the dispatcher takes
// a buffer before it hands a chunk out, so it never runs ahead of the
// workers. A buffer whose WRITE was abandoned (cancelled context) may
// still be read by the client, so it is dropped rather than reused.
//
// # Atomicity and resuming
//
// A file is written under a temporary name beside its final one
// (".NAME.shoal-cp.tmp"), then closed (COMMIT, LAYOUTCOMMIT), given the
// source's mode and mtime, and renamed into place. An interrupted copy
// therefore never leaves a truncated file under the final name.
// Directory modes and mtimes are set last, deepest first, since writing
// into a directory changes its mtime and a read-only mode would stop the
// copy.
//
// Progress goes to a journal (by default JournalName in the destination
// directory), an append-only text file: a header naming the source, the
// resolved target and the chunk size, then one line per completed file
// and per completed chunk of a file in progress. Every record is keyed by
// the source file's size and mtime, so a file changed since is copied
// afresh. Chunk records are written only after the temporary file was
// synced (every Options.Checkpoint bytes), so a record never claims data
// the destination could lose; the journal itself is written and synced at
// most once a second, and a record lost to a crash only means copying a
// chunk again. A torn last line is ignored. Options.Resume skips
// completed files (those the journal records, when the destination still
// has them at the right size, and, unless verifying, any file in place
// with the source's size and mtime, which covers the last second before
// a kill) and completed chunks (when the temporary file is long enough
// to hold them). The journal is removed when the copy completes; without
// Resume an existing journal is an error rather than a silent restart.
//
// # Verification
//
// With Options.Verify the SHA-256 of each file is computed while its
// chunks are read from the source (chunks finish out of order, so each
// waits for its predecessors; the wait is bounded because chunks get
// their buffers in order) and compared with a re-read of the written
// temporary file. A file that does not match is removed rather than
// installed, is reported in Summary.Mismatches, and leaves the journal in
// place so a resumed copy redoes just those files. Verification doubles
// the memory bound (one re-read buffer per worker). A resumed copy with
// Verify reads the skipped chunks of partly copied files again for the
// checksum, but not completed files, whose checksums the journal keeps.
//
// # Sides
//
// Both ends are an FS: NFS wraps a client.Client, Local the os package.
// The interface is small on purpose; tests wrap it to count, cancel or
// corrupt I/O.
package pcopy
