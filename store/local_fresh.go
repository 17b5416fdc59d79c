//go:build linux

package store

// Files that never had data.
//
// The server frees the data of every file whose last link goes (its
// freer, server/orphans.go), and on `shoal serve` that is Local.Remove:
// an unlink(2) of the file's data. Most files removed in a small-file
// workload never had any (created empty, or never written), and the
// unlink of a name that does not exist is not cheap: a path walk and a
// search of the folder's directory blocks, about 5% of the server's CPU
// per REMOVE in issue 27's benchmark (docs/benchmarks.md, "Removes,
// fourth pass"). NoDataFrom lets Local skip it: the owner tells it the
// first inode number that had no data file when it opened (the metadata
// engine's next inode number), and Local remembers, one bit per inode
// number from there, which of them it has made a data file for since.
// Remove of an inode number at or above that mark whose bit is clear
// makes no system call; everything below the mark is unlinked as before.

// freshBits tracks the data files Local made for inode numbers from from
// on. The zero value tracks nothing (on is false).
type freshBits struct {
	on   bool
	from uint64
	made []uint64 // bit ino-from set: a data file was made for ino
}

// maxFreshSpan bounds the bitmap (16 MiB of bits): inode numbers beyond
// from+maxFreshSpan are not tracked, and Remove unlinks them as before.
const maxFreshSpan = 1 << 27

// NoDataFrom tells Local that no data file exists for any inode number
// from from on, except those it makes from now on (Open with create,
// Truncate). The caller must know it: `shoal serve` passes the next
// inode number of its metadata engine, which owns the same directory
// under an exclusive lock, right after opening both and before serving,
// so every inode that could have data from an earlier run (or from an
// unclean shutdown, after which the engine skips numbers) is below it.
// Later calls are ignored.
func (l *Local) NoDataFrom(from uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.fresh.on {
		l.fresh = freshBits{on: true, from: from}
	}
}

// tracked reports whether ino is in the range the bitmap covers, and
// its bit's index.
func (b *freshBits) tracked(ino uint64) (uint64, bool) {
	if !b.on || ino < b.from || ino-b.from >= maxFreshSpan {
		return 0, false
	}
	return ino - b.from, true
}

// mark records that a data file was made for ino. Under Local.mu.
func (b *freshBits) mark(ino uint64) {
	i, ok := b.tracked(ino)
	if !ok {
		return
	}
	w := int(i / 64)
	if w >= len(b.made) {
		b.made = append(b.made, make([]uint64, w+1-len(b.made))...)
	}
	b.made[w] |= 1 << (i % 64)
}

// noData reports whether ino is tracked and Local never made a data file
// for it, so that there is nothing to unlink. Under Local.mu.
func (b *freshBits) noData(ino uint64) bool {
	i, ok := b.tracked(ino)
	if !ok {
		return false
	}
	w := int(i / 64)
	return w >= len(b.made) || b.made[w]&(1<<(i%64)) == 0
}

// NoData reports whether ino is known to have no data file: it is at or
// above the mark NoDataFrom set and Local never made one for it.
func (l *Local) NoData(ino uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fresh.noData(ino)
}
