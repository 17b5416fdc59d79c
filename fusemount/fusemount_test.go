package fusemount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/nfs4"
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
		return &fs.PathError{Op: "open", Path: "/x", Err: &client.StatusError{Op: "OPEN", NFSStatus: s}}
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
