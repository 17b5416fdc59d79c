package fusemount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSmallFileOneCommit: a small file written whole and closed through
// the cached mount sends its WRITE and the kernel's mtime in one
// COMPOUND (held.go), so the MDS makes it durable with one fdatasync
// besides the create's own: two per file from one writer, where the
// WRITE and the SETATTR sent apart cost three. And wherever the held
// WRITE goes, what the server ends up with is the data written and the
// mtime the application last gave it.
func TestSmallFileOneCommit(t *testing.T) {
	requireFUSE(t)
	cl := startClusterN(t, 2)
	mds := cl.MDS.Server
	addr := cl.MDS.Addr.String()
	lib := dialLib(t, addr, 0, 0)
	ctx := context.Background()
	mnt := mountCfg(t, Config{Addr: addr, Access: AccessCached})

	const files = 40
	dir := filepath.Join(mnt, "small")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := pattern(4096, 7)
	before, syncs := mds.Stats().Ops, mds.Stats().Log.Syncs
	for i := range files {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	settle(t, mds, before, files)
	d := opsDelta(mds, before)
	perFile := float64(mds.Stats().Log.Syncs-syncs) / files
	t.Logf("create: %.2f COMPOUNDs, %.2f fdatasyncs per file; ops %v", float64(d["SEQUENCE"])/files, perFile, d)
	if d["SEQUENCE"] > 4*files || d["WRITE"] != files || d["COMMIT"] != 0 {
		t.Errorf("create: %d COMPOUNDs, %d WRITEs, %d COMMITs for %d files; want at most 4 COMPOUNDs and one WRITE each, no COMMIT",
			d["SEQUENCE"], d["WRITE"], d["COMMIT"], files)
	}
	if syncs := mds.Stats().Log.Syncs; syncs > 0 && perFile > 2.1 {
		t.Errorf("create: %.2f fdatasyncs per file; want 2 (the OPEN, then the WRITE with its mtime)", perFile)
	}

	// serverHas checks what the server holds for name: its data, and the
	// mtime the mount shows (want: the one expected, if not zero).
	serverHas := func(t *testing.T, name string, wantData []byte, wantMtime time.Time, sameMtime bool) {
		t.Helper()
		p := filepath.Join(mnt, name)
		f, err := lib.Open(ctx, "/"+name, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, wantData) {
			t.Errorf("%s: server holds %d bytes, want the %d written", name, len(got), len(wantData))
		}
		srv, err := lib.Stat(ctx, "/"+name)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if sameMtime && !fi.ModTime().Equal(srv.Mtime) {
			t.Errorf("%s: mtime %v through the mount, %v at the server", name, fi.ModTime(), srv.Mtime)
		}
		if !wantMtime.IsZero() && !srv.Mtime.Equal(wantMtime) {
			t.Errorf("%s: server mtime %v, want %v", name, srv.Mtime, wantMtime)
		}
	}
	explicit := time.Unix(1_500_000_000, 0)
	cases := []struct {
		name string
		// otherMtime: the mtime the mount shows may differ from the
		// server's. The kernel updates a file's mtime at a write only
		// when its clock (a few ms resolution) has moved on since the
		// last update; a second write in the same tick passes no mtime
		// on, and the server's WRITE sets its own.
		otherMtime bool
		// do writes the file through f (open for writing, created
		// empty) and returns the data and mtime it must end with.
		do func(t *testing.T, f *os.File) ([]byte, time.Time)
	}{
		{"write, close", false, func(t *testing.T, f *os.File) ([]byte, time.Time) {
			wrote(t)(f.Write(data))
			return data, time.Time{}
		}},
		{"write, futimens, close", false, func(t *testing.T, f *os.File) ([]byte, time.Time) {
			wrote(t)(f.Write(data))
			ts := []unix.Timespec{unix.NsecToTimespec(explicit.UnixNano()), unix.NsecToTimespec(explicit.UnixNano())}
			if err := unix.UtimesNanoAt(unix.AT_FDCWD, f.Name(), ts, 0); err != nil {
				t.Fatal(err)
			}
			return data, explicit
		}},
		{"write, fsync, futimens, close", false, func(t *testing.T, f *os.File) ([]byte, time.Time) {
			wrote(t)(f.Write(data))
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			// fsync made it the server's before the close.
			g, err := lib.Open(ctx, "/"+filepath.Base(f.Name()), os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(data))
			n, err := g.ReadAt(got, 0)
			g.Close()
			if n != len(data) || !bytes.Equal(got, data) {
				t.Errorf("after fsync the server holds %d bytes (%v), want the %d written", n, err, len(data))
			}
			if err := os.Chtimes(f.Name(), explicit, explicit); err != nil {
				t.Fatal(err)
			}
			return data, explicit
		}},
		{"write, ftruncate, close", false, func(t *testing.T, f *os.File) ([]byte, time.Time) {
			wrote(t)(f.Write(data))
			if err := f.Truncate(1000); err != nil {
				t.Fatal(err)
			}
			return data[:1000], time.Time{}
		}},
		{"write, pwrite further, close", true, func(t *testing.T, f *os.File) ([]byte, time.Time) {
			wrote(t)(f.Write(data))
			if err := f.Sync(); err != nil { // the kernel sends the first WRITE
				t.Fatal(err)
			}
			wrote(t)(f.WriteAt(data, int64(len(data))))
			return append(append([]byte(nil), data...), data...), time.Time{}
		}},
		{"write, read through a second descriptor, close", false, func(t *testing.T, f *os.File) ([]byte, time.Time) {
			wrote(t)(f.Write(data))
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(f.Name())
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
			}
			return data, time.Time{}
		}},
	}
	// Written back without a close or fsync (sync_file_range starts the
	// kernel's writeback, as its flusher would): the held write reaches
	// the server on its own, in about heldMaxAge.
	t.Run("written back, left open", func(t *testing.T) {
		p := filepath.Join(mnt, "open")
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		wrote(t)(f.Write(data))
		if err := unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * heldMaxAge)
		for {
			st, err := lib.Stat(ctx, "/open")
			if err != nil {
				t.Fatal(err)
			}
			if st.Size == uint64(len(data)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server has %d bytes %v after the writeback, want %d", st.Size, 20*heldMaxAge, len(data))
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("c%d", i)
			f, err := os.OpenFile(filepath.Join(mnt, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			want, mtime := c.do(t, f)
			if err := f.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			serverHas(t, name, want, mtime, !c.otherMtime)
		})
	}
}

// wrote returns a function that fails t on a write's error.
func wrote(t *testing.T) func(int, error) {
	return func(n int, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatal(errors.New("wrote nothing"))
		}
	}
}
