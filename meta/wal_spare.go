package meta

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Pre-written log files.
//
// A synced commit costs one fdatasync of the log, and what that costs
// depends on the blocks it writes. Appending past the end of a file also
// writes its new size; writing into fallocate'd space converts an
// unwritten extent, which on ext4 is a journal commit as well; only
// overwriting blocks that already hold data writes nothing but the data
// (fio on the ext4-on-virtio disk of the benchmarks, 4 KiB writes, each
// followed by an fdatasync: 129 µs appending, 158 µs into fallocate'd
// space, 80-93 µs overwriting). So log files are written full of zeros
// and synced before they are used, and every commit then overwrites.
//
// Writing 20 MiB of zeros takes tens of milliseconds, which must not fall
// on a commit. A spare file is therefore prepared in the background while
// the current log file fills (from half of the checkpoint size on): written
// with zeros under <db>-wal.spare.tmp, synced, and renamed to
// <db>-wal.spare, so a file under the spare's name is always whole. At the
// checkpoint's switch the commit loop takes it: writes the new
// generation's header over its first bytes, fdatasyncs, renames it to the
// log file's real name and syncs the directory, the same steps and the
// same guarantee (a log file under its real name is always whole) as a
// file made from scratch. A spare not ready by then is left to finish for
// the next switch, and the switch makes a preallocated file the old way.
//
// Close leaves a ready spare in place, and the next open starts its first
// log file from it. An open that finds none starts with a preallocated
// ("cold") file, as before pre-writing, and does not wait for 20 MiB of
// zeros (25-50 ms on that disk, and as much disk bandwidth for every
// store a test opens for a moment): once the cold file holds coldSpareAt
// bytes a spare is prepared, and the log switches to it as soon as it is
// ready, through an early checkpoint (the same switch as at the size
// limit, of a small layer). A switch whose spare is not ready leaves the
// new file cold in the same way. Open removes a half-made
// spare (the .tmp name) and a spare of another size than it would make.
// Stores that never sync (BoltOptions.NoSync) keep fallocate'd files,
// since nothing there waits for an fdatasync.

// walZeroChunk is how much of a spare is written per write(2).
const walZeroChunk = 1 << 20

func walSpareName(dbPath string) string    { return dbPath + "-wal.spare" }
func walSpareTmpName(dbPath string) string { return dbPath + "-wal.spare.tmp" }

// errSpareStopped ends the preparation of a spare that is no longer wanted.
var errSpareStopped = errors.New("meta: preparing a log file stopped")

// writeZeros writes zeros to f from off up to size. It stops with
// errSpareStopped when stop (if not nil) is set.
func writeZeros(f *os.File, off, size int64, stop *atomic.Bool) error {
	zeros := make([]byte, min(walZeroChunk, max(size-off, 0)))
	for off < size {
		if stop != nil && stop.Load() {
			return errSpareStopped
		}
		n := min(int64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// walSpare is the next log file, being prepared by a goroutine or ready.
// The commit loop owns it (Close, once the loop has stopped).
type walSpare struct {
	done chan struct{} // closed when f or err is set
	stop atomic.Bool
	f    *os.File // the ready file, under walSpareName
	err  error
}

// prepareSpare starts writing a spare log file of size bytes.
func prepareSpare(dbPath string, size int64) *walSpare {
	sp := &walSpare{done: make(chan struct{})}
	go func() {
		defer close(sp.done)
		sp.f, sp.err = makeSpare(dbPath, size, &sp.stop)
	}()
	return sp
}

// makeSpare writes the spare log file: zeros, synced, then renamed to its
// name, so that the name only ever holds a whole file. The rename needs no
// directory sync: if a crash loses it, open finds the .tmp and removes it.
func makeSpare(dbPath string, size int64, stop *atomic.Bool) (*os.File, error) {
	tmp := walSpareTmpName(dbPath)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("meta: prepare log file: %w", err)
	}
	err = writeZeros(f, 0, size, stop)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, walSpareName(dbPath))
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("meta: prepare log file %s: %w", tmp, err)
	}
	return f, nil
}

// ready reports whether the spare is ready to be taken (prepared without
// error). A nil spare is not.
func (sp *walSpare) ready() bool {
	if sp == nil {
		return false
	}
	select {
	case <-sp.done:
		return sp.err == nil
	default:
		return false
	}
}

// take returns the spare's file if it is ready, without waiting, and
// whether the spare is spent (ready, or failed: the caller drops it).
func (sp *walSpare) take() (f *os.File, spent bool, err error) {
	select {
	case <-sp.done:
		return sp.f, true, sp.err
	default:
		return nil, false, nil
	}
}

// release stops a spare still being prepared (its .tmp is removed) and
// waits for it; a ready one is closed and stays for the next open.
func (sp *walSpare) release() {
	sp.stop.Store(true)
	<-sp.done
	if sp.f != nil {
		sp.f.Close()
	}
}

// openReadySpare opens the spare a previous run left, if there is one of
// size bytes; one of another size (the checkpoint size changed) is
// removed.
func openReadySpare(dbPath string, size int64) (*os.File, error) {
	name := walSpareName(dbPath)
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("meta: open %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("meta: stat %s: %w", name, err)
	}
	if st.Size() != size {
		f.Close()
		if err := os.Remove(name); err != nil {
			return nil, fmt.Errorf("meta: remove %s: %w", name, err)
		}
		return nil, nil
	}
	return f, nil
}

// useSpare makes the ready spare f log file gen: the header written over
// its first bytes and synced, then renamed to the log file's name and the
// directory synced. On error f is closed and the spare removed.
func useSpare(dbPath string, f *os.File, gen uint64, sync bool) (*walFile, error) {
	spare, name := walSpareName(dbPath), walFileName(dbPath, gen)
	fail := func(err error) (*walFile, error) {
		f.Close()
		os.Remove(spare)
		return nil, fmt.Errorf("meta: start WAL %s from %s: %w", name, spare, err)
	}
	if _, err := f.WriteAt(encodeWALHeader(gen), 0); err != nil {
		return fail(err)
	}
	if sync {
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fail(err)
		}
	}
	return publishWALFile(f, spare, dbPath, gen, sync, fail)
}
