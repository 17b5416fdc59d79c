package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// Inline data: a pNFS metadata server keeps the data of small files in
// its metadata engine (meta.Engine.WriteInline) instead of in objects on
// the data servers. Writing a file of a few KiB through the MDS is then
// one engine transaction that carries the bytes, the size and the mtime,
// durable when it returns (so the WRITE answers FILE_SYNC4), where a
// data server would create an object and its checksum sidecar, write,
// sync them and their directory, and the MDS would commit a stripe map
// and the size separately; removing the file touches no data server.
//
// inlineStore is the server's store.Backend in front of the data
// servers' (cluster.Striped). It decides, per file:
//
//   - A write through the MDS that ends within the limit, to a file whose
//     data was never placed on data servers (no stripe map), is kept
//     inline.
//   - Anything else first moves the file's inline data, if it has any, to
//     the data servers (materialize): the bytes are written through the
//     data servers' store, which places the stripe map, cut to their
//     length (an earlier move the server did not finish may have left
//     more), synced, and only then is the inline record dropped. From the
//     moment the map exists the engine refuses inline writes, so the file
//     stays on the data servers for good.
//   - A layout names data servers, so LAYOUTGET moves the data out first
//     and hands out the layout under the same lock (striped): a client
//     never reads a data server for bytes that are inline.
//
// The record is the data whenever it exists (meta package doc, "Inline
// data"), so a move cut short by a crash is redone from the start.
//
// Locking: one of inlineLocks mutexes per file serializes inline writes,
// truncation, moves and layout grants of that file; writes to a file on
// the data servers take it shared, so they never overlap a move. Reads
// take nothing: a reader sees the record, or (once it is dropped) the
// data servers, which hold the same bytes by then.
//
// Inline data has the durability and the copies of the metadata: one
// copy in bbolt, or etcd's replicas. The file's stripe policy (mirrors)
// applies from the moment it leaves the engine.
type inlineStore struct {
	m     meta.Engine
	next  store.Backend
	limit int
	locks [inlineLocks]sync.RWMutex
}

// inlineLocks is the number of per-file locks, shared by hashing.
const inlineLocks = 256

// DefaultInlineMax is the largest file a metadata server keeps inline
// unless Config.InlineMax says otherwise: half the data servers' 64 KiB
// checksum block, small enough that records stay cheap to commit and to
// read whole, large enough for the small files of builds and mail.
const DefaultInlineMax = 32 << 10

var (
	_ store.Backend = (*inlineStore)(nil)
	_ store.Copier  = (*inlineStore)(nil)
	_ store.File    = (*inlineFile)(nil)
)

func newInlineStore(m meta.Engine, next store.Backend, limit int) *inlineStore {
	return &inlineStore{m: m, next: next, limit: limit}
}

func (s *inlineStore) lock(ino uint64) *sync.RWMutex { return &s.locks[ino%inlineLocks] }

// engineTimeout bounds the engine calls of store methods, which have no
// context of their own.
const engineTimeout = time.Minute

func bg() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), engineTimeout)
}

// data returns ino's inline data, ok false if it has none.
func (s *inlineStore) data(ino uint64) ([]byte, bool, error) {
	ctx, cancel := bg()
	defer cancel()
	d, ok, err := s.m.InlineData(ctx, meta.Ino(ino))
	if errors.Is(err, meta.ErrStale) {
		return nil, false, nil
	}
	return d, ok, err
}

// placed reports whether ino's data was ever placed on data servers.
func (s *inlineStore) placed(ino uint64) (bool, error) {
	ctx, cancel := bg()
	defer cancel()
	_, err := s.m.StripeMap(ctx, meta.Ino(ino))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, meta.ErrNotFound), errors.Is(err, meta.ErrStale):
		return false, nil
	}
	return false, err
}

