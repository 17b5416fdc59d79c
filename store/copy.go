//go:build linux

package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"slices"

	"golang.org/x/sys/unix"
)

var _ Copier = (*Local)(nil)

// CopyRange implements Copier with copy_file_range(2): on file systems
// that share blocks (XFS, Btrfs) the copy is a clone, elsewhere the kernel
// copies without the bytes entering this process; where the call is not
// available the copy goes through a buffer.
//
// With checksums, the destination's entries must describe its new bytes.
// Where source and destination blocks line up (the offsets differ by a
// multiple of ChecksumBlockSize) and a destination block is copied whole,
// the source block's entry is copied with it, under the block locks of
// both, without reading the data: identical bytes have identical
// checksums, and a source block that fails its checksum yields a copy that
// fails it too, never one vouched for. The other blocks (the partly copied
// first and last ones, or all of them when the offsets do not line up) go
// through ReadAt and WriteAt, which verify and recompute.
func (l *Local) CopyRange(src, dst uint64, srcOff, dstOff, n int64) error {
	if srcOff < 0 || dstOff < 0 || n < 0 || srcOff > math.MaxInt64-n || dstOff > math.MaxInt64-n {
		return fmt.Errorf("store: copy %d to %d: range: %w", src, dst, fs.ErrInvalid)
	}
	if src == dst && srcOff < dstOff+n && dstOff < srcOff+n {
		return fmt.Errorf("store: copy %d to itself: overlapping ranges: %w", src, fs.ErrInvalid)
	}
	if n == 0 {
		return nil
	}
	se, err := l.acquire(src, false)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if se != nil {
		defer l.release(se)
	}
	de, err := l.acquire(dst, true)
	if err != nil {
		return err
	}
	defer l.release(de)
	end := srcOff // the end of the source's data in the range
	if se != nil {
		size, err := fsize(se, se.fd)
		if err != nil {
			return err
		}
		end = max(srcOff, min(srcOff+n, size))
	}
	// Copy the source's data, and zero the destination where the source
	// has holes, so that a sparse file's copy stays sparse.
	for pos := srcOff; pos < end; {
		data, hole := dataRun(se, pos, end)
		if data > pos {
			if err := l.zero(de, dstOff+pos-srcOff, dstOff+data-srcOff); err != nil {
				return err
			}
		}
		if data < hole {
			var err error
			if de.crc != nil {
				err = l.copyCRC(se, de, data, dstOff+data-srcOff, hole-data)
			} else {
				_, err = copyFD(de, dstOff+data-srcOff, se, data, hole-data)
			}
			if err != nil {
				return err
			}
		}
		pos = hole
	}
	// The rest of the source range is zeros.
	return l.zero(de, dstOff+end-srcOff, dstOff+n)
}

// dataRun returns the next run of data in [pos, end) of e's object: it
// starts at data and ends at hole (data == hole == end if there is none).
// Without hole detection everything is data.
func dataRun(e *fdEntry, pos, end int64) (data, hole int64) {
	d, err := unix.Seek(e.fd, pos, SeekData)
	switch {
	case err == unix.ENXIO:
		return end, end
	case err != nil:
		return pos, end
	}
	d = min(max(d, pos), end)
	h, err := unix.Seek(e.fd, d, SeekHole)
	if err != nil {
		return d, end
	}
	return d, min(max(h, d), end)
}

// zero makes [from, to) of e's object read as zeros without growing it:
// it punches what the object holds there, or writes zeros where the file
// system cannot punch.
func (l *Local) zero(e *fdEntry, from, to int64) error {
	size, err := fsize(e, e.fd)
	if err != nil {
		return err
	}
	to = min(to, size)
	if from >= to {
		return nil
	}
	h := &handle{l: l, e: e}
	err = h.PunchHole(from, to-from)
	if errors.Is(err, ErrNotSupported) {
		zeros := make([]byte, min(to-from, 1<<20))
		for off := from; off < to && err == nil; off += int64(len(zeros)) {
			_, err = h.WriteAt(zeros[:min(int64(len(zeros)), to-off)], off)
		}
	}
	return err
}

// copyFD copies n bytes from src at srcOff to dst at dstOff, in the kernel
// where it can, and returns how many it copied: fewer only when src ends
// first.
func copyFD(dst *fdEntry, dstOff int64, src *fdEntry, srcOff int64, n int64) (int64, error) {
	done := int64(0)
	for done < n {
		so, do := srcOff+done, dstOff+done
		m, err := unix.CopyFileRange(src.fd, &so, dst.fd, &do, int(min(n-done, 1<<30)), 0)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EXDEV || err == unix.EINVAL || err == unix.ENOSYS || err == unix.EOPNOTSUPP:
			k, err := copyBuf(dst, dstOff+done, src, srcOff+done, n-done)
			return done + k, err
		case err != nil:
			return done, fmt.Errorf("store: copy %d to %d: %w", src.ino, dst.ino, err)
		case m == 0:
			return done, nil // src ended
		}
		done += int64(m)
	}
	return done, nil
}

// copyBuf is copyFD through a buffer.
func copyBuf(dst *fdEntry, dstOff int64, src *fdEntry, srcOff int64, n int64) (int64, error) {
	buf := make([]byte, min(n, 1<<20))
	done := int64(0)
	for done < n {
		m, err := src.f.ReadAt(buf[:min(int64(len(buf)), n-done)], srcOff+done)
		if m > 0 {
			if _, werr := dst.f.WriteAt(buf[:m], dstOff+done); werr != nil {
				return done, fmt.Errorf("store: copy %d to %d: %w", src.ino, dst.ino, werr)
			}
			done += int64(m)
		}
		if errors.Is(err, io.EOF) {
			return done, nil
		}
		if err != nil {
			return done, fmt.Errorf("store: copy %d to %d: %w", src.ino, dst.ino, err)
		}
	}
	return done, nil
}

