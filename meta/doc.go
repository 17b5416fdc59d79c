// Package meta is Shoal's metadata engine: the namespace (inodes, directory
// entries, symlink targets) plus the few small records an NFSv4.1 server must
// keep across restarts (client records, configuration values).
//
// # Layers
//
// The NFS server codes against one interface, Engine. Beneath it sits a tiny
// ordered, transactional key-value interface (kvStore/kvTxn: Get, Put,
// Delete, prefix Scan inside Update/View transactions), and the generic
// engine in engine.go implements every Engine method as a single KV
// transaction. Storage backends only implement the KV interface, one file
// each: kv_bolt.go uses bbolt (a single local file) and kv_etcd.go an etcd
// v3 cluster, with no namespace logic of their own. For that reason no backend type leaks through the KV
// interface, transaction bodies may be retried (they only read and write
// their transaction), and every transaction is small and bounded: a
// namespace operation touches a handful of keys and ReadDir reads at most
// its max entries (capped at 4096).
//
// # Key layout
//
// All keys live in one ordered keyspace; the first byte selects the table.
// Integers are big-endian so that byte order equals numeric order.
//
//	key                              value
//	'A' ino(8)                       inode record (versioned binary, below)
//	'D' parent(8) name               dentry: ver(1) ino(8) type(1) seq(8)
//	'S' parent(8) seq(8)             name (readdir index, ordered by seq)
//	'L' ino(8)                       symlink target
//	'K' 'i'                          next inode number (uint64)
//	'K' 'f'                          inodes in use (uint64)
//	'C' key                          configuration value
//	'c' key                          NFSv4.1 client record (opaque)
//	'O' ino(8)                       orphan: an unlinked regular file kept while open
//	'M' ino(8)                       stripe map of a regular file on the data servers (stripemap.go)
//	'P' ino(8)                       replication policy of a directory or regular file (policy.go)
//	'X' ino(8)                       extended attributes of an inode, all in one record (xattr.go)
//	'R' owner(16) digest(16) writer(4) seq(8)  replay record of a namespace change (replay.go)
//
// An inode record is a version byte (1) followed by fixed-width fields:
// type, mode, nlink, uid, gid, rdev, size, four timestamps as seconds(8) +
// nanoseconds(4) (so times outside the int64-nanosecond range survive),
// change, parent, create verifier and, for directories, the next readdir
// sequence number. Decoders accept longer records so fields can be appended
// without rewriting old ones.
//
// # Durability
//
// Every mutating Engine call is exactly one KV transaction, and returns only
// after the transaction is durable: NFS requires metadata operations to be
// stable when they are answered. The exception is a call made under a
// Deferred context, which returns once its transaction is written to the
// write-ahead log (below) and leaves the fdatasync to Sync, to a later
// synced call, or to the commit interval; engines without the log ignore
// it. Plain bbolt commits cost one bbolt commit
// (page writes, two fdatasyncs, the freelist) per transaction, 0.7-1 ms.
// BoltOptions.GroupCommit lets concurrent callers share one transaction and
// one commit: the first caller commits immediately and everyone who arrived
// meanwhile is committed in the next round, so there is no timer and no
// added latency for a lone caller. If a call fails after writing inside a
// shared transaction, the shared transaction is abandoned and each call is
// replayed in its own.
//
// # The write-ahead log
//
// BoltOptions.WAL, which servers use, puts a write-ahead log in front of
// bbolt (kv_wal.go, format in wal.go), so a durable commit is one small
// append and one fdatasync (about 0.1 ms here) instead of a bbolt commit.
// Rounds are grouped as with GroupCommit. A round runs its callers'
// transactions, one after another, against a view made of the committed
// overlay (below) over a bbolt read transaction, with their writes
// buffered in the round's own ordered layer; a transaction that fails
// leaves no writes (its part of the buffer is reverted, which gives the
// same result as GroupCommit's replay). The round's writes are then
// appended to the log as one record (length, CRC32C, sequence number,
// the last sequence number known durable, and the round's net puts and
// deletes in key order) with one write(2), the writes are published to
// the overlay, and the callers are answered. A caller that wants its
// change durable (every call not made under Deferred) then waits for an
// fdatasync covering its record; concurrent callers share them in
// rounds (wal_sync.go: the first starts one, those who come meanwhile
// join the next, which starts when it ends; each caller is woken once,
// when its round ends; a round yields to goroutines ready to run before
// its fdatasync, so that those about to commit join it), and the commit
// loop writes the next round while the log is being synced. A Deferred
// caller returns at once: its change is visible to everyone, and safe
// from a crash of the process (the kernel has it), but not from a crash
// of the machine until the log is synced.
// Whoever acts outside the engine on a change (the NFS server answering a
// client) calls Sync first, which syncs up to the last record written,
// so it covers everything a reader can have seen; Await does the same
// without starting an fdatasync of its own, for background work that can
// wait for the next one (the server's orphan freer). A timer makes sure a
// written record waits at most BoltOptions.CommitInterval (default 100
// ms) for its fdatasync when nobody asks for one. A round whose
// transactions wrote nothing (reads only) appends nothing. A failed
// append or fdatasync stops all further updates until restart, because
// the log's content is then in doubt (the next open recovers what reached
// the disk); reads go on.
//
// What a machine crash can do to records written but not synced: any of
// them may be lost, and since the page cache writes back in no particular
// order, a later one may reach the disk while an earlier one does not.
// Recovery replays the log up to the first record missing or damaged and
// drops what follows, which is a prefix of the transactions in commit
// order, each whole, so the namespace is the one of some earlier moment
// (never an entry without its inode). It tells that torn tail from damage
// to a durable record by the durable mark of the records after the gap:
// if one of them was written when the missing record was already known
// durable, the gap is damage, and opening fails rather than drop
// acknowledged changes. A log file's first record is synced before any
// other is written to it, and a checkpoint syncs the old file before
// switching to the next, so a gap never spans files. A Deferred caller
// waits for an fdatasync when more than 4096 records are pending, so the
// loss stays bounded even if the disk cannot keep up with the interval.
//
// A create lost that way gave its inode number, in a file handle, to a
// client. So that the number is never handed out again (handles must not
// alias), opening a database whose last run did not Close (log files
// present) advances the inode counter past every number the records that
// can have been lost could have allocated (walKV.inoGap: about a million).
// Per-inode counters (the change attribute, a directory's readdir
// sequence) can go back by the lost interval, as on any file system that
// answers before its journal commits.
//
// The overlay is an ordered in-memory map (github.com/google/btree) from
// key to value or tombstone, in two layers: active, what rounds committed
// since the last checkpoint began, over frozen, what a running checkpoint
// is writing to bbolt. Published layers are never modified (the commit loop
// writes to a private copy-on-write clone and publishes a new clone per
// round), so a View takes the current layers without copying and begins
// its bbolt read transaction under the same read lock. Get looks in the
// layers, newest first, then in bbolt; Scan merges the layers and a bbolt
// cursor in key order, a tombstone hiding the key beneath it.
//
// When the log passes BoltOptions.WALCheckpointBytes (16 MiB by default),
// the commit loop, between two rounds, creates the next log file and
// freezes active; a background goroutine then applies the frozen layer to
// bbolt in one ordinary synced transaction, removes the old log file,
// syncs the directory, and drops the frozen layer. Writers go on
// meanwhile, into the new file and a new active layer. Views stay
// consistent during a checkpoint: the frozen layer shadows bbolt with
// the same values whether or not a view's read transaction sees the
// checkpoint's commit, and a new freeze needs the write lock, so a view
// never pairs an overlay with a bbolt newer than it. bbolt keeps its normal
// synced commits, so its file is always consistent; the log files hold
// everything after the last checkpoint. Close checkpoints everything and
// removes the log.
//
// Log files are named after the database with a generation number
// (meta.db-wal-0000000000000002). A log file is given its full size (the
// checkpoint size and some slack, about 20 MiB) before use, so that an
// append never writes a new file size, and its blocks are written full of
// zeros, so that a commit's fdatasync overwrites data instead of turning
// fallocate'd space into data, which on ext4 costs a journal commit
// (wal_spare.go). That writing is kept off the commit path: the next log
// file is prepared in the background as a spare (meta.db-wal.spare,
// zeros, synced, renamed into place whole) while the current one fills,
// and a checkpoint's switch writes the header (magic, version,
// generation) over the spare's first bytes, fdatasyncs it, renames it to
// its generation's name and fsyncs the directory; if the spare is not
// ready then, the switch makes a file the old way: under a temporary name,
// header, fallocate, fsync, rename, directory fsync. Either way a file
// under its real name is always whole. Close leaves a ready spare for the
// next open. An open that finds none starts with a file made the old way
// ("cold", so that opening a store writes no 20 MiB of zeros); once that
// file holds 64 KiB a spare is prepared, and the log switches to it as
// soon as it is ready, through an early checkpoint. Leftover temporary
// files (of a log file or a spare) are removed at open, and so is a spare
// of another size; stores that never sync (NoSync) keep fallocate'd
// files. On open, the records of all log
// files are read in generation order and must form one sequence; reading
// stops at the first record that does not decode. That is a torn append
// (a crash during it, so its callers were never answered) only if no
// valid record follows anywhere after it; a damaged record followed by
// a valid one is an error, because acknowledged changes would be lost. The
// records are applied to bbolt in one synced transaction, the old files
// removed, and a new one started. Replaying is idempotent (records hold
// absolute puts and deletes), so a crash at any point of a checkpoint or
// of recovery (before or after the bbolt commit, before or after removing
// a file) recovers by replaying what is left.
//
// Opening without the log (WAL unset) first replays and removes any log
// files (and the spare) too, so the option can be switched either way between runs; a
// binary from before the log does not know to, so going back to one needs
// a clean Close (which leaves no log) first. The same holds for a binary
// that writes version 1 of the log (before the durable marks): it refuses
// a version 2 file rather than misread it, and reads none after a clean
// Close; this one reads both.
//
// The log is hand-written because no library offers one over bbolt: bbolt
// has no log of its own to relax (its NoSync mode gives up durability, and
// its Batch is group commit with a timer), the general-purpose Go logs
// (etcd's wal, tidwall/wal) own their own record format and recovery rules
// and leave the in-memory overlay, the merge with bbolt's snapshot and the
// checkpoint protocol to the caller, which is most of this code, and
// embedding an LSM store such as Pebble would replace bbolt rather than
// make its commits cheaper.
//
// # Checking a database
//
// Check reads a whole database in one read transaction and reports every
// way the namespace disagrees with itself (an entry without its inode,
// an inode no entry names, a link count, the readdir index, a record of a
// deleted inode, the counters, a data object no file owns); `shoal admin
// fsck --dir` runs it offline. Every change being one transaction, and
// recovery keeping a prefix of them, a database that only crashes
// happened to must always pass: the machine-crash harness (test/crash)
// cuts the power under a running server and checks that it does. The one
// exception is outside the namespace: a create answered under Deferred
// and lost can leave its file's data object, which Check reports; an
// unclean open sets the sweep mark (sweep.go) so that the server sweeps
// such objects (SweepMark, Unowned).
//
// # The read cache
//
// The bbolt engines keep the attributes of recently read inodes and the
// targets of recently looked-up names (negative answers included) in
// memory, so that GetAttr and Lookup of hot entries need no read
// transaction: a stat-heavy workload spends most of the server's engine
// time there otherwise. Every update drops what it touched before it
// commits and again after, and nothing is cached while an update is in
// flight, so no read ever goes back in time (readCache; the conformance
// suite's ReadCoherence case).
//
// That rule is sound only if this engine's updates are the only changes
// to the store. On bbolt the file lock makes it so. On etcd another
// metadata server may write the same keys, so the etcd engine keeps the
// cache only when it is fenced on a leadership with a lease proof
// (EtcdOptions.Fence with Valid, as `shoal mds` opens it under an
// election), and serves or stores an entry only while that proof holds
// at the moment of the read:
//
//   - Every commit carries the fence: the leader's election key still
//     has the create revision of this term. The key is bound to the
//     leader's lease, and no other candidate can commit before the key
//     is gone, since its own commits carry its own key, which leads only
//     once every earlier key is deleted.
//   - The key goes when the lease expires in etcd, which etcd does no
//     sooner than TTL after the last keepalive it answered reached it,
//     hence no sooner than TTL after that keepalive was sent. The leader
//     (internal/leader) counts its deadline from the send time, less a
//     margin for clock rates, on a clock that does not step back or stop
//     in a suspend. So while Valid says yes, the key stands and nobody
//     else has committed: etcd's state is what this engine's own commits
//     made it, and the cache, kept coherent with those commits as above,
//     answers exactly as a linearisable read would. (Resigning, or
//     revoking the lease, ends the term first in this process; a lease is
//     revoked from outside only for a process known dead.)
//   - Anything that breaks the proof empties the cache at the next read:
//     Valid failing (lease not renewed in time, or lost), a commit refused
//     by the fence (which also fails every later commit), a commit whose
//     outcome is unknown (a lost reply resolve could not settle: it could
//     still land under the cache's feet, until a later commit of ours
//     succeeds and so proves it never will), and Close. A read that began
//     before cannot store what it found (the generation moves).
//
// Without a fence (a single MDS on etcd, `shoal serve --meta etcd://`),
// or with EtcdOptions.NoReadCache, every GetAttr and Lookup asks etcd.
//
// # The etcd engine
//
// OpenBolt is the default: one local file, fast, and as available as the
// machine it is on. OpenEtcd keeps the same namespace in an existing etcd
// cluster (v3 API) for when one machine is not enough: the metadata
// survives the loss of the metadata server's disk or machine, and a
// replacement metadata server started elsewhere on the same etcd
// endpoints and prefix carries on with the same file handles. Servers
// select it with server.Config.MetaURL, and the command line with
// `shoal mds --meta etcd://HOST:PORT[,HOST:PORT...]/PREFIX --dir DIR` (or
// `shoal serve --meta ...`); DIR still holds the server's local files
// (`shoal serve` keeps file data there).
//
// Every key lives under the prefix (default "/shoal/"), so several Shoal
// clusters can share one etcd. Transactions are serializable, and a
// mutation returns only once etcd has committed it, which means written to
// a quorum of members' logs and applied. A View reads at a single etcd
// revision. An Update is optimistic: it reads a generation key, which fixes
// its snapshot revision, runs against that snapshot with its writes
// buffered (its reads and scans see its own writes), and commits with one
// etcd Txn that applies the writes and replaces the generation key only if
// the generation key is unchanged. Every committing Update replaces it, so
// the condition holds exactly when nothing committed since the snapshot,
// deletions included, which a compare on the keys read would miss. On a
// conflict the Update runs again, a bounded number of times. A commit
// whose reply is lost (leader change, timeout) is resolved, not guessed:
// the engine fences the old generation and then checks etcd's history to
// see whether its own commit was the one that replaced it.
//
// Any two concurrent Updates conflict, so the engine assumes a single
// active metadata server per prefix. It serialises its own Updates, and
// commits those that arrive while a commit is in flight together: one
// snapshot, each Update seeing the writes of the ones before it, one etcd
// Txn under the same condition each would have had alone (group commit,
// kv_etcd_group.go; EtcdOptions.NoGroupCommit turns it off). So only a
// second process writing the same prefix causes retries; two
// metadata servers on one prefix stay consistent but are not a supported
// configuration, because the NFS server keeps state in memory (opens,
// locks, caches) that assumes it owns the namespace.
//
// Each transaction must fit etcd's limits: --max-txn-ops (default 128, one
// of which is the generation key) and --max-request-bytes (default 1.5 MiB).
// Engine transactions are far smaller: the largest, a rename that replaces
// a symlink, writes 10 keys (the etcd conformance test runs with a budget
// of 32 operations to keep it so), and the largest values are a symlink
// target of at most 64 KiB and an inode's extended attributes, at most
// MaxXattrBytes (256 KiB) together. A transaction that would not fit fails whole with
// ErrTxnTooLarge; it is never split, which would break its atomicity.
// Reads are serialisable, answered by the member the client asks without
// a quorum round trip, but never from a revision older than the newest
// one the engine committed or read (etcdTxn.get): with one metadata
// server per prefix that is every change there is.
//
// On a cluster of several members the engine sends its reads and commits
// to the leader over a connection of its own, so that no commit is
// forwarded by a follower and no read waits for a member that has not
// applied the engine's last commit; on any failure of that connection it
// goes back to the client's round robin (kv_etcd_pin.go). Where a request
// goes never changes what it may return. A prefetch of a directory entry
// also reads the inode the entry led to when the engine last saw it, so
// a Lookup is one request (kv_etcd_hint.go): a hint only chooses what is
// read, at the same revision, and is never served as an answer.
//
// An update starts from what the engine's last commit read and wrote,
// since nobody else can have changed it without moving the generation
// key (kv_etcd_known.go), and a lone update takes the directory entries
// it neither knows nor has seen as absent, with its commit checking that
// they are (etcd's create revision 0): a create next to the engine's last
// one, and a remove of a file it created, are one request, the commit. A
// wrong assumption costs a second run on the same snapshot, never a wrong
// answer. Under a leadership with a lease proof, GetAttr and Lookup are
// served from memory (the read cache, above).
//
// Reads are not limited: scans page through etcd (EtcdOptions.ScanPage),
// so a large directory is never loaded at once. A single Get is a round
// trip to etcd; ReadDir reads its entries' dentries and inodes in batches
// instead (one read-only etcd Txn per EtcdOptions.MaxTxnOps keys, all at the
// transaction's snapshot revision): 1000 entries take about 25 ms on
// loopback, against about 200 ms one key at a time.
//
// # Inode numbers and change
//
// Inode numbers come from a persisted counter and are never reused, so file
// handles cannot alias. Attr.Change is a per-inode counter bumped in the same
// transaction as every modification; directory operations also return the
// parent's change value before and after (ChangeInfo) for NFS change_info4.
//
// # Replication policies
//
// A directory may carry a Policy (SetPolicy): the number of copies
// ("mirrors") the data of its files gets, and the pNFS layout type their
// clients get (Policy.Layout). A policy is a default for new
// inodes, as Lustre's default directory striping is: Create copies the
// parent's policy record to a new regular file or directory in the same
// transaction that creates it, so a file's own Policy is the one its data
// placement uses, and subdirectories pass the policy on. Changing a
// directory's policy later affects only what is created in it afterwards;
// Link and Rename never change a policy. The record is deleted with its
// inode (Remove of a directory, FreeOrphan of a file). What the data
// servers actually hold is the file's StripeMap, fixed when its data is
// first placed.
//
// # Extended attributes
//
// An inode may carry extended attributes (RFC 8276; the NFS server keeps
// Linux's user namespace in them): GetXattr, SetXattr, ListXattrs and
// RemoveXattr, with Linux's limits on a name (255 bytes) and a value (64
// KiB). All of an inode's attributes live in one record under its inode
// number, sorted by name, at most MaxXattrBytes: freeing an inode deletes
// one key however many attributes it had, so the transaction that frees
// it stays within etcd's operation limit, and a listing reads one key.
// Setting or removing an attribute rewrites the record and, in the same
// transaction, sets the inode's ctime and bumps its change attribute, as a
// local file system does. Attributes are not copied by Create or Link; they
// belong to the inode, so a renamed or linked file keeps them.
//
// # Replay records
//
// Create, Link, Remove and Rename called with a context from WithReplay
// also put the caller's replay record (what a server needs to answer a
// retransmission of the request that a previous server instance carried
// out, see the server package) and delete the records the caller retires,
// in the change's own transaction: a record exists exactly when its
// change was committed, and keeping records costs no transaction of its
// own. Replays, ListReplays, DeleteReplays and ExpireReplays read and
// remove them; the engine attaches no meaning to them.
//
// # Readdir cookies
//
// NFS clients resume READDIR from a cookie, possibly after other clients
// added or removed entries. Each directory therefore hands every new entry a
// sequence number from a per-directory counter (starting at FirstCookie,
// since NFS reserves 0, 1 and 2) and indexes the entry under ('S', dir, seq).
// ReadDir scans that index from cookie+1, so a cookie stays meaningful for
// the life of the directory, even if its own entry is removed, and entries
// added later appear after every existing one. A rename gives the entry a
// fresh sequence number in its new directory. Because cookies never go stale,
// the cookie verifier (DirVerifier) is a constant per directory.
package meta