// materializeLocked moves ino's inline data, if any, to the data servers
// and drops the record. The caller holds ino's lock exclusively.
func (s *inlineStore) materializeLocked(ino uint64) error {
	d, ok, err := s.data(ino)
	if err != nil || !ok {
		return err
	}
	if len(d) > 0 {
		f, err := s.next.Open(ino, true)
		if err != nil {
			return fmt.Errorf("server: move inline data of %d: %w", ino, err)
		}
		_, err = f.WriteAt(d, 0)
		f.Close()
		if err != nil {
			return fmt.Errorf("server: move inline data of %d: %w", ino, err)
		}
	}
	if err := s.next.Truncate(ino, uint64(len(d))); err != nil {
		return fmt.Errorf("server: move inline data of %d: %w", ino, err)
	}
	if err := s.next.Sync(ino); err != nil {
		return fmt.Errorf("server: move inline data of %d: %w", ino, err)
	}
	ctx, cancel := bg()
	defer cancel()
	return s.m.DropInline(ctx, meta.Ino(ino))
}

// Hints of threshold_item4 (RFC 8881 §5.12.4): the file sizes, and the
// amounts of I/O, below which a client should go through the MDS.
const (
	threshold4ReadSize    = 0
	threshold4WriteSize   = 1
	threshold4WriteIOSize = 3
)

// mdsThreshold encodes the mdsthreshold attribute, the same for every
// file of the server: with inline data on (s not nil), files up to the
// inline limit do their reads and writes through the MDS, where their
// bytes live, instead of asking for a layout that would first move them to
// the data servers. Without inline data there are no hints.
//
// Linux honours it (pnfs_within_mdsthreshold): below the thresholds it
// sends no LAYOUTGET and does the I/O through the MDS. A write goes there
// only if both the file and the data written to it so far (the inode's
// write_io, which counts the request about to be sent for O_DIRECT) are
// below the hints: with the size alone, the first O_DIRECT write of a new
// file, however large, would go through the MDS because the file is still
// empty. There is no read I/O hint: Linux counts every read of the inode
// in it, so a small file read a few times would be moved out.
func mdsThreshold(s *inlineStore) []byte {
	return mdsThresholdOf(s, nfs4.LAYOUT4_NFSV4_1_FILES)
}

// mdsThresholdOf is mdsThreshold for the layout type t an export hands
// out (thi_layout_type names it).
func mdsThresholdOf(s *inlineStore, t nfs4.Layouttype4) []byte {
	if s == nil {
		return xdr.Marshal(&nfs4.Mdsthreshold4{})
	}
	// The client goes through the MDS below the hint, so limit+1 keeps
	// a file of exactly the limit there too. The values are in the order
	// of their bits.
	limit := uint64(s.limit) + 1
	hint := xdr.Marshal(marshalFunc(func(e *xdr.Encoder) {
		e.Uint64(limit) // threshold4_read_size
		e.Uint64(limit) // threshold4_write_size
		e.Uint64(limit) // threshold4_write_iosize
	}))
	return xdr.Marshal(&nfs4.Mdsthreshold4{MthHints: []nfs4.ThresholdItem4{{
		ThiLayoutType: t,
		ThiHintset:    makeBitmap([]uint32{threshold4ReadSize, threshold4WriteSize, threshold4WriteIOSize}),
		ThiHintlist:   hint,
	}}})
}

// striped runs fn, which uses ino's data on the data servers directly
// (LAYOUTGET), after moving any inline data there, under ino's lock: no
// inline write can come between the move and fn.
func (s *inlineStore) striped(ino uint64, fn func() error) error {
	if s == nil {
		return fn()
	}
	l := s.lock(ino)
	l.Lock()
	defer l.Unlock()
	if err := s.materializeLocked(ino); err != nil {
		return err
	}
	return fn()
}

func (s *inlineStore) Open(ino uint64, create bool) (store.File, error) {
	f, err := s.next.Open(ino, create)
	if err != nil {
		return nil, err
	}
	return &inlineFile{s: s, ino: ino, next: f}, nil
}

