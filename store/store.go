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
// as all zeros up to the size recorded in meta.
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
package store

import (
	"errors"
	"io"
)

// Backend stores the data of regular files by inode number.
type Backend interface {
	// Open returns a handle on the data of ino. Without create, a missing
	// file yields an error matching fs.ErrNotExist.
	Open(ino uint64, create bool) (File, error)
	// Remove deletes the data of ino; it is safe while handles are open. A
	// missing file is not an error.
	Remove(ino uint64) error
	// Truncate sets the data size of ino, creating the file if needed, and
	// makes the change durable.
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
