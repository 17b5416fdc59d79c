package fusemount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		in, addr, path string
		bad            bool
	}{
		{in: "nfs://127.0.0.1:2050/export/a", addr: "127.0.0.1:2050", path: "/export/a"},
		{in: "nfs://server", addr: "server:2049", path: "/"},
		{in: "nfs://[::1]/x", addr: "[::1]:2049", path: "/x"},
		{in: "http://server/x", bad: true},
		{in: "nfs:///x", bad: true},
		{in: "/local/dir", bad: true},
	} {
		addr, path, err := ParseURL(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseURL(%q) = %q %q, want an error", tc.in, addr, path)
			}
			continue
		}
		if err != nil || addr != tc.addr || path != tc.path {
			t.Errorf("ParseURL(%q) = %q %q %v, want %q %q", tc.in, addr, path, err, tc.addr, tc.path)
		}
	}
}

func TestParseAccess(t *testing.T) {
	for _, a := range []Access{AccessCached, AccessODirect, AccessDirect} {
		got, err := ParseAccess(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAccess(%q) = %v %v", a.String(), got, err)
		}
	}
	if _, err := ParseAccess("pnfs"); err == nil {
		t.Error("ParseAccess accepted an unknown method")
	}
}

func TestToErrno(t *testing.T) {
	status := func(s nfs4.Nfsstat4) error {
		return &fs.PathError{Op: "open", Path: "/x", Err: &client.StatusError{Op: "OPEN", NFSStatus: uint32(s)}}
	}
	for _, tc := range []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{status(nfs4.NFS4ERR_NOENT), syscall.ENOENT},
		{status(nfs4.NFS4ERR_ACCESS), syscall.EACCES},
		{status(nfs4.NFS4ERR_NOTEMPTY), syscall.ENOTEMPTY},
		{&fs.PathError{Op: "mkdir", Path: "/", Err: syscall.EEXIST}, syscall.EEXIST},
		{fmt.Errorf("read: %w", client.ErrClosed), syscall.EIO},
		{client.ErrVerifierChanged, syscall.EIO},
		{context.Canceled, syscall.EINTR},
		{fs.ErrNotExist, syscall.ENOENT},
		{errors.New("something odd"), syscall.EIO},
	} {
		if got := toErrno(tc.err); got != tc.want {
			t.Errorf("toErrno(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestLockRange(t *testing.T) {
	for _, tc := range []struct {
		lk          fuse.FileLock
		off, length uint64
	}{
		{fuse.FileLock{Start: 0, End: 9}, 0, 10},
		{fuse.FileLock{Start: 5, End: 5}, 5, 1},
		{fuse.FileLock{Start: 100, End: math.MaxInt64}, 100, 0},
		{fuse.FileLock{Start: 0, End: math.MaxUint64}, 0, 0},
	} {
		off, length := lockRange(&tc.lk)
		if off != tc.off || length != tc.length {
			t.Errorf("lockRange(%+v) = %d,%d, want %d,%d", tc.lk, off, length, tc.off, tc.length)
		}
	}
}

func TestOpenFlags(t *testing.T) {
	for _, tc := range []struct {
		in   uint32
		want int
	}{
		{syscall.O_RDONLY, os.O_RDONLY},
		{syscall.O_WRONLY | syscall.O_APPEND, os.O_WRONLY},
		{syscall.O_RDWR | syscall.O_TRUNC | syscall.O_LARGEFILE, os.O_RDWR | os.O_TRUNC},
		{syscall.O_WRONLY | syscall.O_DSYNC, os.O_WRONLY | os.O_SYNC},
	} {
		if got := openFlags(tc.in); got != tc.want {
			t.Errorf("openFlags(%#o) = %#o, want %#o", tc.in, got, tc.want)
		}
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	if got := unescapeMountinfo(`/tmp/a\040b\011c`); got != "/tmp/a b\tc" {
		t.Errorf("unescape: %q", got)
	}
	if got := unescapeMountinfo(`/plain`); got != "/plain" {
		t.Errorf("unescape: %q", got)
	}
}

func TestMountUnreachable(t *testing.T) {
	_, err := New(context.Background(), t.TempDir(), Config{Addr: "127.0.0.1:1", Client: client.Options{DialTimeout: 1e9}})
	if err == nil {
		t.Fatal("mounting an unreachable server succeeded")
	}
}

// requireFUSE skips a test that mounts when FUSE mounts cannot work here.
func requireFUSE(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("FUSE unavailable (%v)", err)
	}
	f.Close()
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			t.Skip("not root and no fusermount3 in PATH")
		}
	}
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// startCluster runs a pNFS metadata server with two data servers on
// loopback, so file data takes the layout path.
func startCluster(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	noSquash := false
	c, err := wiring.Start(ctx, wiring.Config{
		Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0", StripeUnit: 64 << 10,
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}}, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("wiring.Start: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c.MDS.Addr.String()
}

// mountAt mounts addr's export on a fresh directory as uid/gid and
// unmounts it when the test ends.
func mountAt(t *testing.T, addr string, access Access, uid, gid uint32) string {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := New(ctx, dir, Config{
		Addr: addr, Access: access, UID: uid, GID: gid,
		Client: client.Options{DialTimeout: 10 * time.Second}, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			if err := Unmount(dir, true); err != nil {
				t.Errorf("lazy unmount: %v", err)
			}
		}
	})
	return dir
}

func dialLib(t *testing.T, addr string, uid, gid uint32) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, client.Options{UID: uid, GID: gid, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("client.Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pattern returns n bytes that differ from page to page and with seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/4096) ^ byte(i*7) ^ seed
	}
	return b
}

// libRead reads a whole file through the client library.
func libRead(t *testing.T, c *client.Client, path string) []byte {
	t.Helper()
	ctx := context.Background()
	f, err := c.Open(ctx, path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("library open %s: %v", path, err)
	}
	defer f.Close()
	got, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("library read %s: %v", path, err)
	}
	return got
}

