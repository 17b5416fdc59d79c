package meta

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// pinFile opens name and keeps it open until the test ends, so that its
// inode stays allocated even once the name is removed: isFile can then
// tell whether another name leads to that very file (comparing inode
// numbers alone would not do, since ext4 hands a freed inode number to
// the next file made, such as the log file replacing a dropped spare).
func pinFile(t *testing.T, name string) os.FileInfo {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// isFile reports whether name leads to the pinned file.
func isFile(t *testing.T, name string, pinned os.FileInfo) bool {
	t.Helper()
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(st, pinned)
}

func exists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

// fill puts 1 KiB values under keys prefix/0, prefix/1, ... until stop
// says so (at most 10,000), with one writer, so that the commit loop runs
// in this goroutine and its state can be read between puts.
func (s *walTestStore) fill(prefix string, stop func() bool) int {
	s.t.Helper()
	v := strings.Repeat("x", 1<<10)
	for i := range 10_000 {
		if stop() {
			return i
		}
		s.mustPut(fmt.Sprintf("%s/%05d", prefix, i), v)
	}
	s.t.Fatalf("%s: condition not reached after 10000 puts", prefix)
	return 0
}

// count returns the number of keys with prefix.
func (s *walTestStore) count(prefix string) int {
	s.t.Helper()
	n := 0
	if err := s.kv.View(func(tx kvTxn) error {
		return tx.Scan([]byte(prefix+"/"), nil, func(k, v []byte) bool { n++; return true })
	}); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// TestWALSpareTakenAtCheckpoint follows a spare log file through its life:
// prepared in the background once the log is half way to a checkpoint,
// taken as the next log file at the switch (the same inode, now under the
// log file's name), prepared again, left in place by Close, and taken as
// the first log file by the next open. Every change survives a crash
// and the reopen in between.
func TestWALSpareTakenAtCheckpoint(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 16 << 10})
	spare := walSpareName(s.path)
	waitSpare := func() {
		t.Helper()
		if s.kv.spare == nil {
			t.Fatal("no spare being prepared")
		}
		<-s.kv.spare.done
		if s.kv.spare.err != nil {
			t.Fatal(s.kv.spare.err)
		}
	}
	n1 := s.fill("a", func() bool { return s.kv.spare != nil })
	if s.kv.wal.off < s.kv.ckptBytes/2 || s.kv.wal.off >= s.kv.ckptBytes {
		t.Fatalf("spare started at log offset %d, want from %d to %d", s.kv.wal.off, s.kv.ckptBytes/2, s.kv.ckptBytes)
	}
	waitSpare()
	if st, err := os.Stat(spare); err != nil || st.Size() != s.kv.prealloc {
		t.Fatalf("ready spare: %v (size %d, want %d)", err, st.Size(), s.kv.prealloc)
	}
	pinned, gen := pinFile(t, spare), s.kv.wal.gen
	n1 += s.fill("b", func() bool { return s.kv.wal.gen != gen })
	if !isFile(t, walFileName(s.path, s.kv.wal.gen), pinned) {
		t.Fatalf("log file %d is not the spare: not taken", s.kv.wal.gen)
	}
	if exists(spare) {
		t.Fatal("the spare's name still exists after it was taken")
	}
	s.crash()
	s.open(nil)
	if got := s.count("a") + s.count("b"); got != n1 {
		t.Fatalf("after a crash %d keys, want %d", got, n1)
	}

	s.fill("c", func() bool { return s.kv.spare != nil })
	waitSpare()
	pinned = pinFile(t, spare)
	if err := s.kv.Close(); err != nil {
		t.Fatal(err)
	}
	s.kv = nil
	if !exists(spare) {
		t.Fatal("Close removed the ready spare")
	}
	s.open(nil)
	if !isFile(t, walFileName(s.path, s.kv.wal.gen), pinned) {
		t.Fatal("the first log file after open is not the spare Close left")
	}
	if exists(spare) {
		t.Fatal("the spare's name still exists after open took it")
	}
}

// TestWALSpareLeftovers opens a store over what a crash or a changed
// configuration can leave of a spare: a half-written one (its .tmp name)
// is removed, one of another size is removed and the first log file
// written afresh, and a whole one is taken even if the crash came after
// it had been given a header (between writing the header and the rename
// of useSpare). Changes made after each open survive a crash.
func TestWALSpareLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(t *testing.T, s *walTestStore, size int64) // after a crash; size: a spare's
		taken bool                                            // the spare becomes the first log file
	}{
		{"half-written", func(t *testing.T, s *walTestStore, size int64) {
			writeFile(t, walSpareTmpName(s.path), make([]byte, 12345))
		}, false},
		{"other size", func(t *testing.T, s *walTestStore, size int64) {
			writeFile(t, walSpareName(s.path), make([]byte, size/2))
		}, false},
		{"whole, with a stale header", func(t *testing.T, s *walTestStore, size int64) {
			b := make([]byte, size)
			copy(b, encodeWALHeader(99))
			writeFile(t, walSpareName(s.path), b)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 16 << 10})
			s.mustPut("before", "1")
			size := s.kv.prealloc
			s.crash()
			tc.leave(t, s, size)
			var pinned os.FileInfo
			if exists(walSpareName(s.path)) {
				pinned = pinFile(t, walSpareName(s.path))
			}
			s.open(nil)
			if exists(walSpareTmpName(s.path)) || exists(walSpareName(s.path)) {
				t.Fatal("a spare left by the crash is still there after open")
			}
			if got := pinned != nil && isFile(t, walFileName(s.path, s.kv.wal.gen), pinned); got != tc.taken {
				t.Fatalf("spare taken as the first log file: %v, want %v", got, tc.taken)
			}
			s.mustPut("after", "2")
			s.crash()
			s.open(nil)
			if got := s.dump(); got != "after=2 before=1" {
				t.Fatalf("after reopening: %s", got)
			}
		})
	}
}

