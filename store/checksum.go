//go:build linux

package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ChecksumBlockSize is the size of the blocks Local checksums when
// LocalOptions.Checksums is set. Writes aligned to it need no
// read-modify-write.
const ChecksumBlockSize = 1 << blockShift

const (
	blockShift  = 16
	blockMask   = ChecksumBlockSize - 1
	entrySize   = 8  // bytes per sidecar entry
	chunkBlocks = 16 // blocks locked and processed together (1 MiB)
	nStripes    = 1024

	sidecarExt = ".crc"
	markerName = "checksums"
	markerText = "shoal store checksums v1: crc32c of 65536-byte blocks, 8-byte entries\n"
)

// entryMagic opens every entry that holds a checksum; an all-zero entry
// holds none.
var entryMagic = [4]byte{'C', '3', '2', 'C'}

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	zeroBlock  [ChecksumBlockSize]byte // read-only
	zeroCRC    = crc32.Checksum(zeroBlock[:], castagnoli)
	blockPool  = sync.Pool{New: func() any { return new([ChecksumBlockSize]byte) }}
)

// Entry states.
const (
	entNone = iota // no checksum recorded: the block is not verified
	entCRC         // a checksum
	entBad         // neither: the sidecar itself is damaged
)

func getEntry(b []byte) (crc uint32, state int) {
	b = b[:entrySize]
	if [4]byte(b[:4]) == entryMagic {
		return binary.LittleEndian.Uint32(b[4:]), entCRC
	}
	if binary.LittleEndian.Uint64(b) == 0 {
		return 0, entNone
	}
	return 0, entBad
}

func putEntry(b []byte, crc uint32) {
	copy(b[:4], entryMagic[:])
	binary.LittleEndian.PutUint32(b[4:entrySize], crc)
}

// matches reports whether data, the bytes of a block up to the end of the
// object (at most ChecksumBlockSize), agrees with entry b. Bytes past data
// count as zeros.
func matches(b, data []byte) bool {
	want, st := getEntry(b)
	switch st {
	case entNone:
		return true
	case entBad:
		return false
	}
	c := crc32.Update(0, castagnoli, data)
	if len(data) < ChecksumBlockSize {
		c = crc32.Update(c, castagnoli, zeroBlock[:ChecksumBlockSize-len(data)])
	}
	return c == want
}

// zeroEntries holds entries for all-zero blocks, written by PunchHole.
var zeroEntries = func() []byte {
	b := make([]byte, 512*entrySize)
	for i := 0; i < len(b); i += entrySize {
		putEntry(b[i:], zeroCRC)
	}
	return b
}()

// stripe is one block lock, padded to a cache line.
type stripe struct {
	sync.RWMutex
	_ [40]byte
}

// lockSet is the stripes held for a run of at most chunkBlocks blocks,
// sorted and without duplicates.
type lockSet struct {
	idx [chunkBlocks]uint16
	n   int
}

// lockBlocks locks the stripes of blocks b0..b1 (at most chunkBlocks) of
// ino in ascending stripe order, so two lockers never deadlock. Blocks of
// one object map to consecutive stripes, so a chunk never collides with
// itself and neighbouring chunks use different stripes.
func (l *Local) lockBlocks(ino uint64, b0, b1 int64, write bool) lockSet {
	var s lockSet
	for b := b0; b <= b1; b++ {
		x := stripeOf(ino, b)
		i := s.n
		for i > 0 && s.idx[i-1] > x {
			i--
		}
		if i > 0 && s.idx[i-1] == x {
			continue
		}
		copy(s.idx[i+1:s.n+1], s.idx[i:s.n])
		s.idx[i] = x
		s.n++
	}
	for _, x := range s.idx[:s.n] {
		if write {
			l.stripes[x].Lock()
		} else {
			l.stripes[x].RLock()
		}
	}
	return s
}

// stripeOf returns the block lock of block b of ino.
func stripeOf(ino uint64, b int64) uint16 {
	return uint16(((ino*0x9e3779b97f4a7c15)>>40 + uint64(b)) & (nStripes - 1))
}

