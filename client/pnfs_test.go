package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/client/clienttest"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// startCluster runs a metadata server and n data servers in-process on
// loopback ports.
func startCluster(tb testing.TB, n int) *wiring.Cluster {
	tb.Helper()
	noSquash := false
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := wiring.Start(ctx, wiring.Config{
		Dir: tb.TempDir(), DataServers: n, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
		Lease:   10 * time.Second,
		Logger:  quietLogger(),
	})
	if err != nil {
		tb.Fatalf("wiring.Start: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// TestPNFSSuite runs the conformance suite against a four-data-server
// cluster with pNFS on, so every read and write of the suite goes through
// layouts and data servers.
func TestPNFSSuite(t *testing.T) {
	c := startCluster(t, 4)
	clienttest.Run(t, dialer(c.MDS.Addr.String(), client.Options{}))
}

// pattern fills b with bytes that depend on their file offset.
func pattern(b []byte, off int64) {
	for i := range b {
		x := uint64(off) + uint64(i)
		b[i] = byte(x ^ x>>8 ^ x>>16 ^ x>>24)
	}
}

type ioBytes struct{ read, write uint64 }

func serverBytes(s *server.Server) ioBytes {
	st := s.Stats()
	return ioBytes{st.ReadBytes, st.WriteBytes}
}

// TestPNFSByteAccounting writes and reads back 64 MiB against four data
// servers. With pNFS on, each data server carries about a quarter of the
// bytes and the MDS none; with pNFS off the MDS carries them all (and
// forwards them to the data servers over the control protocol, which the
// data servers' NFS counters do not see).
func TestPNFSByteAccounting(t *testing.T) {
	const size = 64 << 20
	for _, tc := range []struct {
		name string
		off  bool
	}{{"pnfs", false}, {"mds-only", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, 4)
			c := dialer(cl.MDS.Addr.String(), client.Options{PNFSOff: tc.off})(t)
			defer c.Close()
			ctx := t.Context()
			want := make([]byte, size)
			pattern(want, 0)
			f, err := c.Open(ctx, "/big", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := f.WriteAt(want, 0); n != size || err != nil {
				t.Fatalf("WriteAt = %d, %v", n, err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if a, err := c.Stat(ctx, "/big"); err != nil || a.Size != size {
				t.Fatalf("Stat = %+v, %v; want size %d", a, err, size)
			}
			f, err = c.Open(ctx, "/big", os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size+4096)
			n, err := f.ReadAt(got, 0)
			if n != size || err != io.EOF {
				t.Fatalf("ReadAt = %d, %v; want %d, EOF", n, err, size)
			}
			if !bytes.Equal(got[:n], want) {
				t.Fatal("read back different data")
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			mds := serverBytes(cl.MDS.Server)
			var ds []ioBytes
			for _, d := range cl.DS {
				ds = append(ds, serverBytes(d.Server))
			}
			t.Logf("MDS %+v, data servers %+v, client %+v", mds, ds, c.Stats())
			if tc.off {
				if mds.read != size || mds.write != size {
					t.Errorf("MDS carried %+v, want %d each way", mds, size)
				}
				for i, d := range ds {
					if d.read != 0 || d.write != 0 {
						t.Errorf("data server %d carried %+v with pNFS off", i, d)
					}
				}
				return
			}
			if mds.read != 0 || mds.write != 0 {
				t.Errorf("MDS carried %+v with pNFS on, want 0", mds)
			}
			quarter := float64(size) / 4
			for i, d := range ds {
				for _, v := range []uint64{d.read, d.write} {
					if r := float64(v) / quarter; r < 0.85 || r > 1.15 {
						t.Errorf("data server %d carried %+v, want about %.0f each way", i, d, quarter)
					}
				}
			}
		})
	}
}

// TestPNFSUnalignedIO writes and reads ranges that straddle stripe units
// and the end of the file, through one client, and checks them through a
// second client that uses the MDS only.
func TestPNFSUnalignedIO(t *testing.T) {
	cl := startCluster(t, 3)
	addr := cl.MDS.Addr.String()
	c := dialer(addr, client.Options{})(t)
	defer c.Close()
	plain := dialer(addr, client.Options{PNFSOff: true})(t)
	defer plain.Close()
	ctx := t.Context()
	const unit = wiring.DefaultStripeUnit
	cases := []struct{ off, n int64 }{
		{0, 1}, {unit - 7, 14}, {3*unit - 1, 2*unit + 2}, {5 * unit, unit}, {7*unit + 123, 4567},
	}
	f, err := c.Open(ctx, "/unaligned", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var end int64
	for _, tc := range cases {
		b := make([]byte, tc.n)
		pattern(b, tc.off)
		if n, err := f.WriteAt(b, tc.off); n != len(b) || err != nil {
			t.Fatalf("WriteAt(%d,+%d) = %d, %v", tc.off, tc.n, n, err)
		}
		end = max(end, tc.off+tc.n)
	}
	// Read back through the same File before Sync: size known locally.
	for _, tc := range cases {
		b := make([]byte, tc.n)
		if n, err := f.ReadAt(b, tc.off); n != len(b) || (err != nil && err != io.EOF) {
			t.Fatalf("ReadAt(%d,+%d) = %d, %v", tc.off, tc.n, n, err)
		}
		w := make([]byte, tc.n)
		pattern(w, tc.off)
		if !bytes.Equal(b, w) {
			t.Fatalf("ReadAt(%d,+%d): wrong data", tc.off, tc.n)
		}
	}
	// A read across EOF is short; holes read as zeros.
	b := make([]byte, 2*unit)
	n, err := f.ReadAt(b, end-unit)
	if n != unit || err != io.EOF {
		t.Fatalf("ReadAt across EOF = %d, %v; want %d, EOF", n, err, unit)
	}
	if n, err := f.ReadAt(b[:10], end+5); n != 0 || err != io.EOF {
		t.Fatalf("ReadAt past EOF = %d, %v", n, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	g, err := plain.Open(ctx, "/unaligned", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	all := make([]byte, end+10)
	n, err = g.ReadAt(all, 0)
	if int64(n) != end || err != io.EOF {
		t.Fatalf("MDS ReadAt = %d, %v; want %d", n, err, end)
	}
	want := make([]byte, end)
	for _, tc := range cases {
		pattern(want[tc.off:tc.off+tc.n], tc.off)
	}
	if !bytes.Equal(all[:n], want) {
		t.Fatal("MDS sees different data than was written through the data servers")
	}
	if st := c.Stats(); st.DSWriteBytes == 0 || st.LayoutGets == 0 {
		t.Errorf("pNFS was not used: %+v", st)
	}
}

// TestPNFSRecall has a second client truncate a file the first one holds
// a layout for: the MDS recalls the layout, the first client commits and
// returns it, the truncate proceeds, and the first client's next I/O gets
// a new layout.
func TestPNFSRecall(t *testing.T) {
	cl := startCluster(t, 2)
	addr := cl.MDS.Addr.String()
	c1 := dialer(addr, client.Options{})(t)
	defer c1.Close()
	c2 := dialer(addr, client.Options{})(t)
	defer c2.Close()
	ctx := t.Context()
	f, err := c1.Open(ctx, "/recalled", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 3<<20)
	pattern(b, 0)
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	g, err := c2.Open(ctx, "/recalled", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Truncate(ctx, 1<<20); err != nil {
		t.Fatalf("truncate by the second client: %v", err)
	}
	if st := c1.Stats(); st.LayoutRecalls == 0 {
		t.Fatalf("no recall: %+v", st)
	}
	got := make([]byte, 3<<20)
	n, err := f.ReadAt(got, 0)
	if n != 1<<20 || err != io.EOF {
		t.Fatalf("ReadAt after truncate = %d, %v; want %d, EOF", n, err, 1<<20)
	}
	if !bytes.Equal(got[:n], b[:n]) {
		t.Fatal("wrong data after truncate")
	}
	// The first client writes on, through a new layout (or the MDS while
	// the server still refuses one): either way the data must land.
	if _, err := f.WriteAt(b[:2<<20], 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if st := c1.Stats(); st.LayoutReturns == 0 {
		t.Fatalf("recalled layout not returned: %+v", st)
	}
	n, err = g.ReadAt(got, 0)
	if n != 3<<20 || !bytes.Equal(got[1<<20:n], b[:2<<20]) {
		t.Fatalf("second client reads %d, %v after the first wrote on", n, err)
	}
}

func TestPNFSOptions(t *testing.T) {
	cl := startCluster(t, 2)
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("PNFSOff=%v", off), func(t *testing.T) {
			c := dialer(cl.MDS.Addr.String(), client.Options{PNFSOff: off, MaxPerDS: 2})(t)
			defer c.Close()
			f, err := c.Open(t.Context(), fmt.Sprintf("/opt-%v", off), os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 5<<20)
			if _, err := f.WriteAt(b, 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			st := c.Stats()
			if off != (st.DSWriteBytes == 0) || off != (st.MDSIOBytes == 5<<20) {
				t.Errorf("PNFSOff=%v: stats %+v", off, st)
			}
		})
	}
}

// TestPNFSRemoveWhileOpen removes a file that another client is writing
// through a layout. The server keeps an open file's data until its last
// close (an orphan, server/orphans.go), so the layout stays valid: no
// recall, and the writer goes on through the data servers and closes
// without an error.
func TestPNFSRemoveWhileOpen(t *testing.T) {
	cl := startCluster(t, 2)
	addr := cl.MDS.Addr.String()
	c1 := dialer(addr, client.Options{})(t)
	defer c1.Close()
	c2 := dialer(addr, client.Options{})(t)
	defer c2.Close()
	ctx := t.Context()
	f, err := c1.Open(ctx, "/doomed", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2<<20)
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := c2.Remove(ctx, "/doomed"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, 2<<20); err != nil {
		t.Errorf("write after remove: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close after remove: %v", err)
	}
	if st := c1.Stats(); st.LayoutRecalls != 0 || st.DSWriteBytes != 4<<20 {
		t.Errorf("remove of an open file recalled its layout, or writes left the data servers: %+v", st)
	}
}
