//go:build linux

package store

import (
	"container/list"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// LocalOptions tunes Local.
type LocalOptions struct {
	// MaxOpen bounds the number of idle cached descriptors (default 1024).
	MaxOpen int
	// Checksums keeps a CRC-32C per 64 KiB block of every object in a
	// sidecar file and verifies reads against it (see the package doc).
	Checksums bool
}

// Local is a Backend keeping each inode's data in a file on a local file
// system.
type Local struct {
	root    string // DIR/data
	maxOpen int

	mu      sync.Mutex
	open    map[uint64]*fdEntry
	idle    *list.List      // of *fdEntry with refs == 0, most recent at front
	created map[uint64]bool // data files whose directory entry is not yet synced
	closed  bool
	// removed counts, per folder (ino&0xff), the unlinks Remove made in
	// it; synced is the count the last fsync of the folder covered
	// (SyncRemoved), so that a folder with no unlink since needs none.
	removed, synced [256]uint64

	checksums bool
	stripes   []stripe // block locks, when checksums is set
	// prealloc: streaming writes allocate ahead (prealloc.go), on a file
	// system that has it; set once by NewLocal. noPrealloc: fallocate
	// turned out unsupported after all, so no more is asked for (the
	// locking prealloc needs stays).
	prealloc   bool
	noPrealloc atomic.Bool

	// fresh: the inode numbers known to have no data file but those
	// Local made (NoDataFrom; local_fresh.go).
	fresh freshBits
}

var (
	_ Backend = (*Local)(nil)
	_ File    = (*handle)(nil)
)

type fdEntry struct {
	ino      uint64
	f        *os.File
	fd       int
	refs     int
	elem     *list.Element // in idle list when refs == 0
	detached bool          // removed or evicted from the map; close at refs 0

	// With checksums: the sidecar, and the object lock. ReadAt, WriteAt
	// and Verify hold rw shared; Truncate and PunchHole hold it
	// exclusively, so they need no block locks. Without checksums,
	// WriteAt holds it shared when the store preallocates, for
	// trimPrealloc, which holds it exclusively.
	crc *os.File
	rw  sync.RWMutex

	// pend is where what preallocate allocated ahead ends (0: nothing
	// allocated ahead since the last trim); pmu serializes preallocate.
	pend atomic.Int64
	pmu  sync.Mutex
}

func (e *fdEntry) close() {
	e.f.Close()
	if e.crc != nil {
		e.crc.Close()
	}
}

// NewLocal opens (creating if needed) a local data store under dir.
func NewLocal(dir string, opts LocalOptions) (*Local, error) {
	root := filepath.Join(dir, "data")
	for i := range 256 {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("%02x", i)), 0o700); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
	}
	if err := setupChecksums(root, opts.Checksums); err != nil {
		return nil, fmt.Errorf("store: checksums: %w", err)
	}
	mo := opts.MaxOpen
	if mo <= 0 {
		mo = 1024
	}
	l := &Local{root: root, maxOpen: mo, open: map[uint64]*fdEntry{}, idle: list.New(), created: map[uint64]bool{}}
	if opts.Checksums {
		l.checksums = true
		l.stripes = make([]stripe, nStripes)
	}
	l.prealloc = preallocFS(root)
	return l, nil
}

func (l *Local) subdir(ino uint64) string {
	return filepath.Join(l.root, fmt.Sprintf("%02x", ino&0xff))
}

func (l *Local) path(ino uint64) string {
	return filepath.Join(l.subdir(ino), strconv.FormatUint(ino, 10))
}

// Open implements Backend.
func (l *Local) Open(ino uint64, create bool) (File, error) {
	e, err := l.acquire(ino, create)
	if err != nil {
		return nil, err
	}
	return &handle{l: l, e: e}, nil
}

func (l *Local) acquire(ino uint64, create bool) (*fdEntry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	if e, ok := l.open[ino]; ok {
		if e.refs == 0 {
			l.idle.Remove(e.elem)
			e.elem = nil
		}
		e.refs++
		return e, nil
	}
	// Opening under the lock keeps one descriptor per inode; an open(2)
	// of an existing file is cheap next to the I/O that follows it.
	p := l.path(ino)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	fresh := false
	if errors.Is(err, fs.ErrNotExist) && create {
		// Marked before the attempt: an error may still leave a file.
		l.fresh.mark(ino)
		f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			fresh = true
			l.created[ino] = true
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %d: %w", ino, err)
	}
	e := &fdEntry{ino: ino, f: f, fd: int(f.Fd()), refs: 1}
	if l.checksums {
		c, created, err := l.openSidecar(ino, f, fresh)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("store: open checksums of %d: %w", ino, err)
		}
		if created {
			l.created[ino] = true
		}
		e.crc = c
	}
	l.open[ino] = e
	l.evictLocked()
	return e, nil
}

