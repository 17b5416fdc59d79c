package fusemount

import (
	"cmp"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
)

// TestCtimeFlush: the SETATTR of mtime and ctime the kernel sends (with
// the writeback cache) after every link, unlink and rename of a regular
// file is answered by the mount, not the MDS (ctimeflush.go), and what
// the mount, the kernel and another client see stays right: link counts,
// a ctime the server moved forward, names gone at once, an mtime another
// client set kept, and an mtime-only utimes(2) right after the operation
// still reaching the server.
//
// Before ctimeflush.go every case here but the last link's unlink cost a
// SETATTR at the MDS (a round trip and a durable commit), and the rename
// after another client's utimes put the kernel's old mtime back.
func TestCtimeFlush(t *testing.T) {
	requireFUSE(t)
	cl := startClusterN(t, 1)
	mds := cl.MDS.Server
	addr := cl.MDS.Addr.String()
	mnt := mountCfg(t, Config{Addr: addr, Access: AccessCached})
	lib := dialLib(t, addr, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	stamp := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
	cases := []struct {
		name string
		// setup makes the files (names relative to the case's directory);
		// op is what is measured; then links maps each name to the link
		// count it must have (0: gone), and changed is the name whose
		// server ctime must have moved, the file named was before op
		// (changed if empty).
		setup        func(t *testing.T, dir string)
		op           func(dir string) error
		links        map[string]uint32
		changed, was string
		// mtime, if set, is the mtime the server must have for changed.
		mtime *time.Time
		// setattrs is how many SETATTRs op costs at the MDS.
		setattrs uint64
	}{
		{
			name:  "link",
			setup: func(t *testing.T, dir string) { write(t, dir, "a") },
			op:    func(dir string) error { return os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b")) },
			links: map[string]uint32{"a": 2, "b": 2}, changed: "a",
		},
		{
			name:  "rename",
			setup: func(t *testing.T, dir string) { write(t, dir, "a") },
			op:    func(dir string) error { return os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")) },
			links: map[string]uint32{"a": 0, "b": 1}, changed: "b", was: "a",
		},
		{
			name: "unlink one of two links",
			setup: func(t *testing.T, dir string) {
				write(t, dir, "a")
				link(t, dir, "a", "b")
			},
			op:    func(dir string) error { return os.Remove(filepath.Join(dir, "a")) },
			links: map[string]uint32{"a": 0, "b": 1}, changed: "b",
		},
		{
			name: "rename over one of two links",
			setup: func(t *testing.T, dir string) {
				write(t, dir, "a")
				write(t, dir, "b")
				link(t, dir, "b", "c")
			},
			op:    func(dir string) error { return os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")) },
			links: map[string]uint32{"a": 0, "b": 1, "c": 1}, changed: "c",
		},
		{
			name:  "unlink of the last link",
			setup: func(t *testing.T, dir string) { write(t, dir, "a") },
			op:    func(dir string) error { return os.Remove(filepath.Join(dir, "a")) },
			links: map[string]uint32{"a": 0},
		},
		{
			// Another client sets the mtime after the kernel here cached
			// the file's: the kernel's flush carries the old one.
			name: "rename keeps another client's mtime",
			setup: func(t *testing.T, dir string) {
				write(t, dir, "a")
				if _, err := os.Stat(filepath.Join(dir, "a")); err != nil {
					t.Fatal(err)
				}
				p := libPath(mnt, filepath.Join(dir, "a"))
				if err := lib.SetAttr(ctx, p, client.SetAttr{Mtime: &stamp}); err != nil {
					t.Fatalf("set mtime of %s: %v", p, err)
				}
			},
			op:    func(dir string) error { return os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")) },
			links: map[string]uint32{"a": 0, "b": 1}, changed: "b", was: "a", mtime: &stamp,
		},
		{
			// The flush's mark is used up: an mtime-only utimes(2) of
			// the same shape (mtime and ctime, no handle) goes to the
			// server.
			name:  "utimes right after a rename",
			setup: func(t *testing.T, dir string) { write(t, dir, "a") },
			op: func(dir string) error {
				b := filepath.Join(dir, "b")
				if err := os.Rename(filepath.Join(dir, "a"), b); err != nil {
					return err
				}
				ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(stamp.UnixNano())}
				return unix.UtimesNanoAt(unix.AT_FDCWD, b, ts, 0)
			},
			links: map[string]uint32{"a": 0, "b": 1}, changed: "b", was: "a", mtime: &stamp,
			setattrs: 1,
		},
		{
			// The same with the file open for writing (by this test):
			// the flush then comes through that handle, and the
			// utimes(2) after it must still reach the server.
			name: "utimes right after a rename of a file open for writing",
			setup: func(t *testing.T, dir string) {
				write(t, dir, "a")
				f, err := os.OpenFile(filepath.Join(dir, "a"), os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
			},
			op: func(dir string) error {
				b := filepath.Join(dir, "b")
				if err := os.Rename(filepath.Join(dir, "a"), b); err != nil {
					return err
				}
				ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(stamp.UnixNano())}
				return unix.UtimesNanoAt(unix.AT_FDCWD, b, ts, 0)
			},
			links: map[string]uint32{"a": 0, "b": 1}, changed: "b", was: "a", mtime: &stamp,
			setattrs: 1,
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(mnt, "c"+string(rune('0'+i)))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, dir)
			var before client.Attr
			if was := cmp.Or(tc.was, tc.changed); was != "" {
				before = libStat(ctx, t, lib, mnt, filepath.Join(dir, was))
			}
			ops := mds.Stats().Ops
			if err := tc.op(dir); err != nil {
				t.Fatal(err)
			}
			d := opsDelta(mds, ops)
			t.Logf("ops: %v", d)
			if d["SETATTR"] != tc.setattrs {
				t.Errorf("%d SETATTRs at the MDS, want %d", d["SETATTR"], tc.setattrs)
			}
			for name, want := range tc.links {
				p := filepath.Join(dir, name)
				var st unix.Stat_t
				err := unix.Stat(p, &st)
				a, lerr := lib.Stat(ctx, libPath(mnt, p))
				switch {
				case want == 0:
					if err != syscall.ENOENT {
						t.Errorf("stat %s through the mount: %v, want ENOENT", name, err)
					}
					if !errors.Is(lerr, fs.ErrNotExist) {
						t.Errorf("stat %s from another client: %v, want not found", name, lerr)
					}
				case err != nil || lerr != nil:
					t.Errorf("stat %s: %v through the mount, %v from another client", name, err, lerr)
				case uint32(st.Nlink) != want || a.Nlink != want:
					t.Errorf("%s: %d links through the mount, %d from another client; want %d", name, st.Nlink, a.Nlink, want)
				}
			}
			if tc.changed == "" {
				return
			}
			p := filepath.Join(dir, tc.changed)
			after := libStat(ctx, t, lib, mnt, p)
			if !after.Ctime.After(before.Ctime) {
				t.Errorf("%s: server ctime %v, not after %v", tc.changed, after.Ctime, before.Ctime)
			}
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				t.Fatal(err)
			}
			// The kernel keeps its own ctime (its coarse clock, up to a
			// tick behind the server's) for the inode it holds.
			if ct := time.Unix(st.Ctim.Unix()); ct.Before(before.Ctime.Add(-tick)) {
				t.Errorf("%s: ctime through the mount %v, before the server's %v from before the change", tc.changed, ct, before.Ctime)
			}
			if tc.mtime != nil && !after.Mtime.Equal(*tc.mtime) {
				t.Errorf("%s: server mtime %v, want %v", tc.changed, after.Mtime, *tc.mtime)
			}
		})
	}
}

// tick bounds how far the kernel's coarse clock, which sets the ctime
// it keeps, lags the server's (one jiffy, 10 ms at HZ=100).
const tick = 20 * time.Millisecond

// write creates name in dir with a few bytes.
func write(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte("data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// link makes to a second name of from, in dir.
func link(t *testing.T, dir, from, to string) {
	t.Helper()
	if err := os.Link(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
		t.Fatal(err)
	}
}

// libPath is the export path of p, a path under the mount mnt.
func libPath(mnt, p string) string {
	rel, err := filepath.Rel(mnt, p)
	if err != nil {
		panic(err)
	}
	return "/" + filepath.ToSlash(rel)
}

func libStat(ctx context.Context, t *testing.T, lib *client.Client, mnt, p string) client.Attr {
	t.Helper()
	a, err := lib.Stat(ctx, libPath(mnt, p))
	if err != nil {
		t.Fatalf("stat %s from another client: %v", p, err)
	}
	return a
}
