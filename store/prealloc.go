//go:build linux

package store

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Preallocation of streaming writes. A write that extends an object on
// ext4 goes through delayed allocation page by page: for every 4 KiB of
// it the file system looks up, reserves and records a delayed extent
// (ext4_da_write_begin, ext4_da_get_block_prep, the extent status tree),
// which was 17% of a data server's CPU samples while a FUSE mount
// streamed 4 files of 256 MiB (issue 27, h3-bigwrite2). Blocks allocated
// beforehand with fallocate(2) skip that: the write finds them mapped.
// Measured on this machine, 1 MiB pwrites of 512 MiB cost 90-190 ms of
// CPU into delayed allocation and 47-86 ms into preallocated blocks,
// each run with its fdatasync at the end (which costs the same either
// way).
//
// So once a write ends past preallocFrom bytes, the object is allocated
// ahead of it in steps of preallocStep, with FALLOC_FL_KEEP_SIZE: the
// object's size, what reads return and where the data ends do not change,
// only blocks past the end are reserved. What a streaming write leaves
// allocated past the end (less than two steps) is given back at the next
// Sync, which a COMMIT runs: a truncate to the object's own size frees
// the blocks past it, under the object lock, so no write extends the
// object meanwhile (a write that extended it between the size read and
// the truncate would lose its data). Objects that never grow past
// preallocFrom are never preallocated, so small objects keep exactly the
// space they use. Only on file systems where preallocation is cheap and
// past-the-end blocks are freed by such a truncate: ext4 and XFS
// (preallocating on tmpfs, say, would take memory).
const (
	preallocStep = 8 << 20
	preallocFrom = 16 << 20
)

// preallocFS reports whether the file system of dir gets preallocation.
func preallocFS(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC:
		return true
	}
	return false
}

// preallocate allocates ahead of a write of n bytes at off to e, if it
// ends past what is allocated ahead already. The caller holds e.rw
// shared. A failure (no space, say) is not the write's: it goes on into
// delayed allocation, which reports its own.
func (l *Local) preallocate(e *fdEntry, off int64, n int) {
	end := off + int64(n)
	if end < preallocFrom || end <= e.pend.Load() || l.noPrealloc.Load() {
		return
	}
	e.pmu.Lock()
	defer e.pmu.Unlock()
	pend := e.pend.Load()
	if end <= pend {
		return
	}
	// From where the last step ended, or from the write's own step if it
	// lands past that: a gap a sparse write leaves is not filled.
	from := max(pend, off&^(preallocStep-1))
	to := (end+preallocStep-1)&^(preallocStep-1) + preallocStep
	for {
		err := unix.Fallocate(e.fd, unix.FALLOC_FL_KEEP_SIZE, from, to-from)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
			l.noPrealloc.Store(true)
			return
		}
		break
	}
	// Also after another failure (no space, say): the write does not ask
	// again for this step, and the next Sync trims whatever was taken.
	e.pend.Store(to)
}

// trimPrealloc frees what preallocate reserved past the end of e's
// object. The caller holds no lock of e.
func (l *Local) trimPrealloc(e *fdEntry) error {
	if e.pend.Load() == 0 {
		return nil
	}
	e.rw.Lock()
	defer e.rw.Unlock()
	size, err := fsize(e, e.fd)
	if err != nil {
		return err
	}
	if e.pend.Load() > size {
		// A truncate to the same size frees the blocks past it (and
		// touches the object's mtime, which the store does not use).
		if err := unix.Ftruncate(e.fd, size); err != nil {
			return fmt.Errorf("store: free the space allocated past the end of %d: %w", e.ino, err)
		}
	}
	e.pend.Store(0)
	return nil
}