func (l *Local) unlockBlocks(s *lockSet, write bool) {
	for _, x := range s.idx[:s.n] {
		if write {
			l.stripes[x].Unlock()
		} else {
			l.stripes[x].RUnlock()
		}
	}
}

func corrupt(op string, ino uint64, blk int64) error {
	return fmt.Errorf("store: %s %d: block %d at offset %d: %w", op, ino, blk, blk<<blockShift, ErrCorrupt)
}

// readEntries fills dst with the entries from block b0 on; entries past the
// end of the sidecar read as none.
func readEntries(e *fdEntry, dst []byte, b0 int64) error {
	n, err := e.crc.ReadAt(dst, b0*entrySize)
	clear(dst[n:])
	if err != nil && err != io.EOF {
		return fmt.Errorf("store: read checksums of %d: %w", e.ino, err)
	}
	return nil
}

// readBlock reads block b into buf and zeroes buf past the end of the
// object; it returns how many bytes the object holds in the block.
func readBlock(e *fdEntry, buf *[ChecksumBlockSize]byte, b int64) (int, error) {
	m, err := e.f.ReadAt(buf[:], b<<blockShift)
	clear(buf[m:])
	if err != nil && err != io.EOF {
		return 0, fmt.Errorf("store: read %d: %w", e.ino, err)
	}
	return m, nil
}

// checkedRange reports whether a request on [off, off+n) takes the
// checksummed path; others (invalid or overflowing) go straight to the
// file, which fails them without touching data.
func checkedRange(n int, off int64) bool {
	return n > 0 && off >= 0 && off <= math.MaxInt64-int64(n)
}

func (l *Local) readCRC(e *fdEntry, p []byte, off int64) (int, error) {
	e.rw.RLock()
	defer e.rw.RUnlock()
	done := 0
	for done < len(p) {
		cur := off + int64(done)
		end := min(off+int64(len(p)), (cur>>blockShift+chunkBlocks)<<blockShift)
		n, err := l.readChunk(e, p[done:done+int(end-cur)], cur)
		done += n
		if err != nil {
			if err != io.EOF {
				clear(p[done:]) // never leave bytes that failed or went unchecked
			}
			return done, err
		}
	}
	return done, nil
}

// readChunk reads q at cur, spanning at most chunkBlocks blocks, and
// verifies every block it returns bytes of. Whole blocks and blocks
// without an entry are read straight into q; a partly requested block with
// an entry is read whole into a pooled buffer.
func (l *Local) readChunk(e *fdEntry, q []byte, cur int64) (int, error) {
	end := cur + int64(len(q))
	b0, b1 := cur>>blockShift, (end-1)>>blockShift
	ls := l.lockBlocks(e.ino, b0, b1, false)
	defer l.unlockBlocks(&ls, false)
	var ents [chunkBlocks * entrySize]byte
	if err := readEntries(e, ents[:(b1-b0+1)*entrySize], b0); err != nil {
		return 0, err
	}
	ent := func(b int64) []byte { return ents[(b-b0)*entrySize:] }
	partial := func(b int64) bool { return cur > b<<blockShift || end < (b+1)<<blockShift }
	pos := cur
	for pos < end {
		b := pos >> blockShift
		bs := b << blockShift
		segEnd := min(end, bs+ChecksumBlockSize)
		if _, st := getEntry(ent(b)); st != entNone && partial(b) {
			buf := blockPool.Get().(*[ChecksumBlockSize]byte)
			m, err := readBlock(e, buf, b)
			if err != nil {
				blockPool.Put(buf)
				return int(pos - cur), err
			}
			if m > 0 && !matches(ent(b), buf[:m]) {
				blockPool.Put(buf)
				return int(pos - cur), corrupt("read", e.ino, b)
			}
			avail := max(0, min(segEnd, bs+int64(m))-pos)
			copy(q[pos-cur:], buf[pos-bs:pos-bs+avail])
			blockPool.Put(buf)
			if pos+avail < segEnd {
				return int(pos - cur + avail), io.EOF
			}
			pos = segEnd
			continue
		}
		// A run of blocks that are wholly requested or unchecked.
		runEnd := segEnd
		for runEnd < end {
			nb := runEnd >> blockShift
			if _, st := getEntry(ent(nb)); st != entNone && partial(nb) {
				break
			}
			runEnd = min(end, (nb+1)<<blockShift)
		}
		m, err := e.f.ReadAt(q[pos-cur:runEnd-cur], pos)
		if err != nil && err != io.EOF {
			return int(pos - cur), err
		}
		got := pos + int64(m)
		for bb := b; bb<<blockShift < got; bb++ {
			bbs := bb << blockShift
			if _, st := getEntry(ent(bb)); st == entNone || bbs < pos {
				continue // bbs < pos only for an unchecked first block
			}
			if !matches(ent(bb), q[bbs-cur:min(bbs+ChecksumBlockSize, got)-cur]) {
				return int(bbs - cur), corrupt("read", e.ino, bb)
			}
		}
		if got < runEnd {
			return int(got - cur), io.EOF
		}
		pos = runEnd
	}
	return len(q), nil
}

