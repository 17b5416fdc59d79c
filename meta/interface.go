package meta

import (
	"context"
	"errors"
	"time"
)

// Ino is an inode number. Numbers are allocated from a persisted counter and
// never reused, so an NFS file handle built from an Ino can never name a
// different file later. RootIno is the root directory.
type Ino uint64

// RootIno is the inode number of the root directory.
const RootIno Ino = 1

// FileType is the type of an inode. The values match NFSv4 nfs_ftype4 so the
// server can put them on the wire unchanged.
type FileType uint8

const (
	TypeRegular   FileType = 1 // NF4REG
	TypeDirectory FileType = 2 // NF4DIR
	TypeBlock     FileType = 3 // NF4BLK
	TypeChar      FileType = 4 // NF4CHR
	TypeSymlink   FileType = 5 // NF4LNK
	TypeSocket    FileType = 6 // NF4SOCK
	TypeFIFO      FileType = 7 // NF4FIFO
)

func (t FileType) valid() bool { return t >= TypeRegular && t <= TypeFIFO }

func (t FileType) String() string {
	switch t {
	case TypeRegular:
		return "reg"
	case TypeDirectory:
		return "dir"
	case TypeBlock:
		return "blk"
	case TypeChar:
		return "chr"
	case TypeSymlink:
		return "lnk"
	case TypeSocket:
		return "sock"
	case TypeFIFO:
		return "fifo"
	}
	return "unknown"
}

// ModeMask selects the permission bits (including setuid, setgid and sticky)
// that Attr.Mode may hold.
const ModeMask = 0o7777

// MaxNameLen is the longest directory entry name, in bytes.
const MaxNameLen = 255

// Attr is the persistent attribute set of one inode.
type Attr struct {
	Type      FileType
	Mode      uint32 // permission bits only (ModeMask)
	Nlink     uint32 // files: hard links; directories: 2 + subdirectories
	UID, GID  uint32
	Size      uint64 // regular files: logical size; symlinks: len(target)
	RdevMajor uint32
	RdevMinor uint32
	Atime     time.Time
	Mtime     time.Time
	Ctime     time.Time
	Btime     time.Time // creation time; never changes
	// Change is the NFSv4 change attribute: bumped on every modification of
	// the inode (data, attributes and, for directories, entries). It is
	// persisted and strictly increasing for the life of the inode.
	Change uint64
	// Parent is the containing directory for directories (LOOKUPP, "..");
	// the root is its own parent. Zero for non-directories, which may have
	// several parents.
	Parent Ino
	// Verifier is the EXCLUSIVE4_1 create verifier, all zero if none.
	Verifier [8]byte
}

// SetAttr mask bits.
const (
	SetMode uint32 = 1 << iota
	SetUID
	SetGID
	SetSize
	SetAtime    // set Atime to SetAttr.Atime
	SetMtime    // set Mtime to SetAttr.Mtime
	SetAtimeNow // set Atime to the operation's now
	SetMtimeNow // set Mtime to the operation's now
	// SetChange raises the change attribute to at least SetAttr.Change. The
	// server uses it when it persists write attributes it has already
	// reported to clients, so the persisted value never goes backwards.
	SetChange
)

// SetAttr describes an attribute change; only fields selected by Mask apply.
type SetAttr struct {
	Mask  uint32
	Mode  uint32
	UID   uint32
	GID   uint32
	Size  uint64
	Atime time.Time
	Mtime time.Time
	// Change is the lower bound for the change attribute with SetChange.
	Change uint64
}

// CreateArgs describes a new inode for Engine.Create.
type CreateArgs struct {
	Type                 FileType
	Mode                 uint32
	UID, GID             uint32
	RdevMajor, RdevMinor uint32 // TypeBlock, TypeChar
	Target               string // TypeSymlink
	// Verifier is stored in Attr.Verifier when Exclusive is set, so that a
	// retransmitted EXCLUSIVE4_1 create can be recognised.
	Verifier  [8]byte
	Exclusive bool
}

// Node names an inode together with its attributes.
type Node struct {
	Ino  Ino
	Attr Attr
}

// ChangeInfo is a directory's change attribute just before and just after a
// namespace operation, taken inside the same transaction, so it can be
// reported to NFS clients as atomic change_info4.
type ChangeInfo struct {
	Before, After uint64
}

// RenameResult reports what Engine.Rename did.
type RenameResult struct {
	// Replaced is the inode that dstName named before the rename, with its
	// attributes after the rename; Ino is zero if nothing was replaced. A
	// Replaced.Attr.Nlink of zero means its last link went away: a regular
	// file is then an orphan (see Engine.Remove), anything else is gone.
	Replaced Node
	Src, Dst ChangeInfo
}