// Remove drops ino's inline data, if it has any, and its data on the data
// servers. The record would go with the inode anyway (FreeOrphan), but
// until then a later Open of ino must not find the old bytes.
func (s *inlineStore) Remove(ino uint64) error {
	l := s.lock(ino)
	l.Lock()
	defer l.Unlock()
	_, ok, err := s.data(ino)
	if err != nil {
		return err
	}
	if ok {
		ctx, cancel := bg()
		defer cancel()
		// Only the orphan freer removes a file's data, and only once the
		// change that unlinked it is durable (orphans.go); the inode's
		// free follows in the same log. So these changes need no
		// fdatasync of their own (they cost one or two per removed
		// small file, the freer running beside the next REMOVEs): a
		// crash that loses them leaves the orphan with its inline data,
		// and the freer removes both again.
		ctx = meta.Deferred(ctx)
		// DropInline refuses to drop bytes that have nowhere else to
		// be: cut them first.
		err := s.m.TruncateInline(ctx, meta.Ino(ino), 0)
		if err == nil {
			err = s.m.DropInline(ctx, meta.Ino(ino))
		}
		if err != nil && !errors.Is(err, meta.ErrStale) {
			return fmt.Errorf("server: remove inline data of %d: %w", ino, err)
		}
	}
	return s.next.Remove(ino)
}

// RemoveOrphanData removes the data of the doomed orphan ino from the
// data servers and leaves its inline record, which goes with the inode
// in the freer's FreeOrphans, in the same log: nobody can open a doomed
// orphan (orphans.go), so no Open finds the old bytes meanwhile, and a
// crash that loses the free leaves the orphan recorded with its bytes,
// freed again after the restart. It spares the freer two engine commits
// (and two reads) per removed small file.
func (s *inlineStore) RemoveOrphanData(ino uint64) error {
	l := s.lock(ino)
	l.Lock()
	defer l.Unlock()
	return s.next.Remove(ino)
}

var (
	_ orphanDataRemover = (*inlineStore)(nil)
	_ store.MapPlaced   = (*inlineStore)(nil)
)

// PlacedByMap forwards the next backend's answer (store.MapPlaced): a
// file kept inline has no stripe map, and its bytes go with its inode.
func (s *inlineStore) PlacedByMap() bool {
	mp, ok := s.next.(store.MapPlaced)
	return ok && mp.PlacedByMap()
}

func (s *inlineStore) Truncate(ino uint64, size uint64) error {
	l := s.lock(ino)
	l.Lock()
	defer l.Unlock()
	_, ok, err := s.data(ino)
	if err != nil {
		return err
	}
	if ok {
		if size <= uint64(s.limit) {
			ctx, cancel := bg()
			defer cancel()
			return s.m.TruncateInline(ctx, meta.Ino(ino), size)
		}
		if err := s.materializeLocked(ino); err != nil {
			return err
		}
	}
	return s.next.Truncate(ino, size)
}

// Sync: inline data is durable when written, and a file without a stripe
// map has nothing to sync on the data servers.
func (s *inlineStore) Sync(ino uint64) error { return s.next.Sync(ino) }

func (s *inlineStore) StatFS() (total, free, avail uint64, err error) { return s.next.StatFS() }

func (s *inlineStore) Close() error { return s.next.Close() }

// CopyRange lets the data servers copy between files that are both on
// them; a copy from or to inline data goes through the server's buffer
// (ErrNotSupported), and so through inlineFile.
func (s *inlineStore) CopyRange(src, dst uint64, srcOff, dstOff, n int64) error {
	cp, ok := s.next.(store.Copier)
	if !ok {
		return fmt.Errorf("server: copy: %w", store.ErrNotSupported)
	}
	a, b := s.lock(src), s.lock(dst)
	if src%inlineLocks > dst%inlineLocks {
		a, b = b, a
	}
	a.Lock()
	defer a.Unlock()
	if a != b {
		b.Lock()
		defer b.Unlock()
	}
	for _, ino := range []uint64{src, dst} {
		_, inline, err := s.data(ino)
		if err != nil {
			return err
		}
		if inline {
			return fmt.Errorf("server: copy of inline data: %w", store.ErrNotSupported)
		}
	}
	return cp.CopyRange(src, dst, srcOff, dstOff, n)
}

