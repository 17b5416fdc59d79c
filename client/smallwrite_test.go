package client_test

import (
	"bytes"
	"io"
	"os"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// TestWriteAtSyncSetAttr: a small write with an attribute change is one
// COMPOUND at the MDS, one fdatasync of its metadata log, and leaves the
// data and the attribute at the server; a change the server refuses
// leaves the data written and says so apart from the write.
func TestWriteAtSyncSetAttr(t *testing.T) {
	cl := startCluster(t, 2)
	mds := cl.MDS.Server
	addr := cl.MDS.Addr.String()
	ctx := t.Context()
	c := dialT(t, addr, client.Options{Policy: client.Policy{Access: client.AccessDirect}})
	data := bytes.Repeat([]byte("s"), 4096)
	mtime := time.Unix(1_600_000_000, 5)

	f, err := c.Open(ctx, "/one", os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	before := mds.Stats()
	n, a, aok, setErr, err := f.WriteAtSyncSetAttr(ctx, data, 0, client.SetAttr{Mtime: &mtime})
	after := mds.Stats()
	if err != nil || setErr != nil || n != len(data) || !aok {
		t.Fatalf("WriteAtSyncSetAttr: n %d, attrs %v, setattr %v, write %v", n, aok, setErr, err)
	}
	if !a.Mtime.Equal(mtime) || a.Size != uint64(len(data)) {
		t.Errorf("attributes after: mtime %v size %d; want %v and %d", a.Mtime, a.Size, mtime, len(data))
	}
	if d := after.Ops["SEQUENCE"] - before.Ops["SEQUENCE"]; d != 1 {
		t.Errorf("%d COMPOUNDs, want 1", d)
	}
	if d := after.Log.Syncs - before.Log.Syncs; after.Log.Syncs > 0 && d != 1 {
		t.Errorf("%d fdatasyncs of the metadata log, want 1", d)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	checkFile := func(name string, want []byte, wantMtime *time.Time) {
		t.Helper()
		g, err := c.Open(ctx, name, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		got, err := io.ReadAll(io.NewSectionReader(g, 0, 1<<20))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s holds %d bytes (%v), want the %d written", name, len(got), err, len(want))
		}
		st, err := c.Stat(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if wantMtime != nil && !st.Mtime.Equal(*wantMtime) {
			t.Errorf("%s: mtime %v, want %v", name, st.Mtime, *wantMtime)
		}
	}
	checkFile("/one", data, &mtime)

	// Refused: only the owner may set times, so another user who may
	// write the file gets its data written and the SETATTR's error.
	mode := uint32(0o666)
	if err := c.SetAttr(ctx, "/one", client.SetAttr{Mode: &mode}); err != nil {
		t.Fatal(err)
	}
	other := dialT(t, addr, client.Options{UID: 4242, GID: 4242, Policy: client.Policy{Access: client.AccessDirect}})
	g, err := other.Open(ctx, "/one", os.O_RDWR|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	later := time.Unix(1_700_000_000, 0)
	n, _, aok, setErr, err = g.WriteAtSyncSetAttr(ctx, data[:100], 0, client.SetAttr{Mtime: &later})
	if err != nil || n != 100 || setErr == nil || !aok {
		t.Errorf("refused mtime: n %d, attrs %v, setattr error %v, write error %v; want the data written and the SETATTR's error", n, aok, setErr, err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	checkFile("/one", data[:100], nil)
}