// Entry is one directory entry returned by Engine.ReadDir.
type Entry struct {
	Name   string
	Ino    Ino
	Cookie uint64 // pass back to ReadDir to continue after this entry
	Attr   Attr
}

// StatFS summarises the namespace.
type StatFS struct {
	Files   uint64 // inodes in use, including the root
	NextIno Ino    // next inode number to be allocated
}

// ClientRecord is one opaque NFSv4.1 client record.
type ClientRecord struct {
	Key, Rec []byte
}

// FirstCookie is the smallest cookie ReadDir hands out; NFS reserves 0, 1 and 2.
const FirstCookie = 3

// Engine is the metadata service used by the NFS server. Every mutating
// method is a single transaction that is durable when the method returns.
// Methods that take now use it for all timestamps they set; the zero time
// means time.Now().
//
// Errors are (or wrap) the sentinel values below; match them with errors.Is.
//
// Create, Link, Remove and Rename also write a replay record, and delete
// obsolete ones, in their transaction when ctx asks for it (WithReplay).
type Engine interface {
	// Init creates the root directory if it does not exist. It is idempotent.
	Init(ctx context.Context) error

	GetAttr(ctx context.Context, ino Ino) (Attr, error)
	// SetAttr applies sa, sets ctime and bumps change. A size change only
	// updates the attribute; truncating the data is the caller's job.
	SetAttr(ctx context.Context, ino Ino, sa SetAttr, now time.Time) (Attr, error)
	// Wrote records a data write that ended at offset end: the size grows
	// to end if it is smaller, mtime and ctime become now, change is bumped.
	Wrote(ctx context.Context, ino Ino, end uint64, now time.Time) (Attr, error)

	// Lookup resolves name in parent. "." and ".." are ordinary names here.
	Lookup(ctx context.Context, parent Ino, name string) (Node, error)
	// Create makes a new inode named name in parent. If the name exists it
	// returns ErrExist together with the existing inode, so the server can
	// implement UNCHECKED4 and EXCLUSIVE4_1 semantics.
	Create(ctx context.Context, parent Ino, name string, args CreateArgs, now time.Time) (Node, ChangeInfo, error)
	// Link adds name in parent for the non-directory ino. An orphan (Nlink
	// zero) cannot be linked again: that yields ErrNotFound, as link(2) of
	// an unlinked file gives ENOENT.
	Link(ctx context.Context, ino Ino, parent Ino, name string, now time.Time) (Attr, ChangeInfo, error)
	// Remove unlinks name from parent; directories must be empty. The
	// returned Attr.Nlink is zero when the last link went away. Inodes of
	// every type but regular files are then deleted in the same
	// transaction. A regular file instead becomes an orphan: its inode
	// stays, with Nlink zero, and is recorded in a persistent orphan set,
	// because NFS clients may still hold it open and POSIX keeps an open
	// file's data until the last close. An orphan has no name (Lookup of
	// the removed name fails as for any missing name), but GetAttr,
	// SetAttr and Wrote work on it and StatFS counts it as used, until
	// the caller frees it with FreeOrphan. A context from
	// WithFreeUnlinked has the inode deleted at once instead, when the
	// caller knows nobody holds the file open and it has no data outside
	// the engine.
	Remove(ctx context.Context, parent Ino, name string, now time.Time) (Node, ChangeInfo, error)
	// Rename atomically moves srcName in srcParent to dstName in dstParent,
	// replacing dstName following POSIX rules. A replaced regular file
	// whose last link this was becomes an orphan, as with Remove.
	Rename(ctx context.Context, srcParent Ino, srcName string, dstParent Ino, dstName string, now time.Time) (RenameResult, error)
	// Orphans returns the orphan set (see Remove) in inode order. The set
	// survives restarts, so a server can free, after a crash, the orphans
	// nobody holds open any more.
	Orphans(ctx context.Context) ([]Ino, error)
	// FreeOrphan deletes the orphan ino and its mark in the orphan set and
	// returns its last attributes; deleting the file data is the caller's
	// job. It is idempotent: an inode that no longer exists yields a zero
	// Attr (Type 0) and no error. An inode that has links refuses with
	// ErrInval and is left alone.
	FreeOrphan(ctx context.Context, ino Ino) (Attr, error)
	// FreeOrphans is FreeOrphan of each of inos in one transaction, or
	// in several where one is too large for the store (etcd). If one of
	// them has links it fails with ErrInval, and that transaction frees
	// nothing.
	FreeOrphans(ctx context.Context, inos []Ino) error
	Readlink(ctx context.Context, ino Ino) (string, error)
	// ReadDir returns up to max entries of dir whose cookie is greater than
	// cookie, in cookie order; eof reports that no entries follow. max
	// must be positive and is capped at 4096 to bound the transaction.
	// Cookies are stable for the life of the directory (see DirVerifier).
	ReadDir(ctx context.Context, dir Ino, cookie uint64, max int) (entries []Entry, eof bool, err error)
	StatFS(ctx context.Context) (StatFS, error)

	// PutClient stores an opaque client record under key, replacing any.
	PutClient(ctx context.Context, key, rec []byte) error
	// DeleteClient removes the record under key; a missing key is not an error.
	DeleteClient(ctx context.Context, key []byte) error
	// Clients returns all client records in key order.
	Clients(ctx context.Context) ([]ClientRecord, error)

	// StripeMap returns the stripe map of the regular file ino (see
	// StripeMap), or ErrNotFound if its data was never placed.
	StripeMap(ctx context.Context, ino Ino) (StripeMap, error)
	// PlaceStripeMap records m (with Gen 1) as ino's stripe map if it has
	// none, and returns the map ino has afterwards: m, or the one placed
	// first by a concurrent caller. ino must be a regular file.
	PlaceStripeMap(ctx context.Context, ino Ino, m StripeMap) (StripeMap, error)
	// ReplaceStripeMap replaces ino's map by m if its generation is still
	// gen, and returns the new map (generation gen+1); otherwise it fails
	// with ErrConflict and changes nothing.
	ReplaceStripeMap(ctx context.Context, ino Ino, gen uint64, m StripeMap) (StripeMap, error)
	// StripeMaps returns up to max stripe maps of inodes above after, in
	// inode order (max is capped at 1024). A map is deleted with its inode.
	StripeMaps(ctx context.Context, after Ino, max int) ([]FileStripeMap, error)

	// InlineData returns the data of the regular file ino if it is kept
	// inline (see WriteInline); ok is false if it is not. Bytes past the
	// data, up to the file's size, are zeros. A record failing its
	// checksum yields an error wrapping ErrCorrupt.
	InlineData(ctx context.Context, ino Ino) (data []byte, ok bool, err error)
	// WriteInline writes p at off into the inline data of the regular
	// file ino, and its size (if it grows) and mtime, in one transaction.
	// It fails with ErrNotInline, changing nothing, if ino has a stripe
	// map or off+len(p) exceeds limit.
	WriteInline(ctx context.Context, ino Ino, off uint64, p []byte, limit int, now time.Time) (Attr, error)
	// TruncateInline cuts ino's inline data to size if it is longer; the
	// file's size attribute is the caller's (SetAttr).
	TruncateInline(ctx context.Context, ino Ino, size uint64) error
	// DropInline deletes ino's inline data once the caller has copied it
	// to the data servers of its stripe map; without a map it fails
	// (ErrInval) unless the data is empty. A file without inline data is
	// left alone.
	DropInline(ctx context.Context, ino Ino) error

	// Policy returns the replication policy recorded for ino: set on a
	// directory with SetPolicy, or copied to a regular file or directory
	// from its parent when it was created (see Policy). It is the zero
	// Policy if none is recorded. A missing inode yields ErrStale, as for
	// every method that takes an inode.
	Policy(ctx context.Context, ino Ino) (Policy, error)
	// SetPolicy records p as the policy of the directory ino; a zero p
	// clears it. Like Lustre's default directory striping, the change
	// applies only to files and directories created in ino afterwards,
	// which get a copy of it: inodes created before keep the policy they
	// were created with (Policy.LayoutsBelow, which describes the
	// directory's subtree, is not copied). p.Mirrors must be 0 to
	// MaxMirrors, p.Layout and p.LayoutsBelow known values (else
	// ErrInval), and ino a directory (else ErrNotDir). The directory's
	// attributes, change included, are left alone: a policy is not an
	// NFS attribute.
	SetPolicy(ctx context.Context, ino Ino, p Policy) error

	// GetXattr returns the value of the extended attribute name of ino,
	// or ErrNoXattr. Names are opaque to the engine (the NFS server
	// stores the user namespace's names without the "user." prefix, as
	// RFC 8276 sends them): 1 to MaxXattrNameLen bytes, without NUL
	// (ErrInval if empty or with NUL, ErrXattrTooBig if longer). Every
	// inode type may carry attributes; a missing inode is ErrStale.
	GetXattr(ctx context.Context, ino Ino, name string) ([]byte, error)
	// SetXattr sets the extended attribute name of ino to value (at most
	// MaxXattrValueLen bytes, else ErrXattrTooBig). mode XattrCreate
	// fails with ErrExist if the attribute exists, XattrReplace with
	// ErrNoXattr if it does not. All attributes of an inode together
	// take at most MaxXattrBytes (ErrNoSpace). Like every change of the
	// inode's metadata it sets ctime to now and bumps change (the NFS
	// server returns the change before and after as SETXATTR's
	// change_info4); mtime is left alone. The attributes are deleted
	// with their inode.
	SetXattr(ctx context.Context, ino Ino, name string, value []byte, mode XattrMode, now time.Time) (ChangeInfo, error)
	// ListXattrs returns up to max names of ino's extended attributes
	// that come after cookie (0 to start), in name order; eof reports
	// that none follow. A cookie is a position in that order, as with
	// Linux's knfsd: an attribute added or removed between two calls
	// shifts the names after it, so a listing that spans calls while
	// another client changes the attributes may miss or repeat a name.
	ListXattrs(ctx context.Context, ino Ino, cookie uint64, max int) (names []XattrName, eof bool, err error)
	// RemoveXattr removes the extended attribute name of ino, or fails
	// with ErrNoXattr; ctime and change move as for SetXattr.
	RemoveXattr(ctx context.Context, ino Ino, name string, now time.Time) (ChangeInfo, error)

	// Replays returns the replay records stored under key, in ID order
	// (see ReplayRecord and WithReplay, which writes them).
	Replays(ctx context.Context, key ReplayKey) ([]ReplayRecord, error)
	// ListReplays returns up to max replay records (capped at 256) whose
	// IDs follow after (nil: from the first), in ID order.
	ListReplays(ctx context.Context, after *ReplayID, max int) ([]ReplayRecord, error)
	// DeleteReplays deletes the replay records ids; missing ones are no
	// error. Each batch of MaxReplayDrop is one transaction.
	DeleteReplays(ctx context.Context, ids []ReplayID) error
	// ExpireReplays deletes the replay records written before before and
	// returns how many it deleted.
	ExpireReplays(ctx context.Context, before time.Time) (int, error)

	// GetConfig returns the value stored under key, or ErrNotFound.
	GetConfig(ctx context.Context, key string) ([]byte, error)
	PutConfig(ctx context.Context, key string, val []byte) error

	Close() error
}

