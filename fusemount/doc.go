// Package fusemount serves an NFSv4.1+ export as a local FUSE file system,
// using Shoal's client library for every operation instead of the kernel's
// NFS client. It is what `shoal mount` runs, and it lets any POSIX program
// (cp, tar, git, rsync) exercise a Shoal server, or any other NFSv4.1
// server, through the same code path Shoal's benchmarks use.
//
// # Node tree
//
// Each file system object is a go-fuse [fs.Inode] keyed by the server's
// fileid, so hard links share one Inode and the kernel sees stable inode
// numbers. A node keeps what the server told it: the object's file
// handle and its last attributes. Operations on a node start from its
// handle, and operations on a name in a directory from the directory's
// (the client library's handle calls: PUTFH and the operation in one
// COMPOUND), so a known path is never walked from the root again, and an
// open file keeps working after its name is renamed or removed. Create,
// mkdir, symlink, mknod and link get the new object's handle and
// attributes in the COMPOUND that made it, a remove is one COMPOUND, and
// a directory listing carries each entry's handle and attributes, from
// which the kernel's READDIRPLUS (ls -l) is answered without a LOOKUP per
// name (dir.go).
//
// A handle goes stale when another client removes the object. The node
// then walks its path again (the go-fuse tree keeps it current across
// renames): the same object (same fileid) found there gets its new
// handle; anything else is ESTALE, on which the kernel looks the name up
// again and retries, so an answer about one object is never given for
// another. Open files carry their own [client.File], so reads, writes,
// fsync, getattr and ftruncate through a descriptor do not depend on the
// name at all.
//
// # Caching and the access methods
//
// The kernel caches a file's attributes for [Config].AttrTimeout (3 s)
// and names and directory attributes for [Config].DirTimeout (30 s), the
// kernel NFS client's acregmin and acdirmin: a change another client
// makes to a file, or its removal, shows in stat(2) within the first,
// and a rename within the second. This mount's own changes show at once
// (each reply carries the new attributes, and the kernel drops what an
// operation changed), opens always ask the server (close-to-open, below),
// and names that do not exist are not cached at all, so a file created
// elsewhere is visible at once.
//
// The kernel forgets names and attributes when it reclaims memory (and
// at drop_caches); the mount keeps its own bounded copy of what the
// server said ([Config].EntryCache entries), and answers the kernel's
// LOOKUP from it within the same timeouts, counted from when the server
// sent them, so the staleness bounds above hold for it too. The mount's
// own changes drop what they touch. A run of lookups of names that exist
// but are not in it (a stat of every file of a directory) makes the mount
// read the directory once, with its entries' handles and attributes,
// instead of a LOOKUP per name (entrycache.go).
//
// The mount keeps the attributes the server last gave for each file, and
// answers the kernel's GETATTR of a regular file nothing has open from
// them, without a round trip, while they are younger than AttrTimeout
// and no change made through the mount (a write, truncate, link, remove
// or rename) has ended since they were asked for; the reply carries only
// the rest of their timeout, so they are never older than the kernel's
// own cache would allow. With the writeback cache the kernel asks again
// after every close (it cannot keep the block count itself), and the
// close has just brought the attributes it needs (see handle.Flush).
//
// The access method ([Access]) decides what the kernel does with file
// data, and selects the client library's access method of the same name
// for what happens below it:
//
//   - [AccessCached] uses the kernel page cache and its writeback cache
//     (see below). Open revalidates the cache by the NFS change attribute
//     (close-to-open consistency): if the change attribute is the one
//     seen at the previous open or after this mount's own last writes,
//     the cache is kept (FOPEN_KEEP_CACHE), otherwise it is dropped.
//     The mount raises the kernel's readahead window to the policy's
//     Readahead (default 1 MiB; needs root), so the kernel prefetches
//     sequential reads with several large READs in flight, and read-only
//     opens read through the library directly (client.AccessDirect);
//     where the window stays at the kernel's 128 KiB they use the
//     library's cache and readahead instead (client.AccessCached).
//     Writable opens send the kernel's WRITEs on as they come
//     (client.AccessDirect), since the kernel already gathers and holds
//     them.
//   - [AccessODirect] uses the page cache for reads but drops it at
//     every open, writes through it (one FUSE_WRITE per write(2)), and
//     honours O_DIRECT opens by bypassing it for them (FOPEN_DIRECT_IO).
//     The library gathers small contiguous writes (client.AccessODirect).
//   - [AccessDirect] bypasses the page cache for every open: each read(2)
//     and write(2) becomes one ReadAt or WriteAt of the library, which
//     sends it on unchanged (client.AccessDirect).
//
// close(2) makes the library write back and COMMIT what was written
// through the file, so errors surface at close as NFS users expect and
// another client that opens the file afterwards sees the data; a
// descriptor that wrote nothing, or only FILE_SYNC, commits nothing. stat(2) of
// a file that is open asks the open File, so sizes count data the library
// still holds. pNFS is the library's business: with a server that offers
// layouts, I/O goes to the data servers.
//
// # The writeback cache (AccessCached)
//
// With AccessCached the mount asks the kernel for its writeback cache
// (FUSE_WRITEBACK_CACHE): write(2) only fills the page cache, and the
// kernel writes dirty pages back in large WRITEs at fsync(2), before
// every close(2) (before FUSE_FLUSH), and when its flusher runs, so small
// sequential writes cost about what large ones do. It changes several
// things the mount must allow for:
//
//   - The kernel reads through whatever handle a write(2) used, to fill
//     the rest of a page it only partly overwrites. O_WRONLY opens
//     therefore ask the server for read-write access, and fall back to
//     write-only when the user may not read the file; reads through such
//     a handle then go to the server with the write-only open, which may
//     refuse them, failing the write(2) rather than filling the page with
//     anything but the file's data.
//   - Dirty pages go back through any writable handle of the inode, not
//     necessarily the one they were written through (mmap writes too), so
//     close(2) and fsync(2) commit every open handle of the file that has
//     uncommitted writes.
//   - The kernel keeps a file's size and mtime itself and never takes the
//     server's size for an inode it holds. O_APPEND is the kernel's job.
//     The mtime of buffered writes arrives as a SETATTR through an open
//     handle with the data. The mount keeps it and sets it after the
//     data, at close (or fsync), in one COMPOUND with the GETATTR that
//     close-to-open needs anyway; if the server refuses it (the writer
//     does not own the file) it is dropped. An explicit mtime (utimes)
//     replaces the kept one. The first small WRITE of an empty file is
//     held for the close too and goes in that same COMPOUND, so a small
//     file costs one durable commit at close instead of two (held.go).
//   - After every link, unlink and rename of a regular file the kernel
//     sets the file's ctime itself and writes its times back at once, a
//     SETATTR of mtime and ctime in the same system call. The server
//     changed the ctime already, and the mtime is the kernel's cached
//     one, so the mount answers it without the server (ctimeflush.go):
//     forwarded, it cost a durable commit per operation and could put
//     back an mtime another client had changed since.
//   - Because the kernel never takes the server's size, an open that
//     finds the change attribute moved while nothing here had the file
//     open makes the kernel drop the inode and retry with a fresh lookup
//     (see evictChanged), so a file another client grew or shrank reads
//     right after the reopen. A file that stays open here while another
//     client changes its size keeps the kernel's size, and stat(2) of a
//     file that is not reopened shows the size the kernel knows: the
//     limits of the writeback cache on a shared file system.
//
// # Identity
//
// NFS AUTH_SYS credentials belong to a client connection, so the mount
// keeps one [client.Client] per distinct (uid, gid), dialled lazily on the
// first request from that identity. Without [Config].PerCaller every
// request uses the mounting identity ([Config].UID/GID), and only that
// user should use the mount. With it (meant for root mounts with
// allow_other) each request uses its caller's uid and gid from the FUSE
// request header, so files are created with the caller's ownership and
// the server enforces its permissions. The mount then also asks the kernel
// for default_permissions: the kernel checks mode bits against its cached
// attributes with the caller's full credentials, which covers what the
// server cannot see (a path walk through a directory whose entries the
// kernel has cached sends no LOOKUP), and the server checks again.
// Supplementary groups are not sent to the server. An open file keeps
// using the client of the identity that opened it.
//
// # Removing open files
//
// An NFS server may destroy a file as soon as its last name is removed,
// while POSIX keeps it alive for open descriptors. Like the kernel's NFS
// client, the mount therefore renames a file that is unlinked (or renamed
// over) while open to a hidden ".shoal-silly.*" name in the same directory
// and removes it at the last close.
//
// # Locks
//
// POSIX record locks (fcntl F_SETLK/F_SETLKW/F_GETLK) and flock(2) are
// forwarded to the server as NFSv4 byte-range locks. The client library
// gives every open its own lock owner, so locks belong to the open file
// description, like Linux OFD locks: two processes conflict as POSIX
// requires, but so do two descriptions opened separately by one process.
// A conflicting lock reported by F_GETLK carries pid 0, since the holder
// may be on another machine. flock(2) is emulated with whole-file
// byte-range locks, as the kernel NFS client does, so flock and fcntl
// locks on one file interact.
//
// # Errors
//
// Client errors become errnos in one place, the table in errno.go.
package fusemount
