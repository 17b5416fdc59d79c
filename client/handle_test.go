package client_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"

	"github.com/shoalfs/shoal/client"
)

// TestHandleCalls: the calls by file handle do what the path calls do,
// the creating ones return the new object's handle and attributes, a
// handle of a removed object is stale (and never answers for the object
// now at its path), and a create cut off by a broken connection runs
// once.
func TestHandleCalls(t *testing.T) {
	addr := startCluster(t, 1).MDS.Addr.String()
	c := dialT(t, addr, client.Options{})
	ctx := t.Context()
	root, _, err := c.Lookup(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	dir, da, err := c.MkdirAt(ctx, root, "h", 0o755)
	if err != nil || !da.IsDir() {
		t.Fatalf("MkdirAt: %v %+v", err, da)
	}
	f, err := c.OpenAt(ctx, dir, "f", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fa := f.OpenAttr()
	if fa.Type != client.TypeRegular || fa.Mode != 0o600 || fa.Fileid == 0 {
		t.Fatalf("OpenAttr after create: %+v", fa)
	}
	if _, err := f.WriteAtSync(ctx, []byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	fh, a, err := c.LookupAt(ctx, dir, "f")
	if err != nil || a.Fileid != fa.Fileid || a.Size != 5 {
		t.Fatalf("LookupAt: %+v %v", a, err)
	}
	m := uint32(0o640)
	if a, err := c.SetAttrHandle(ctx, fh, client.SetAttr{Mode: &m}); err != nil || a.Mode != 0o640 {
		t.Fatalf("SetAttrHandle: %+v %v", a, err)
	}
	ents, err := c.ReadDirHandle(ctx, dir)
	if err != nil || len(ents) != 1 || ents[0].Name != "f" || ents[0].Attr.Fileid != fa.Fileid || string(ents[0].Handle) != string(fh) {
		t.Fatalf("ReadDirHandle: %+v %v", ents, err)
	}
	if err := c.RemoveAt(ctx, dir, "f"); err != nil {
		t.Fatal(err)
	}
	// Another object under the same name: the old handle is stale.
	if _, _, err := c.MkdirAt(ctx, dir, "f", 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StatHandle(ctx, fh); !client.IsStale(err) {
		t.Fatalf("StatHandle of a removed file: %v, want a stale handle", err)
	}
	if _, _, err := c.LookupAt(ctx, dir, "missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("LookupAt of a missing name: %v", err)
	}

	// Creates whose connection breaks under them run exactly once.
	for i := range 20 {
		cut := make(chan struct{})
		go func() { defer close(cut); c.TestingCloseConn() }()
		if _, _, err := c.MkdirAt(ctx, dir, fmt.Sprintf("d%d", i), 0o755); err != nil {
			t.Fatalf("MkdirAt %d across a reconnect: %v", i, err)
		}
		<-cut
		cut = make(chan struct{})
		go func() { defer close(cut); c.TestingCloseConn() }()
		g, err := c.OpenAt(ctx, dir, fmt.Sprintf("g%d", i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatalf("exclusive OpenAt %d across a reconnect: %v", i, err)
		}
		<-cut
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