func (l *Local) writeCRC(e *fdEntry, p []byte, off int64) (int, error) {
	e.rw.RLock()
	defer e.rw.RUnlock()
	if l.prealloc {
		l.preallocate(e, off, len(p))
	}
	done := 0
	for done < len(p) {
		cur := off + int64(done)
		end := min(off+int64(len(p)), (cur>>blockShift+chunkBlocks)<<blockShift)
		n, err := l.writeChunk(e, p[done:done+int(end-cur)], cur)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// writeChunk writes q at cur, spanning at most chunkBlocks blocks, and
// records the checksums of the blocks it touches. A partly written block is
// read first (and verified, so a bad block is never vouched for again); a
// wholly written block is not read.
func (l *Local) writeChunk(e *fdEntry, q []byte, cur int64) (int, error) {
	end := cur + int64(len(q))
	b0, b1 := cur>>blockShift, (end-1)>>blockShift
	nb := b1 - b0 + 1
	ls := l.lockBlocks(e.ino, b0, b1, true)
	defer l.unlockBlocks(&ls, true)
	var old, ents [chunkBlocks * entrySize]byte
	if cur&blockMask != 0 || end&blockMask != 0 {
		if err := readEntries(e, old[:nb*entrySize], b0); err != nil {
			return 0, err
		}
	}
	for b := b0; b <= b1; b++ {
		bs := b << blockShift
		lo, hi := max(cur, bs), min(end, bs+ChecksumBlockSize)
		var crc uint32
		if lo == bs && hi == bs+ChecksumBlockSize {
			crc = crc32.Checksum(q[lo-cur:hi-cur], castagnoli)
		} else {
			buf := blockPool.Get().(*[ChecksumBlockSize]byte)
			m, err := readBlock(e, buf, b)
			if err != nil {
				blockPool.Put(buf)
				return 0, err
			}
			if m > 0 && !matches(old[(b-b0)*entrySize:], buf[:m]) {
				blockPool.Put(buf)
				return 0, corrupt("write", e.ino, b)
			}
			copy(buf[lo-bs:hi-bs], q[lo-cur:hi-cur])
			crc = crc32.Checksum(buf[:], castagnoli)
			blockPool.Put(buf)
		}
		putEntry(ents[(b-b0)*entrySize:], crc)
	}
	n, err := e.f.WriteAt(q, cur)
	if err != nil {
		if n > 0 {
			// The blocks the short write reached hold neither their old
			// nor their new bytes: stop vouching for them.
			k := (cur+int64(n)-1)>>blockShift - b0 + 1
			clear(ents[:k*entrySize])
			e.crc.WriteAt(ents[:k*entrySize], b0*entrySize)
		}
		return n, err
	}
	if _, err := e.crc.WriteAt(ents[:nb*entrySize], b0*entrySize); err != nil {
		return 0, fmt.Errorf("store: write checksums of %d: %w", e.ino, err)
	}
	return len(q), nil
}

func fsize(e *fdEntry, fd int) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("store: fstat %d: %w", e.ino, err)
	}
	return st.Size, nil
}