// inlineFile is an open file of an inlineStore. Like every store.File it
// fails once closed, also for data that is inline and never reaches next.
type inlineFile struct {
	s      *inlineStore
	ino    uint64
	next   store.File
	closed atomic.Bool
}

func (f *inlineFile) check() error {
	if f.closed.Load() {
		return fmt.Errorf("server: inline data of %d: %w", f.ino, store.ErrClosed)
	}
	return nil
}

func (f *inlineFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	d, ok, err := f.s.data(f.ino)
	if err != nil {
		return 0, err
	}
	if !ok {
		return f.next.ReadAt(p, off)
	}
	if off < 0 {
		return 0, fmt.Errorf("server: read at %d: %w", off, store.ErrNotSupported)
	}
	if off >= int64(len(d)) {
		return 0, io.EOF
	}
	n := copy(p, d[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// writeAt writes p at off, inline if it can; inline reports which. The
// inline write is made under ctx, so a COMPOUND's WRITE is deferred with
// the rest of its changes (durability.go); writes through WriteAt (COPY,
// no COMPOUND context) are durable when they return.
func (f *inlineFile) writeAt(ctx context.Context, p []byte, off int64) (inline bool, err error) {
	s := f.s
	l := s.lock(f.ino)
	l.Lock()
	placed, err := s.placed(f.ino)
	if err != nil {
		l.Unlock()
		return false, err
	}
	if !placed && off >= 0 && uint64(off)+uint64(len(p)) <= uint64(s.limit) {
		defer l.Unlock()
		ctx, cancel := context.WithTimeout(ctx, engineTimeout)
		defer cancel()
		// No map can appear meanwhile: every path that places one holds
		// this lock.
		_, err := s.m.WriteInline(ctx, meta.Ino(f.ino), uint64(off), p, s.limit, time.Time{})
		return err == nil, err
	}
	if err := s.materializeLocked(f.ino); err != nil {
		l.Unlock()
		return false, err
	}
	if !placed {
		// This write places the map: nothing inline may come between.
		defer l.Unlock()
		_, err = f.next.WriteAt(p, off)
		return false, err
	}
	// The file is on the data servers for good; other writes may go on
	// beside this one, but no move of data can.
	l.Unlock()
	l.RLock()
	defer l.RUnlock()
	_, err = f.next.WriteAt(p, off)
	return false, err
}

func (f *inlineFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if _, err := f.writeAt(context.Background(), p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (f *inlineFile) Sync() error {
	if err := f.check(); err != nil {
		return err
	}
	return f.next.Sync()
}

func (f *inlineFile) Size() (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	d, ok, err := f.s.data(f.ino)
	if err != nil {
		return 0, err
	}
	if ok {
		return int64(len(d)), nil
	}
	return f.next.Size()
}

func (f *inlineFile) Allocate(off, length int64) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.s.striped(f.ino, func() error { return f.next.Allocate(off, length) })
}

func (f *inlineFile) PunchHole(off, length int64) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.s.striped(f.ino, func() error { return f.next.PunchHole(off, length) })
}

func (f *inlineFile) Seek(off int64, whence int) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	d, ok, err := f.s.data(f.ino)
	if err != nil {
		return 0, err
	}
	if !ok {
		return f.next.Seek(off, whence)
	}
	if off < 0 || whence != store.SeekData && whence != store.SeekHole {
		return 0, fmt.Errorf("server: seek whence %d at %d: %w", whence, off, store.ErrNotSupported)
	}
	if off >= int64(len(d)) {
		return 0, io.EOF // as lseek's ENXIO: nothing but the hole up to the size
	}
	if whence == store.SeekData {
		return off, nil
	}
	return int64(len(d)), nil
}

func (f *inlineFile) Close() error {
	f.closed.Store(true)
	return f.next.Close()
}