// Sentinel errors. The server maps each to one NFS4ERR_* value.
var (
	ErrNotFound     = errors.New("meta: no such entry")       // name or key missing (NFS4ERR_NOENT)
	ErrStale        = errors.New("meta: no such inode")       // inode gone (NFS4ERR_STALE)
	ErrExist        = errors.New("meta: entry exists")        // NFS4ERR_EXIST
	ErrNotDir       = errors.New("meta: not a directory")     // NFS4ERR_NOTDIR
	ErrIsDir        = errors.New("meta: is a directory")      // NFS4ERR_ISDIR
	ErrNotEmpty     = errors.New("meta: directory not empty") // NFS4ERR_NOTEMPTY
	ErrInval        = errors.New("meta: invalid argument")    // NFS4ERR_INVAL / BADNAME
	ErrNameTooLong  = errors.New("meta: name too long")       // NFS4ERR_NAMETOOLONG
	ErrNotSymlink   = errors.New("meta: not a symbolic link") // READLINK on non-link
	ErrTooManyLinks = errors.New("meta: too many links")      // NFS4ERR_MLINK
	ErrClosed       = errors.New("meta: engine closed")
	// ErrStoreFailed: a write or fdatasync of the engine's log failed, so
	// nobody knows what it holds; the engine refuses updates until it is
	// reopened (NFS4ERR_IO: never answer a change, or bytes, that a crash
	// could take back).
	ErrStoreFailed = errors.New("meta: metadata store failed, updates stopped")
	// ErrFenced: the engine's fence (EtcdOptions.Fence) no longer holds,
	// so this metadata server is no longer the leader and must not change
	// anything (NFS4ERR_DELAY, while it steps down).
	ErrFenced = errors.New("meta: fenced: no longer the leader")
	// ErrUnavailable: the metadata store could not be reached (an etcd
	// cluster without quorum) within the engine's retries; the operation
	// may be retried later (NFS4ERR_DELAY).
	ErrUnavailable = errors.New("meta: metadata store unavailable")
	ErrNoXattr     = errors.New("meta: no such extended attribute")                // NFS4ERR_NOXATTR
	ErrXattrTooBig = errors.New("meta: extended attribute name or value too long") // NFS4ERR_XATTR2BIG
	ErrNoSpace     = errors.New("meta: no space for extended attributes")          // NFS4ERR_NOSPC
)

// DirVerifier returns the NFS cookie verifier for a directory. Cookies are
// per-directory sequence numbers that are never reused, so a cookie stays
// valid for the life of the directory and the verifier never needs to change;
// it is derived from the directory's birth time so it is non-zero and stable.
func DirVerifier(a Attr) [8]byte {
	var v [8]byte
	n := uint64(a.Btime.UnixNano()) | 1
	for i := range v {
		v[i] = byte(n >> (56 - 8*i))
	}
	return v
}