func blocksOf(size int64) int64 { return (size + blockMask) >> blockShift }

// dropEntries removes the entries of blocks from b on, syncing the sidecar
// if it changed, so no entry outlives the data it describes.
func dropEntries(e *fdEntry, b int64) error {
	sz, err := fsize(e, int(e.crc.Fd()))
	if err != nil || sz <= b*entrySize {
		return err
	}
	if err := e.crc.Truncate(b * entrySize); err != nil {
		return fmt.Errorf("store: truncate checksums of %d: %w", e.ino, err)
	}
	if err := unix.Fdatasync(int(e.crc.Fd())); err != nil {
		return fmt.Errorf("store: fdatasync checksums of %d: %w", e.ino, err)
	}
	return nil
}

// truncateCRC sets the size of a checksummed object. Each step leaves the
// sidecar durable before the data changes, so a crash in between never
// leaves an entry that disagrees with its block.
func (l *Local) truncateCRC(e *fdEntry, size int64) error {
	e.rw.Lock()
	defer e.rw.Unlock()
	old, err := fsize(e, e.fd)
	if err != nil {
		return err
	}
	if size >= old {
		if err := dropEntries(e, blocksOf(old)); err != nil {
			return err
		}
		if err := e.f.Truncate(size); err != nil {
			return fmt.Errorf("store: truncate %d: %w", e.ino, err)
		}
		return nil
	}
	// The new last block, if partial, keeps an entry only if it had one:
	// a truncate does not vouch for bytes it did not verify.
	k := size >> blockShift
	var ent [entrySize]byte
	keep := false
	if size&blockMask != 0 {
		if err := readEntries(e, ent[:], k); err != nil {
			return err
		}
		if _, st := getEntry(ent[:]); st != entNone {
			buf := blockPool.Get().(*[ChecksumBlockSize]byte)
			defer blockPool.Put(buf)
			m, err := readBlock(e, buf, k)
			if err != nil {
				return err
			}
			if !matches(ent[:], buf[:m]) {
				return corrupt("truncate", e.ino, k)
			}
			clear(buf[size&blockMask:])
			putEntry(ent[:], crc32.Checksum(buf[:], castagnoli))
			keep = true
		}
	}
	if err := dropEntries(e, k); err != nil {
		return err
	}
	if err := e.f.Truncate(size); err != nil {
		return fmt.Errorf("store: truncate %d: %w", e.ino, err)
	}
	if keep {
		// Written after the data shrank; the caller's sync makes it
		// durable.
		if _, err := e.crc.WriteAt(ent[:], k*entrySize); err != nil {
			return fmt.Errorf("store: write checksums of %d: %w", e.ino, err)
		}
	}
	return nil
}