func writeFile(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestWALSpareNotReady: a checkpoint whose spare is not ready does not
// wait for it but switches to a preallocated file, and keeps the spare
// for the next switch; a spare that failed is dropped (the switch again
// preallocates) and a new one prepared later. Nothing is lost on the way.
func TestWALSpareNotReady(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 16 << 10})
	slow := &walSpare{done: make(chan struct{})}
	s.kv.spare = slow
	gen := s.kv.wal.gen
	n := s.fill("a", func() bool { return s.kv.wal.gen != gen })
	if s.kv.spare != slow {
		t.Fatal("a spare not ready at the switch was dropped")
	}
	slow.err = errors.New("disk full")
	close(slow.done)
	gen = s.kv.wal.gen
	n += s.fill("b", func() bool { return s.kv.wal.gen != gen })
	if s.kv.spare == slow {
		t.Fatal("a failed spare was kept")
	}
	n += s.fill("c", func() bool { return s.kv.spare != nil && s.kv.spare != slow })
	s.crash()
	s.open(nil)
	if got := s.count("a") + s.count("b") + s.count("c"); got != n {
		t.Fatalf("after a crash %d keys, want %d", got, n)
	}
}

// TestWALSparePrepareFails: a spare that cannot be written (here its
// temporary name is taken by a directory) leaves the log working, with
// preallocated files.
func TestWALSparePrepareFails(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 16 << 10})
	if err := os.Mkdir(walSpareTmpName(s.path), 0o700); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		gen := s.kv.wal.gen
		s.fill(fmt.Sprint(round), func() bool { return s.kv.wal.gen != gen })
	}
	s.crash()
	s.open(nil)
	if got := s.count("0") + s.count("1") + s.count("2"); got == 0 {
		t.Fatal("nothing after reopening")
	}
}

// TestWALFilesPrewritten checks what the spares are for: the log file's
// blocks hold data (zeros written and synced), not the unwritten extents
// fallocate leaves, whose first write costs a journal commit at the
// fdatasync. The file system says which through SEEK_DATA; one that does
// not tell fallocate'd space from data (the control file) skips.
func TestWALFilesPrewritten(t *testing.T) {
	dir := t.TempDir()
	ctl, err := os.Create(dir + "/control")
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if err := unix.Fallocate(int(ctl.Fd()), 0, 0, 1<<20); err != nil {
		t.Skipf("fallocate: %v", err)
	}
	if off, err := unix.Seek(int(ctl.Fd()), 0, unix.SEEK_DATA); err == nil && off == 0 {
		t.Skip("this file system reports fallocate'd space as data")
	}
	s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 64 << 10})
	s.fill("a", func() bool { return !s.kv.cold })
	f := s.kv.wal.f
	for _, off := range []int64{walHeaderLen, s.kv.prealloc / 2, s.kv.prealloc - 1} {
		got, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil || got != off {
			t.Fatalf("SEEK_DATA at %d of a log file of %d bytes: %d, %v: not written", off, s.kv.prealloc, got, err)
		}
	}
}

// TestWALColdFileReplacedEarly: an open that finds no spare does not write
// one (the first log file is preallocated, "cold"), and once the log holds
// coldSpareAt bytes a spare is prepared and the log switches to it long
// before the checkpoint size; a store that writes less never writes a
// spare. Everything written survives a crash across the switch.
func TestWALColdFileReplacedEarly(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{})
	if !s.kv.cold || s.kv.spare != nil {
		t.Fatalf("new store: cold %v, spare %v; want a cold first log file and no spare", s.kv.cold, s.kv.spare)
	}
	s.mustPut("small", "1")
	if s.kv.spare != nil || exists(walSpareTmpName(s.path)) || exists(walSpareName(s.path)) {
		t.Fatal("a spare was started for a store that wrote one small change")
	}
	gen := s.kv.wal.gen
	n := s.fill("a", func() bool { return s.kv.wal.gen != gen })
	if s.kv.cold {
		t.Fatal("the log switched to another cold file")
	}
	if max := int(s.kv.ckptBytes/(1<<10)) / 4; n > max {
		t.Fatalf("the switch came after %d KiB of puts, want well before the checkpoint size (%d KiB)", n, s.kv.ckptBytes>>10)
	}
	s.crash()
	s.open(nil)
	if got := s.count("a"); got != n {
		t.Fatalf("after a crash %d keys, want %d", got, n)
	}
}