// evictLocked closes least recently used idle descriptors beyond the bound.
func (l *Local) evictLocked() {
	for len(l.open) > l.maxOpen && l.idle.Len() > 0 {
		e := l.idle.Remove(l.idle.Back()).(*fdEntry)
		e.elem = nil
		delete(l.open, e.ino)
		e.close()
	}
}

func (l *Local) release(e *fdEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.refs--
	if e.refs > 0 {
		return
	}
	if e.detached || l.closed {
		e.close()
		return
	}
	e.elem = l.idle.PushFront(e)
	l.evictLocked()
}

// Remove implements Backend.
func (l *Local) Remove(ino uint64) error {
	l.mu.Lock()
	if e, ok := l.open[ino]; ok {
		delete(l.open, ino)
		if e.refs == 0 {
			l.idle.Remove(e.elem)
			e.elem = nil
			e.close()
		} else {
			e.detached = true
		}
	}
	delete(l.created, ino)
	if l.fresh.noData(ino) {
		// Never had a data file (local_fresh.go): nothing to unlink.
		l.mu.Unlock()
		return nil
	}
	// Unlink under the lock so a concurrent Open cannot pick up the file
	// being removed. The sidecar goes first: a crash in between leaves
	// data without checksums, never checksums without their data.
	var err error
	unlinked := false
	if l.checksums {
		err = removeFile(l.path(ino) + sidecarExt)
		unlinked = err == nil
		if errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	}
	if err == nil {
		err = removeFile(l.path(ino))
		unlinked = unlinked || err == nil
	}
	if unlinked {
		l.removed[ino&0xff]++
	}
	l.mu.Unlock()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: remove %d: %w", ino, err)
	}
	return nil
}

// removeFile removes the file at path as os.Remove does, but tries
// rmdir(2) only when unlink(2) says the path is a directory (EISDIR),
// not after every failure: the server's freer removes the data of every
// file whose last link goes, most often of one that never had any (an
// empty file, or one kept inline), and os.Remove then paid two failed
// path lookups instead of one (docs/benchmarks.md, "Removes, fourth
// pass"). A data file is never a directory; an empty one in its place
// (left by hand, or by a test that makes a removal fail) still goes.
func removeFile(path string) error {
	err := ignoringEINTR(func() error { return unix.Unlink(path) })
	if err == unix.EISDIR {
		err = ignoringEINTR(func() error { return unix.Rmdir(path) })
	}
	if err != nil {
		return &fs.PathError{Op: "remove", Path: path, Err: err}
	}
	return nil
}

func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// Truncate implements Backend.
func (l *Local) Truncate(ino uint64, size uint64) error {
	if size > 1<<63-1 {
		return fmt.Errorf("store: truncate %d to %d: %w", ino, size, unix.EFBIG)
	}
	e, err := l.acquire(ino, true)
	if err != nil {
		return err
	}
	defer l.release(e)
	if e.crc != nil {
		if err := l.truncateCRC(e, int64(size)); err != nil {
			return err
		}
	} else if err := e.f.Truncate(int64(size)); err != nil {
		return fmt.Errorf("store: truncate %d: %w", ino, err)
	}
	return l.sync(e)
}

