package fusemount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// TestEntryCache: names and attributes the kernel forgot (as after
// drop_caches or memory pressure; here the mount tells the kernel to
// drop each name) are answered by the mount's own cache without a
// COMPOUND while they are young enough, a run of lookups the cache
// cannot answer reads the directory once instead of a LOOKUP per name,
// the mount's own changes show at once, and another client's removal
// within AttrTimeout.
func TestEntryCache(t *testing.T) {
	requireFUSE(t)
	cl := startClusterN(t, 1)
	mds := cl.MDS.Server
	addr := cl.MDS.Addr.String()
	lib := dialLib(t, addr, 0, 0)
	ctx := context.Background()

	const ttl = time.Second
	dir := t.TempDir()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := New(mctx, dir, Config{Addr: addr, Access: AccessCached, AttrTimeout: ttl, Logger: quietLogger(),
		Client: client.Options{DialTimeout: 10 * time.Second}})
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			Unmount(dir, true)
		}
	})

	const files = 60
	sub := filepath.Join(dir, "cold")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("c"), 3000)
	name := func(i int) string { return fmt.Sprintf("f%d", i) }
	created := mds.Stats().Ops
	for i := range files {
		if err := os.WriteFile(filepath.Join(sub, name(i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// forget makes the kernel drop every name of the directory. It
	// reports 1 if the kernel had forgotten the directory itself (and
	// its names with it): its next path walk looks the directory up too.
	forget := func() (dirLookups uint64) {
		t.Helper()
		d := m.root.GetChild("cold")
		if d == nil {
			return 1
		}
		for i := range files {
			if errno := d.NotifyEntry(name(i)); errno != 0 && errno != syscall.ENOENT {
				t.Fatalf("NotifyEntry: %v", errno)
			}
		}
		return 0
	}
	statAll := func(phase string) map[string]uint64 {
		t.Helper()
		before := mds.Stats().Ops
		for i := range files {
			fi, err := os.Stat(filepath.Join(sub, name(i)))
			if err != nil {
				t.Fatalf("%s: %v", phase, err)
			}
			if fi.Size() != int64(len(data)) || fi.Mode().Perm() != 0o644 && i != 0 {
				t.Fatalf("%s: %s has size %d, mode %v", phase, name(i), fi.Size(), fi.Mode())
			}
		}
		d := opsDelta(mds, before)
		t.Logf("%s: ops %v", phase, d)
		return d
	}

	// Just written: everything is young, no COMPOUND.
	settle(t, mds, created, files)
	forget()
	if d := statAll("young"); d["SEQUENCE"] != 0 {
		t.Errorf("stat of %d forgotten names with young attributes: %d COMPOUNDs, want 0", files, d["SEQUENCE"])
	}

	// Attributes expired: a few LOOKUPs, then one listing answers the rest.
	time.Sleep(ttl + 100*time.Millisecond)
	extra := forget()
	if d := statAll("expired"); d["LOOKUP"] > readdirAfter+extra || d["READDIR"] == 0 || d["SEQUENCE"] > readdirAfter+3+extra {
		t.Errorf("stat of %d forgotten names with old attributes: %d LOOKUPs, %d READDIRs, %d COMPOUNDs; want at most %d LOOKUPs and the listing",
			files, d["LOOKUP"], d["READDIR"], d["SEQUENCE"], readdirAfter)
	}

	// A listing (ls -l) fills the cache too.
	time.Sleep(ttl + 100*time.Millisecond)
	if _, err := os.ReadDir(sub); err != nil {
		t.Fatal(err)
	}
	forget()
	if d := statAll("after a listing"); d["SEQUENCE"] != 0 {
		t.Errorf("stat of %d forgotten names after listing their directory: %d COMPOUNDs, want 0", files, d["SEQUENCE"])
	}

	// The mount's own change shows at once, from the cache too.
	p0 := filepath.Join(sub, name(0))
	if err := os.Chmod(p0, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, name(1)), []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	forget()
	if fi, err := os.Stat(p0); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("after chmod through the mount: %v, %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(sub, name(1))); err != nil || fi.Size() != 5 {
		t.Errorf("after rewriting through the mount: %v, %v", fi, err)
	}
	if err := os.Remove(filepath.Join(sub, name(2))); err != nil {
		t.Fatal(err)
	}
	forget()
	if _, err := os.Stat(filepath.Join(sub, name(2))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after removing through the mount: stat says %v", err)
	}

	// Another client's removal shows once AttrTimeout has passed.
	if err := lib.Remove(ctx, "/cold/"+name(3)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	forget()
	if _, err := os.Stat(filepath.Join(sub, name(3))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%v after another client removed it: stat says %v", ttl, err)
	}
}
