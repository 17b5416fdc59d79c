package nfs3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/ganeshatest"
	"github.com/shoalfs/shoal/internal/nfs3"
)

// startGanesha runs one Ganesha NFSv3 server in a namespace of its own
// and returns a uid-0 client of its export and the export's root handle.
func startGanesha(t *testing.T) (*ganeshatest.Server, *nfs3.Client, []byte, nfs3.Options) {
	t.Helper()
	if why := ganeshatest.Available(); why != "" {
		t.Skip("ganesha: " + why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns, err := ganeshatest.NewNetns(ctx, fmt.Sprintf("shoal-n3-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	srv, err := ganeshatest.Start(ctx, ns, t.TempDir(), 20490)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	opts := nfs3.Options{Dial: ns.Dial}
	root, err := nfs3.Mount(ctx, srv.MountAddr(), srv.Path, opts)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nfs3.Dial(ctx, srv.Addr(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c, root, opts
}

func u32(v uint32) *uint32 { return &v }
func u64(v uint64) *uint64 { return &v }

// TestGanesha drives every procedure of the client against a real
// NFS-Ganesha, checks the bytes in the exported directory on the host,
// and checks that Ganesha enforces the AUTH_SYS owner and mode the way
// flexfiles fencing relies on.
func TestGanesha(t *testing.T) {
	srv, c, root, opts := startGanesha(t)
	ctx := context.Background()

	if err := c.Null(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := nfs3.Mount(ctx, srv.MountAddr(), "/no/such/export", opts); nfs3.Status(err) == nfs3.NFS3_OK || nfs3.Status(err) == nfs3.NFS3ERR_IO {
		t.Errorf("MNT of a path not exported: %v, want a MOUNT status", err)
	}

	fh, err := c.Create(ctx, root, "f1", true, nfs3.Attrs{Mode: u32(0o640), UID: u32(1000), GID: u32(2000)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, root, "f1", true, nfs3.Attrs{}); nfs3.Status(err) != nfs3.NFS3ERR_EXIST {
		t.Fatalf("GUARDED CREATE of an existing file: %v, want NFS3ERR_EXIST", err)
	}
	fh2, err := c.Create(ctx, root, "f1", false, nfs3.Attrs{})
	if err != nil || !bytes.Equal(fh, fh2) {
		t.Fatalf("UNCHECKED CREATE of an existing file: %x, %v; want %x", fh2, err, fh)
	}
	if got, err := c.Lookup(ctx, root, "f1"); err != nil || !bytes.Equal(got, fh) {
		t.Fatalf("LOOKUP: %x, %v; want %x", got, err, fh)
	}
	a, err := c.Getattr(ctx, fh)
	if err != nil {
		t.Fatal(err)
	}
	if a.Type != nfs3.NF3REG || a.Mode&0o7777 != 0o640 || a.Uid != 1000 || a.Gid != 2000 || a.Size != 0 {
		t.Fatalf("attributes after CREATE: %+v", a)
	}

	data := make([]byte, 200<<10)
	rand.Read(data)
	var verf nfs3.Writeverf3
	for i, stable := range []nfs3.StableHow{nfs3.UNSTABLE, nfs3.DATA_SYNC, nfs3.FILE_SYNC} {
		chunk := data[i*len(data)/3 : (i+1)*len(data)/3]
		res, err := c.Write(ctx, fh, uint64(i*len(data)/3), chunk, stable)
		if err != nil {
			t.Fatalf("WRITE %v: %v", stable, err)
		}
		if res.Count != uint32(len(chunk)) || res.Committed < stable {
			t.Fatalf("WRITE %v: %+v", stable, res)
		}
		if i == 0 {
			verf = res.Verf
		}
	}
	if v, err := c.Commit(ctx, fh, 0, 0); err != nil || v != verf {
		t.Fatalf("COMMIT: %x, %v; want verifier %x", v, err, verf)
	}
	var got []byte
	for off := uint64(0); ; {
		b, eof, err := c.Read(ctx, fh, off, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
		off += uint64(len(b))
		if eof || len(b) == 0 || len(got) > len(data) {
			break
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("READ back %d bytes, not the %d written", len(got), len(data))
	}
	onDisk, err := os.ReadFile(filepath.Join(srv.Export, "f1"))
	if err != nil || !bytes.Equal(onDisk, data) {
		t.Fatalf("export file: %d bytes, %v; want the %d written", len(onDisk), err, len(data))
	}

	if err := c.Setattr(ctx, fh, nfs3.Attrs{Size: u64(1000)}); err != nil {
		t.Fatal(err)
	}
	if a, err := c.Getattr(ctx, fh); err != nil || a.Size != 1000 {
		t.Fatalf("size after SETATTR: %d, %v", a.Size, err)
	}

	// The owner (mode 0640) writes; its group reads but does not write;
	// anyone else does neither. After the owner changes (fencing), the old
	// owner is refused.
	owner, group, other := c.As(1000, 3000), c.As(1001, 2000), c.As(1002, 3002)
	checks := []struct {
		name  string
		c     *nfs3.Client
		write bool
		want  []nfs3.Nfsstat3
	}{
		{"owner writes", owner, true, []nfs3.Nfsstat3{nfs3.NFS3_OK}},
		{"owner reads", owner, false, []nfs3.Nfsstat3{nfs3.NFS3_OK}},
		{"group reads", group, false, []nfs3.Nfsstat3{nfs3.NFS3_OK}},
		{"group cannot write", group, true, []nfs3.Nfsstat3{nfs3.NFS3ERR_ACCES, nfs3.NFS3ERR_PERM}},
		{"other cannot read", other, false, []nfs3.Nfsstat3{nfs3.NFS3ERR_ACCES, nfs3.NFS3ERR_PERM}},
		{"other cannot write", other, true, []nfs3.Nfsstat3{nfs3.NFS3ERR_ACCES, nfs3.NFS3ERR_PERM}},
	}
	io := func(c *nfs3.Client, write bool) error {
		if write {
			_, err := c.Write(ctx, fh, 0, []byte("x"), nfs3.FILE_SYNC)
			return err
		}
		_, _, err := c.Read(ctx, fh, 0, 1)
		return err
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			if s := nfs3.Status(io(tc.c, tc.write)); !contains(tc.want, s) {
				t.Errorf("status %v, want one of %v", s, tc.want)
			}
		})
	}
	if err := c.Setattr(ctx, fh, nfs3.Attrs{UID: u32(1100)}); err != nil {
		t.Fatal(err)
	}
	t.Run("fenced owner cannot write", func(t *testing.T) {
		if s := nfs3.Status(io(owner, true)); s != nfs3.NFS3ERR_ACCES && s != nfs3.NFS3ERR_PERM {
			t.Errorf("old owner's WRITE after the owner changed: %v", s)
		}
		if err := io(c.As(1100, 2000), true); err != nil {
			t.Errorf("new owner's WRITE: %v", err)
		}
	})

	if err := c.Remove(ctx, root, "f1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(ctx, root, "f1"); nfs3.Status(err) != nfs3.NFS3ERR_NOENT {
		t.Fatalf("LOOKUP after REMOVE: %v", err)
	}
	if _, err := c.Getattr(ctx, fh); nfs3.Status(err) != nfs3.NFS3ERR_STALE {
		t.Fatalf("GETATTR of a removed file: %v, want NFS3ERR_STALE", err)
	}
}

func contains(l []nfs3.Nfsstat3, s nfs3.Nfsstat3) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