// Sync implements Backend.
func (l *Local) Sync(ino uint64) error {
	e, err := l.acquire(ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer l.release(e)
	return l.sync(e)
}

func (l *Local) sync(e *fdEntry) error {
	if err := unix.Fdatasync(e.fd); err != nil {
		return fmt.Errorf("store: fdatasync %d: %w", e.ino, err)
	}
	if e.crc != nil {
		if err := unix.Fdatasync(int(e.crc.Fd())); err != nil {
			return fmt.Errorf("store: fdatasync checksums of %d: %w", e.ino, err)
		}
	}
	if err := l.trimPrealloc(e); err != nil {
		return err
	}
	l.mu.Lock()
	created := l.created[e.ino]
	l.mu.Unlock()
	if !created {
		return nil
	}
	d, err := os.Open(l.subdir(e.ino))
	if err != nil {
		return fmt.Errorf("store: sync dir of %d: %w", e.ino, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: sync dir of %d: %w", e.ino, err)
	}
	l.mu.Lock()
	delete(l.created, e.ino)
	l.mu.Unlock()
	return nil
}

// StatFS implements Backend.
func (l *Local) StatFS() (total, free, avail uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(l.root, &st); err != nil {
		return 0, 0, 0, fmt.Errorf("store: statfs: %w", err)
	}
	bs := uint64(st.Bsize)
	return st.Blocks * bs, st.Bfree * bs, st.Bavail * bs, nil
}

// Close closes idle descriptors; descriptors still referenced are closed
// when their handles are. Further Opens fail.
func (l *Local) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	for ino, e := range l.open {
		if e.refs == 0 {
			e.close()
		}
		delete(l.open, ino)
	}
	l.idle.Init()
	return nil
}

// handle is one reference to a cached descriptor.
type handle struct {
	l      *Local
	e      *fdEntry
	closed atomic.Bool
}

func (h *handle) check() error {
	if h.closed.Load() {
		return ErrClosed
	}
	return nil
}

func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	if err := h.check(); err != nil {
		return 0, err
	}
	if h.e.crc != nil && checkedRange(len(p), off) {
		return h.l.readCRC(h.e, p, off)
	}
	return h.e.f.ReadAt(p, off)
}

func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	if err := h.check(); err != nil {
		return 0, err
	}
	if h.e.crc != nil && checkedRange(len(p), off) {
		return h.l.writeCRC(h.e, p, off)
	}
	if h.l.prealloc && checkedRange(len(p), off) {
		h.e.rw.RLock()
		defer h.e.rw.RUnlock()
		h.l.preallocate(h.e, off, len(p))
	}
	return h.e.f.WriteAt(p, off)
}

func (h *handle) Sync() error {
	if err := h.check(); err != nil {
		return err
	}
	return h.l.sync(h.e)
}

func (h *handle) Size() (int64, error) {
	if err := h.check(); err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(h.e.fd, &st); err != nil {
		return 0, fmt.Errorf("store: fstat %d: %w", h.e.ino, err)
	}
	return st.Size, nil
}

func (h *handle) fallocate(mode uint32, off, length int64, what string) error {
	if err := h.check(); err != nil {
		return err
	}
	if off < 0 || length <= 0 {
		return fmt.Errorf("store: %s %d [%d,+%d): %w", what, h.e.ino, off, length, unix.EINVAL)
	}
	return fallocate(h.e, mode, off, length, what)
}

func fallocate(e *fdEntry, mode uint32, off, length int64, what string) error {
	for {
		err := unix.Fallocate(e.fd, mode, off, length)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
			return fmt.Errorf("store: %s %d: %w", what, e.ino, ErrNotSupported)
		}
		if err != nil {
			return fmt.Errorf("store: %s %d: %w", what, e.ino, err)
		}
		return nil
	}
}

// Allocate needs no checksum work: it changes no byte of the object, and
// the bytes it brings inside the size were zeros past the end before.
func (h *handle) Allocate(off, length int64) error {
	return h.fallocate(0, off, length, "allocate")
}

func (h *handle) PunchHole(off, length int64) error {
	if h.e.crc != nil {
		return h.punchCRC(off, length)
	}
	return h.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length, "punch hole")
}

func (h *handle) Seek(off int64, whence int) (int64, error) {
	if err := h.check(); err != nil {
		return 0, err
	}
	if off < 0 || whence != SeekData && whence != SeekHole {
		return 0, fmt.Errorf("store: seek whence %d: %w", whence, unix.EINVAL)
	}
	// The descriptor's file offset is shared, but nothing else uses it:
	// reads and writes are positional.
	n, err := unix.Seek(h.e.fd, off, whence)
	switch {
	case err == unix.ENXIO:
		return 0, io.EOF
	case err == unix.EINVAL || err == unix.EOPNOTSUPP:
		return 0, fmt.Errorf("store: seek %d: %w", h.e.ino, ErrNotSupported)
	case err != nil:
		return 0, fmt.Errorf("store: seek %d: %w", h.e.ino, err)
	}
	return n, nil
}

func (h *handle) Close() error {
	if h.closed.Swap(true) {
		return nil
	}
	h.l.release(h.e)
	return nil
}
