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
// each: kv_bolt.go uses bbolt (a single local file), and a distributed
// store such as etcd can be added behind the same interface without touching
// namespace logic. For that reason no backend type leaks through the KV
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
// after the transaction is durable (bbolt fsyncs on commit): NFS requires
// metadata operations to be stable when they are answered. Serial creates
// therefore cost one fsync each. BoltOptions.GroupCommit lets concurrent
// callers share one transaction and one fsync: the first caller commits
// immediately and everyone who arrived meanwhile is committed in the next
// round, so there is no timer and no added latency for a lone caller. If a
// call fails after writing inside a shared transaction, the shared
// transaction is abandoned and each call is replayed in its own.
//
// # Inode numbers and change
//
// Inode numbers come from a persisted counter and are never reused, so file
// handles cannot alias. Attr.Change is a per-inode counter bumped in the same
// transaction as every modification; directory operations also return the
// parent's change value before and after (ChangeInfo) for NFS change_info4.
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