// copyCRC copies n bytes of checksummed data, all inside the source's
// data, keeping the destination's entries current (see CopyRange).
func (l *Local) copyCRC(se, de *fdEntry, srcOff, dstOff, n int64) error {
	aligned := (srcOff-dstOff)&blockMask == 0
	var buf []byte
	for pos := int64(0); pos < n; {
		s, d := srcOff+pos, dstOff+pos
		if aligned && d&blockMask == 0 {
			m, err := l.copyBlocks(se, de, s, d, min(n-pos, chunkBlocks*ChecksumBlockSize))
			if err != nil {
				return err
			}
			if m > 0 {
				pos += m
				continue
			}
		}
		// Through a buffer, verified and recomputed: up to the next
		// destination block boundary when the blocks line up (the rest
		// goes above), a chunk otherwise.
		m := min(n-pos, chunkBlocks*ChecksumBlockSize)
		if aligned {
			m = min(n-pos, ChecksumBlockSize-d&blockMask)
		}
		if buf == nil {
			buf = make([]byte, chunkBlocks*ChecksumBlockSize)
		}
		got, err := l.readCRC(se, buf[:m], s)
		if err != nil && err != io.EOF {
			return err
		}
		clear(buf[got:m]) // the source shrank meanwhile: zeros, as past its end
		if _, err := l.writeCRC(de, buf[:m], d); err != nil {
			return err
		}
		pos += m
	}
	return nil
}

// copyBlocks copies up to n bytes from s to the block boundary d, where s
// and d line up, block by block with their entries, and returns how many
// it copied: whole blocks, plus the source's last partial block if the
// copy reaches the source's end there and the destination holds nothing
// past the copied bytes in that block. 0 means the first block must go
// through a buffer.
func (l *Local) copyBlocks(se, de *fdEntry, s, d, n int64) (int64, error) {
	first, second := se, de
	if de.ino < se.ino {
		first, second = de, se
	}
	first.rw.RLock()
	defer first.rw.RUnlock()
	if second != first {
		second.rw.RLock()
		defer second.rw.RUnlock()
	}
	locks := l.lockCopy(se.ino, de.ino, s>>blockShift, (s+n-1)>>blockShift, d>>blockShift, (d+n-1)>>blockShift)
	defer l.unlockCopy(locks)
	m := n &^ blockMask
	if m < n {
		// A partial last block is whole in the source only if the source
		// ends there, and stays equal to it in the destination only if
		// the destination holds nothing after it in the block.
		ssize, err := fsize(se, se.fd)
		if err != nil {
			return 0, err
		}
		dsize, err := fsize(de, de.fd)
		if err != nil {
			return 0, err
		}
		if s+n == ssize && dsize <= d+n {
			m = n
		}
	}
	if m == 0 {
		return 0, nil
	}
	nb := (m + blockMask) >> blockShift
	var ents [chunkBlocks * entrySize]byte
	if err := readEntries(se, ents[:nb*entrySize], s>>blockShift); err != nil {
		return 0, err
	}
	got, err := copyFD(de, d, se, s, m)
	if err != nil {
		return 0, err
	}
	if got < m {
		// Cannot happen while the source's object lock is held shared;
		// refuse rather than vouch for bytes not copied.
		return 0, fmt.Errorf("store: copy %d to %d: source ended at %d: %w", se.ino, de.ino, s+got, io.ErrUnexpectedEOF)
	}
	if _, err := de.crc.WriteAt(ents[:nb*entrySize], (d>>blockShift)*entrySize); err != nil {
		return 0, fmt.Errorf("store: write checksums of %d: %w", de.ino, err)
	}
	return m, nil
}

// copyLock is one block lock held by a copy.
type copyLock struct {
	idx   uint16
	write bool
}

// lockCopy takes the block locks of source blocks sb0..sb1 (shared) and
// destination blocks db0..db1 (exclusive), in ascending lock order like
// lockBlocks; a lock needed both ways is taken exclusively.
func (l *Local) lockCopy(src, dst uint64, sb0, sb1, db0, db1 int64) []copyLock {
	ls := make([]copyLock, 0, (sb1-sb0+1)+(db1-db0+1))
	for b := sb0; b <= sb1; b++ {
		ls = append(ls, copyLock{stripeOf(src, b), false})
	}
	for b := db0; b <= db1; b++ {
		ls = append(ls, copyLock{stripeOf(dst, b), true})
	}
	slices.SortFunc(ls, func(a, b copyLock) int {
		if a.idx != b.idx {
			return int(a.idx) - int(b.idx)
		}
		if a.write != b.write {
			if a.write {
				return -1
			}
			return 1
		}
		return 0
	})
	ls = slices.CompactFunc(ls, func(a, b copyLock) bool { return a.idx == b.idx })
	for _, x := range ls {
		if x.write {
			l.stripes[x.idx].Lock()
		} else {
			l.stripes[x.idx].RLock()
		}
	}
	return ls
}

func (l *Local) unlockCopy(ls []copyLock) {
	for _, x := range ls {
		if x.write {
			l.stripes[x.idx].Unlock()
		} else {
			l.stripes[x.idx].RUnlock()
		}
	}
}
