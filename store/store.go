// Package store keeps the data of Shoal's regular files.
//
// The NFS server addresses file data by inode number only; names and
// attributes live in package meta. Backend is the seam between the two, so
// a data server for pNFS layouts or an object-store backend can replace the
// local one.
//
// # Local layout
//
// Local keeps inode N in DIR/data/XX/N, where XX is the low byte of N in hex.
// Inode numbers are allocated sequentially, so the low byte spreads files
// evenly over 256 directories and keeps each directory small. The 256
// directories are created up front, so creating a file never needs a mkdir.
// A missing data file means the file has no data yet: the server treats it
// as all zeros up to the size recorded in meta. With checksums on, DIR/data/XX/N.crc
// is the object's sidecar (see Checksums); it is never an object.
//
// # Descriptor cache
//
// NFS has no open/close for READ and WRITE, so the server would otherwise
// open and close a file for every request. Local keeps a bounded LRU cache
// of open descriptors. File handles are reference-counted: Open takes a
// reference and File.Close returns it; only unreferenced descriptors are
// evicted, so the cache can briefly exceed its bound while many files are in
// use. ReadAt and WriteAt use pread/pwrite, so one descriptor serves many
// goroutines concurrently.
//
// Remove unlinks the data file at once and detaches its cache entry; holders
// of a File keep a valid descriptor (POSIX unlink semantics) until they close
// it, and a later Open with create makes a fresh, empty file.
//
// # Durability
//
// Writes land in the page cache. File.Sync (and Backend.Sync, for NFS
// COMMIT) calls fdatasync; the first sync after a data file was created also
// fsyncs its directory so the file itself survives a crash. Truncate syncs
// before returning, because NFS SETATTR must be stable when answered. Remove
// does not sync: a data file resurrected by a crash belongs to an inode
// number that meta never reuses and is harmless garbage.
//
// # Checksums
//
// With LocalOptions.Checksums, Local keeps a CRC-32C (Castagnoli) of every
// 64 KiB block (ChecksumBlockSize) of an object and never returns bytes
// that fail it: ReadAt verifies every block it returns bytes of and fails
// with an error wrapping ErrCorrupt instead.
//
// The checksums of DIR/data/XX/N live in the sidecar DIR/data/XX/N.crc,
// which holds one 8-byte entry per block, entry i at offset 8*i:
//
//	bytes 0-3  "C32C"                      the entry holds a checksum
//	bytes 4-7  CRC-32C, little-endian      of block i
//
// An all-zero entry, or one past the end of the sidecar, records no
// checksum: that block is not verified (a block never written with
// checksums on, such as data from before they were turned on). Any other
// entry is damage to the sidecar and fails verification. The checksum
// covers the whole 64 KiB block, counting bytes past the end of the object
// as zeros, so extending an object (by a write, Truncate or Allocate)
// never changes the checksum of its old last block, and a block of zeros
// has the same checksum wherever it is.
//
// Each operation keeps the entries of the blocks it touches current:
//
//   - WriteAt gives every block it touches an entry. A block it covers
//     only partly is read first (read-modify-write) and verified against
//     its entry, so a bad block is never vouched for again: the write
//     fails with ErrCorrupt. Writing a block whole heals it. Writes of
//     whole blocks read nothing.
//   - Truncate drops the entries past the new end and recomputes the new
//     last block's entry, if it had one, after verifying it. Growing adds
//     no entries: the new blocks are zeros past the old end, and carry
//     none.
//   - PunchHole gives the blocks it zeroes wholly the zero-block checksum
//     and recomputes a partly punched block's entry, if it had one, after
//     verifying it. Allocate and Seek change no entries.
//   - Sync (File.Sync and Backend.Sync) fdatasyncs the sidecar after the
//     data. Remove unlinks the sidecar before the data.
//   - Verify checks a whole object for a scrubber; Walk lists the objects
//     and never yields a sidecar.
//
// A missing sidecar means no checksums; opening such an object creates an
// empty one. The file DIR/data/checksums marks a store whose sidecars are
// current. NewLocal with checksums on deletes every sidecar of a store
// without the marker (new, older, or run with checksums off, during which
// writes did not update the sidecars), then writes the marker; with
// checksums off it removes the marker. Without the option Local creates
// no sidecar and behaves as if checksums did not exist.
//
// Locking: two levels, always taken in this order. Each open object has an
// RWMutex: ReadAt, WriteAt and Verify hold it shared, Truncate and
// PunchHole exclusively (they touch unbounded ranges). Below it, 1024
// block locks (RWMutex, one cache line each) are shared by all objects;
// block b of inode N uses lock (hash(N)+b) mod 1024, so the blocks of one
// 1 MiB request never share a lock. ReadAt, WriteAt and Verify work in runs
// of at most 16 blocks, taking the runs' block locks in ascending lock
// order (readers shared, writers exclusive) and holding them across the
// data and sidecar I/O, so no reader sees a block's data without its
// matching entry and requests on different blocks run in parallel. The
// descriptor cache's mutex is never held together with these.
//
// Crashes: the data and the sidecar reach the disk independently, so a
// block written after the last Sync may disagree with its entry after a
// crash and then read as ErrCorrupt until it is written whole again; NFS
// clients resend uncommitted writes after a restart. Opening an object
// drops entries past the end of its data, which a crash can also leave.
// Truncate orders its steps with fdatasync so that it never leaves a
// disagreeing entry.
package store