// punchCRC punches a hole in a checksummed object: blocks it zeroes
// entirely get the zero-block checksum, a partly punched block with an entry
// is verified and recomputed.
func (h *handle) punchCRC(off, length int64) error {
	const what = "punch hole"
	const mode = unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE
	if err := h.check(); err != nil {
		return err
	}
	e := h.e
	if off < 0 || length <= 0 {
		return fmt.Errorf("store: %s %d [%d,+%d): %w", what, e.ino, off, length, unix.EINVAL)
	}
	e.rw.Lock()
	defer e.rw.Unlock()
	size, err := fsize(e, e.fd)
	if err != nil {
		return err
	}
	end := off + length
	if end < off {
		end = math.MaxInt64
	}
	nblocks := blocksOf(size)
	type edge struct {
		b   int64
		ent [entrySize]byte
	}
	var edges [2]edge
	ne := 0
	for _, b := range [2]int64{off >> blockShift, (end - 1) >> blockShift} {
		bs := b << blockShift
		if b >= nblocks || off <= bs && end >= bs+ChecksumBlockSize || ne == 1 && edges[0].b == b {
			continue // past the data, wholly punched, or seen
		}
		ed := &edges[ne]
		ed.b = b
		if err := readEntries(e, ed.ent[:], b); err != nil {
			return err
		}
		if _, st := getEntry(ed.ent[:]); st == entNone {
			continue
		}
		buf := blockPool.Get().(*[ChecksumBlockSize]byte)
		m, err := readBlock(e, buf, b)
		if err == nil && !matches(ed.ent[:], buf[:m]) {
			err = corrupt(what, e.ino, b)
		}
		if err != nil {
			blockPool.Put(buf)
			return err
		}
		clear(buf[max(off, bs)-bs : min(end, bs+ChecksumBlockSize)-bs])
		putEntry(ed.ent[:], crc32.Checksum(buf[:], castagnoli))
		blockPool.Put(buf)
		ne++
	}
	if err := fallocate(e, mode, off, length, what); err != nil {
		return err
	}
	for _, ed := range edges[:ne] {
		if _, err := e.crc.WriteAt(ed.ent[:], ed.b*entrySize); err != nil {
			return fmt.Errorf("store: write checksums of %d: %w", e.ino, err)
		}
	}
	// Wholly punched blocks holding data read as zeros from now on.
	w0, w1 := (off+blockMask)>>blockShift, min(end>>blockShift, nblocks)
	for b := w0; b < w1; {
		n := min(w1-b, int64(len(zeroEntries)/entrySize))
		if _, err := e.crc.WriteAt(zeroEntries[:n*entrySize], b*entrySize); err != nil {
			return fmt.Errorf("store: write checksums of %d: %w", e.ino, err)
		}
		b += n
	}
	return nil
}