// libWrite replaces a file's content through the client library.
func libWrite(t *testing.T, c *client.Client, path string, data []byte, perm uint32) {
	t.Helper()
	f, err := c.Open(context.Background(), path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		t.Fatalf("library open %s: %v", path, err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatalf("library write %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("library close %s: %v", path, err)
	}
}

func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Fatalf("%s: got %d bytes, want %d; first difference at offset %d", what, len(got), len(want), i)
}

// TestCachedWriteback checks the cached mount, which uses the kernel's
// writeback cache, against the client library as a second client:
// close-to-open both ways, with sizes that change, and overwrites of part
// of a page through write-only opens (the kernel reads the rest of the
// page through the handle the write came through).
func TestCachedWriteback(t *testing.T) {
	requireFUSE(t)
	addr := startCluster(t)
	mnt := mountAt(t, addr, AccessCached, 0, 0)
	lib := dialLib(t, addr, 0, 0)

	t.Run("close-to-open", func(t *testing.T) {
		p := filepath.Join(mnt, "small-writes")
		want := pattern(3<<20+100, 1) // not a whole number of pages
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(want); off += 4096 {
			if _, err := f.Write(want[off:min(off+4096, len(want))]); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		sameBytes(t, "library read after close", libRead(t, lib, "/small-writes"), want)

		// The library changes the file, in place and in size; the mount
		// must see each version after a reopen, not its page cache.
		for i, n := range []int{len(want), 5<<20 + 1, 64<<10 + 3, 2 << 20} {
			next := pattern(n, byte(10+i))
			libWrite(t, lib, "/small-writes", next, 0o644)
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			sameBytes(t, fmt.Sprintf("version %d read through the mount", i), got, next)
		}
	})

	t.Run("removed-while-open", func(t *testing.T) {
		// The kernel passes on the mtime of the buffered writes at
		// close, for a file that no longer has a name.
		p := filepath.Join(mnt, "removed")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		want := pattern(64<<10, 5)
		if _, err := f.Write(want[:32<<10]); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(want[32<<10:]); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync of a removed file: %v", err)
		}
		got := make([]byte, len(want))
		if _, err := f.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		sameBytes(t, "read back through the descriptor", got, want)
		if err := f.Close(); err != nil {
			t.Fatalf("close of a removed file: %v", err)
		}
	})

	// partialOverwrite writes a few bytes in the middle of a page of an
	// existing file (created by owner through the library) through an
	// O_WRONLY open of the mount and checks the whole file through the
	// library.
	partialOverwrite := func(t *testing.T, mnt, path string, owner *client.Client, perm uint32) {
		orig := pattern(5*4096+123, 3)
		libWrite(t, owner, path, orig, perm)
		f, err := os.OpenFile(filepath.Join(mnt, path), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		patch := []byte("overwritten in the middle of page two")
		const off = 4096 + 1000
		if _, err := f.WriteAt(patch, off); err != nil {
			t.Fatalf("partial-page write: %v", err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		want := append([]byte(nil), orig...)
		copy(want[off:], patch)
		sameBytes(t, "library read after partial-page write", libRead(t, lib, path), want)
	}
	t.Run("wronly-partial-page", func(t *testing.T) {
		partialOverwrite(t, mnt, "/rmw", lib, 0o644)
	})
	t.Run("write-only-user", func(t *testing.T) {
		// The mount's identity may write the file but not read it: the
		// mount cannot widen the open to read-write and must fall back
		// to write-only without damaging the rest of the page. (NFS
		// credentials are the mount's, so this needs no local root.)
		const uid, gid = 4321, 4321
		if err := lib.Mkdir(context.Background(), "/wo", 0o777); err != nil {
			t.Fatal(err)
		}
		m := mountAt(t, addr, AccessCached, uid, gid)
		partialOverwrite(t, m, "/wo/file", dialLib(t, addr, uid, gid), 0o200)
	})
}
