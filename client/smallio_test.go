package client_test

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/shoalfs/shoal/client"
)

// TestSmallIOThresholdDefault: with the default policy a small file
// written and read through the library goes through the metadata server
// and never costs a layout, while a 4 MiB write and read still go to the
// data servers. It fails if the default threshold were 0 (every request
// through the data servers) or above 4 MiB.
func TestSmallIOThresholdDefault(t *testing.T) {
	if d := client.DefaultPolicy().SmallIOThreshold; d <= 4<<10 || d != client.DefaultSmallIOThreshold {
		t.Fatalf("DefaultPolicy().SmallIOThreshold = %d, want DefaultSmallIOThreshold (%d) > 4 KiB", d, client.DefaultSmallIOThreshold)
	}
	addr := startCluster(t, 2).MDS.Addr.String()
	for _, tt := range []struct {
		name   string
		policy client.Policy
		size   int
		// wantDS: the I/O goes to the data servers with a layout.
		wantDS bool
	}{
		{name: "default 1 B", size: 1},
		{name: "default 4 KiB", size: 4 << 10},
		{name: "default just below", size: client.DefaultSmallIOThreshold - 1},
		{name: "default at threshold", size: client.DefaultSmallIOThreshold, wantDS: true},
		{name: "default 4 MiB", size: 4 << 20, wantDS: true},
		{name: "never 4 KiB", policy: client.Policy{SmallIOThreshold: -1}, size: 4 << 10, wantDS: true},
		{name: "explicit 8K 4 KiB", policy: client.Policy{SmallIOThreshold: 8 << 10}, size: 4 << 10},
		{name: "explicit 8K 16 KiB", policy: client.Policy{SmallIOThreshold: 8 << 10}, size: 16 << 10, wantDS: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			// A Client of its own, so its counters are this case's alone.
			c := dialT(t, addr, client.Options{Policy: tt.policy})
			path := fmt.Sprintf("/smallio-%d-%d", tt.size, tt.policy.SmallIOThreshold)
			want := bytes.Repeat([]byte{byte(tt.size)}, tt.size)
			want[0], want[len(want)-1] = 'a', 'z'
			f, err := c.Open(ctx, path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(want, 0); err != nil {
				t.Fatalf("write: %v", err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("close after write: %v", err)
			}
			f, err = c.Open(ctx, path, os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, tt.size)
			if n, err := f.ReadAt(got, 0); n != tt.size {
				t.Fatalf("read %d of %d bytes: %v", n, tt.size, err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("close after read: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("read back other bytes than written")
			}
			st := c.Stats()
			total := uint64(2 * tt.size)
			if tt.wantDS {
				if st.LayoutGets == 0 || st.DSWriteBytes != uint64(tt.size) || st.DSReadBytes != uint64(tt.size) || st.MDSIOBytes != 0 {
					t.Errorf("stats %+v: want the %d bytes written and read via the data servers with a layout", st, tt.size)
				}
			} else if st.LayoutGets != 0 || st.LayoutReturns != 0 || st.DSWriteBytes+st.DSReadBytes != 0 || st.MDSIOBytes != total {
				t.Errorf("stats %+v: want no layout and all %d bytes through the MDS", st, total)
			}
			// Whatever path wrote it, another Client reading through the
			// other path sees the same bytes.
			other := client.Policy{SmallIOThreshold: 1 << 30}
			if !tt.wantDS {
				other.SmallIOThreshold = -1
			}
			c2 := dialT(t, addr, client.Options{Policy: other})
			g, err := c2.Open(ctx, path, os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			clear(got)
			if n, err := g.ReadAt(got, 0); n != tt.size || !bytes.Equal(got, want) {
				t.Fatalf("other path: read %d of %d bytes (%v), equal %v", n, tt.size, err, bytes.Equal(got, want))
			}
		})
	}
}

// TestSmallIOTail: a request below the threshold that continues a large
// one of the same File is the tail of the application's request (the
// kernel cuts an unaligned 1 MiB buffer into 1 MiB - 16 B and 16 B) and
// goes to the data servers like it, while a small request elsewhere still
// goes through the MDS.
func TestSmallIOTail(t *testing.T) {
	addr := startCluster(t, 2).MDS.Addr.String()
	ctx := t.Context()
	c := dialT(t, addr, client.Options{Policy: client.Policy{Access: client.AccessDirect}})
	const piece = 1<<20 - 16
	want := bytes.Repeat([]byte("0123456789abcdef"), 2<<20/16)
	f, err := c.Open(ctx, "/tail", os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for off := 0; off < len(want); off += 1 << 20 {
		for _, p := range [][2]int{{off, off + piece}, {off + piece, off + 1<<20}} {
			if _, err := f.WriteAt(want[p[0]:p[1]], int64(p[0])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := c.Stats(); st.MDSIOBytes != 0 || st.DSWriteBytes != uint64(len(want)) {
		t.Errorf("after the writes: %+v; want all %d bytes to the data servers, none through the MDS", st, len(want))
	}
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 1 << 20 {
		for _, p := range [][2]int{{off, off + piece}, {off + piece, off + 1<<20}} {
			if n, err := f.ReadAt(got[p[0]:p[1]], int64(p[0])); n != p[1]-p[0] {
				t.Fatalf("read at %d: %d bytes, %v", p[0], n, err)
			}
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read back other bytes than written")
	}
	if st := c.Stats(); st.MDSIOBytes != 0 || st.DSReadBytes != uint64(len(want)) {
		t.Errorf("after the reads: %+v; want all %d bytes from the data servers", st, len(want))
	}
	// A small write that continues nothing goes through the MDS.
	if _, err := f.WriteAt([]byte("small"), 100); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.MDSIOBytes != 5 {
		t.Errorf("a lone small write: MDSIOBytes = %d, want 5", st.MDSIOBytes)
	}
}