// Verify checks every block of ino that has a checksum and returns the
// offsets of the blocks whose data does not match, in ascending order. It
// reads the object in 1 MiB chunks, each under the same block locks as
// ReadAt, so it runs alongside reads and writes. A missing object has no
// bad blocks. Verify fails with ErrNotSupported when checksums are off.
func (l *Local) Verify(ino uint64) (bad []int64, err error) {
	if !l.checksums {
		return nil, fmt.Errorf("store: verify %d: checksums are off: %w", ino, ErrNotSupported)
	}
	e, err := l.acquire(ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer l.release(e)
	var buf []byte
	for b0 := int64(0); ; b0 += chunkBlocks {
		last, err := l.verifyChunk(e, &buf, b0, &bad)
		if err != nil || last {
			return bad, err
		}
	}
}

func (l *Local) verifyChunk(e *fdEntry, buf *[]byte, b0 int64, bad *[]int64) (last bool, err error) {
	e.rw.RLock()
	defer e.rw.RUnlock()
	ls := l.lockBlocks(e.ino, b0, b0+chunkBlocks-1, false)
	defer l.unlockBlocks(&ls, false)
	var ents [chunkBlocks * entrySize]byte
	n, err := e.crc.ReadAt(ents[:], b0*entrySize)
	if err != nil && err != io.EOF {
		return false, fmt.Errorf("store: read checksums of %d: %w", e.ino, err)
	}
	// No entry outlives the data, so the end of the sidecar ends the scan.
	last = n < len(ents)
	clear(ents[n:])
	if bytes.Equal(ents[:], zeroBlock[:len(ents)]) {
		return last, nil
	}
	if *buf == nil {
		*buf = make([]byte, chunkBlocks*ChecksumBlockSize)
	}
	m, err := e.f.ReadAt(*buf, b0<<blockShift)
	if err != nil && err != io.EOF {
		return false, fmt.Errorf("store: verify %d: %w", e.ino, err)
	}
	for i := range int64(chunkBlocks) {
		bs := i << blockShift
		if bs >= int64(m) {
			return true, nil
		}
		if !matches(ents[i*entrySize:], (*buf)[bs:min(bs+ChecksumBlockSize, int64(m))]) {
			*bad = append(*bad, (b0+i)<<blockShift)
		}
	}
	return last, nil
}

// openSidecar opens the sidecar of a data file just opened; fresh is true
// when the data file was just created, so any sidecar left over from a
// crashed Remove is stale. It reports whether it created the sidecar.
func (l *Local) openSidecar(ino uint64, f *os.File, fresh bool) (c *os.File, created bool, err error) {
	p := l.path(ino) + sidecarExt
	if fresh {
		c, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		return c, true, err
	}
	c, err = os.OpenFile(p, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		// Data from before checksums: no entries.
		c, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		return c, true, err
	}
	if err != nil {
		return nil, false, err
	}
	// A crash can leave entries past the end of the data (the sidecar
	// reached the disk, the data did not). Drop them before anything can
	// write there and make them look current.
	var ds, cs unix.Stat_t
	if err = unix.Fstat(int(f.Fd()), &ds); err == nil {
		err = unix.Fstat(int(c.Fd()), &cs)
	}
	if err == nil && cs.Size > blocksOf(ds.Size)*entrySize {
		err = c.Truncate(blocksOf(ds.Size) * entrySize)
	}
	if err != nil {
		c.Close()
		return nil, false, err
	}
	return c, false, nil
}

// setupChecksums records in DIR/data/checksums whether sidecars are kept.
// Turning checksums on in a store that did not keep them (new, older, or
// run with them off for a while) deletes every sidecar first, since writes
// made meanwhile did not update them. Turning them off removes the marker.
func setupChecksums(root string, on bool) error {
	marker := filepath.Join(root, markerName)
	if !on {
		err := os.Remove(marker)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return syncDir(root)
	}
	b, err := os.ReadFile(marker)
	if err == nil && string(b) == markerText {
		return nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for i := range 256 {
		dir := filepath.Join(root, fmt.Sprintf("%02x", i))
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		removed := false
		for _, de := range ents {
			if name, ok := strings.CutSuffix(de.Name(), sidecarExt); ok && isObjectName(name, i) {
				if err := os.Remove(filepath.Join(dir, de.Name())); err != nil {
					return err
				}
				removed = true
			}
		}
		if removed {
			if err := syncDir(dir); err != nil {
				return err
			}
		}
	}
	tmp := marker + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(markerText)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, marker)
	}
	if err != nil {
		return err
	}
	return syncDir(root)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// isObjectName reports whether name is the canonical name of an object in
// subdirectory sub.
func isObjectName(name string, sub int) bool {
	ino, err := strconv.ParseUint(name, 10, 64)
	return err == nil && int(ino&0xff) == sub && strconv.FormatUint(ino, 10) == name
}

// Walk calls fn with the inode number of every object in the store, one
// subdirectory at a time, in no particular order. It skips sidecars and
// any other file that is not an object, and stops at fn's first error.
// Objects created or removed during the walk may or may not be seen.
func (l *Local) Walk(fn func(ino uint64) error) error { return walkObjects(l.root, fn) }

// WalkLocal is Walk on the store NewLocal(dir) would open, without
// opening it (which creates its folders and sets up or drops checksums):
// for offline checks of a stopped server's directory.
func WalkLocal(dir string, fn func(ino uint64) error) error {
	return walkObjects(filepath.Join(dir, "data"), fn)
}

func walkObjects(root string, fn func(ino uint64) error) error {
	for i := range 256 {
		ents, err := os.ReadDir(filepath.Join(root, fmt.Sprintf("%02x", i)))
		if err != nil {
			return fmt.Errorf("store: walk: %w", err)
		}
		for _, de := range ents {
			if !de.Type().IsRegular() || !isObjectName(de.Name(), i) {
				continue
			}
			ino, _ := strconv.ParseUint(de.Name(), 10, 64)
			if err := fn(ino); err != nil {
				return err
			}
		}
	}
	return nil
}