import (
	"errors"
	"io"
)

// Backend stores the data of regular files by inode number.
type Backend interface {
	// Open returns a handle on the data of ino. Without create, a missing
	// file yields an error matching fs.ErrNotExist; a backend that does
	// not tell data never written from empty data (cluster.Striped, which
	// would have to ask its data servers) returns a handle on empty data
	// instead. Callers treat both alike: no data, all zeros up to the
	// size the metadata records.
	Open(ino uint64, create bool) (File, error)
	// Remove deletes the data of ino; it is safe while handles are open. A
	// missing file is not an error.
	Remove(ino uint64) error
	// Truncate sets the data size of ino, creating the file if needed, and
	// makes the change durable. A backend whose Open returns empty data
	// for data never written may leave such data empty.
	Truncate(ino uint64, size uint64) error
	// Sync makes all written data of ino durable (NFS COMMIT). A missing
	// file is not an error.
	Sync(ino uint64) error
	// StatFS reports space in bytes.
	StatFS() (total, free, avail uint64, err error)
	Close() error
}

// File is an open data file. All methods are safe for concurrent use.
type File interface {
	io.ReaderAt // io.EOF at or past the end, like os.File
	io.WriterAt
	// Sync makes written data durable (fdatasync).
	Sync() error
	Size() (int64, error)
	// Allocate reserves space for [off, off+length) and extends the size.
	Allocate(off, length int64) error
	// PunchHole deallocates [off, off+length) without changing the size.
	PunchHole(off, length int64) error
	// Seek finds data or holes with whence SeekData or SeekHole and
	// returns the offset found. SeekData past the last data returns io.EOF.
	Seek(off int64, whence int) (int64, error)
	// Close releases the handle; the file stays open in the cache. Close
	// is idempotent; other methods fail after it.
	Close() error
}

// Whence values for File.Seek.
const (
	SeekData = 3 // SEEK_DATA
	SeekHole = 4 // SEEK_HOLE
)

// ErrNotSupported is returned (wrapped) when the underlying file system
// cannot punch holes, preallocate or seek to data/holes.
var ErrNotSupported = errors.ErrUnsupported

// ErrClosed is returned when using a closed File or Backend.
var ErrClosed = errors.New("store: closed")

// ErrCorrupt is returned (wrapped, naming the inode, block and offset) when
// data on disk does not match its checksum. The bytes of such a block are
// never returned.
var ErrCorrupt = errors.New("checksum mismatch")
