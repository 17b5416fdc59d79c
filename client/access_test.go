package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/client/clienttest"
)

var accessMethods = []client.Access{client.AccessCached, client.AccessODirect, client.AccessDirect}

// TestAccessSuite runs the conformance suite with the cached and odirect
// methods against a two-data-server cluster (direct runs in TestPNFSSuite
// and TestShoal), with a small block and cache so that gathering, write-back
// and eviction all happen.
func TestAccessSuite(t *testing.T) {
	cl := startCluster(t, 2)
	for _, a := range []client.Access{client.AccessCached, client.AccessODirect} {
		t.Run(a.String(), func(t *testing.T) {
			clienttest.Run(t, dialer(cl.MDS.Addr.String(), client.Options{Policy: client.Policy{
				Access: a, BlockSize: 256 << 10, CacheSize: 1 << 20,
			}}))
		})
	}
}

func dialT(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	c := dialer(addr, opts)(t)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestAccessModel applies random mixed small and large writes, overlapping
// writes, reads, truncates and syncs through two Files of one Client
// (sharing the file) and checks every read against an in-memory model.
// The cache is small (four 64 KiB blocks), so eviction and write-back under
// pressure happen all the time.
func TestAccessModel(t *testing.T) {
	cl := startCluster(t, 2)
	plain := startShoal(t)
	servers := []struct{ name, addr string }{{"pnfs", cl.MDS.Addr.String()}, {"mds", plain}}
	for _, srv := range servers {
		for _, a := range accessMethods {
			others := []client.Access{a, client.AccessDirect}
			if a == client.AccessDirect {
				others = others[:1]
			}
			for _, other := range others {
				t.Run(fmt.Sprintf("%s/%s+%s", srv.name, a, other), func(t *testing.T) {
					testModel(t, srv.addr, a, other, 0, 1)
				})
			}
		}
	}
}

// TestAccessModelBackground runs the cached method's model test with
// several background write-backs (and readaheads) in flight at once, so
// that they overlap in time with each other and with the application's
// reads, writes and Stats. With four of them it caught Stat reporting the
// size of a GETATTR answered before a write-back that ended meanwhile
// (see dataCache.statSize).
func TestAccessModelBackground(t *testing.T) {
	cl := startCluster(t, 2)
	plain := startShoal(t)
	servers := []struct{ name, addr string }{{"pnfs", cl.MDS.Addr.String()}, {"mds", plain}}
	for _, srv := range servers {
		for _, other := range []client.Access{client.AccessCached, client.AccessDirect} {
			for seed := range uint64(2) {
				t.Run(fmt.Sprintf("%s/cached+%s/seed=%d", srv.name, other, seed+2), func(t *testing.T) {
					testModel(t, srv.addr, client.AccessCached, other, 4, seed+2)
				})
			}
		}
	}
}

// testModel runs the model test with the operations drawn from seed;
// background, when not zero, sets the Client's number of background
// write-back slots.
func testModel(t *testing.T, addr string, a, other client.Access, background int, seed uint64) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const block = 64 << 10
	c := dialT(t, addr, client.Options{Policy: client.Policy{Access: a, BlockSize: block, CacheSize: 4 * block, Readahead: 2 * block}})
	if background > 0 {
		client.SetMaxBackground(c, background)
	}
	name := fmt.Sprintf("/model-%s-%s-%d", a, other, seed)
	f1, err := c.Open(ctx, name, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := c.OpenAccess(ctx, name, os.O_RDWR, 0, other)
	if err != nil {
		t.Fatal(err)
	}
	if f1.Access() != a || f2.Access() != other {
		t.Fatalf("access %v/%v, want %v/%v", f1.Access(), f2.Access(), a, other)
	}
	var model []byte
	rng := rand.New(rand.NewPCG(seed, uint64(a)*10+uint64(other)))
	const maxSize = 1 << 20
	files := []*client.File{f1, f2}
	check := func(step int, f *client.File, off, n int) {
		t.Helper()
		buf := make([]byte, n)
		got, err := f.ReadAt(buf, int64(off))
		want := 0
		if off < len(model) {
			want = min(n, len(model)-off)
		}
		if got != want || (err != nil && err != io.EOF) || (got < n && err != io.EOF) {
			t.Fatalf("step %d: ReadAt(%d, %d) = %d, %v; want %d", step, off, n, got, err, want)
		}
		if want > 0 && !bytes.Equal(buf[:got], model[off:off+want]) {
			i := 0
			for buf[i] == model[off+i] {
				i++
			}
			t.Fatalf("step %d: ReadAt(%d, %d): first difference at %d", step, off, n, off+i)
		}
	}
	for step := range 400 {
		f := files[rng.IntN(2)]
		switch op := rng.IntN(20); {
		case op < 9: // write, mostly small, sometimes large or sequential
			n := 1 + rng.IntN(8<<10)
			if rng.IntN(4) == 0 {
				n = rng.IntN(300 << 10)
			}
			off := rng.IntN(maxSize - n)
			if rng.IntN(3) == 0 {
				off = min(len(model), maxSize-n) // append-ish
			}
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			if got, err := f.WriteAt(p, int64(off)); got != n || err != nil {
				t.Fatalf("step %d: WriteAt(%d, %d) = %d, %v", step, off, n, got, err)
			}
			if end := off + n; end > len(model) {
				model = append(model, make([]byte, end-len(model))...)
			}
			copy(model[off:], p)
		case op < 16: // read
			off := rng.IntN(maxSize)
			n := 1 + rng.IntN(200<<10)
			if rng.IntN(3) == 0 && len(model) > 0 {
				off = rng.IntN(len(model))
			}
			check(step, f, off, n)
		case op < 17: // truncate, shorter or longer
			size := rng.IntN(maxSize)
			if err := f.Truncate(ctx, uint64(size)); err != nil {
				t.Fatalf("step %d: Truncate(%d): %v", step, size, err)
			}
			if size < len(model) {
				model = model[:size]
			} else {
				model = append(model, make([]byte, size-len(model))...)
			}
		case op < 18:
			if err := f.Sync(); err != nil {
				t.Fatalf("step %d: Sync: %v", step, err)
			}
		default: // size as seen by Stat
			st, err := f.Stat(ctx)
			if err != nil || st.Size != uint64(len(model)) {
				st1, _ := f.Stat(ctx)
				serr := f.Sync()
				st2, _ := f.Stat(ctx)
				t.Fatalf("step %d: Stat size %d, %v; want %d (again: %d; sync: %v, then %d)", step, st.Size, err, len(model), st1.Size, serr, st2.Size)
			}
		}
	}
	check(-1, f1, 0, maxSize)
	if err := f2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f1.Close(); err != nil {
		t.Fatal(err)
	}
	// Everything reached the server: a fresh direct client sees it.
	c2 := dialT(t, addr, client.Options{})
	f, err := c2.Open(ctx, name, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files = []*client.File{f}
	check(-2, f, 0, maxSize)
}

// TestAccessOverlap checks read-after-write on overlapping and adjacent
// writes within one File, for each method and block-boundary position.
func TestAccessOverlap(t *testing.T) {
	addr := startCluster(t, 2).MDS.Addr.String()
	const block = 64 << 10
	cases := []struct {
		name   string
		writes [][2]int // offset, length
	}{
		{"same", [][2]int{{0, 4096}, {0, 4096}}},
		{"inside", [][2]int{{0, 8192}, {1000, 100}}},
		{"straddle-block", [][2]int{{block - 100, 200}, {block - 50, 100}}},
		{"gap-in-page", [][2]int{{0, 100}, {5000, 100}, {50, 5000}}},
		{"backwards", [][2]int{{3 * 4096, 4096}, {2 * 4096, 4096}, {4096, 4096}, {0, 4096}}},
		{"sparse", [][2]int{{10 * block, 10}, {0, 10}}},
		{"large-over-small", [][2]int{{100, 10}, {0, 3 * block}}},
	}
	for _, a := range accessMethods {
		c := dialT(t, addr, client.Options{Policy: client.Policy{Access: a, BlockSize: block, CacheSize: 8 * block}})
		for _, tc := range cases {
			t.Run(a.String()+"/"+tc.name, func(t *testing.T) {
				ctx := t.Context()
				f, err := c.Open(ctx, "/overlap-"+a.String()+tc.name, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				var model []byte
				for i, w := range tc.writes {
					p := bytes.Repeat([]byte{byte(i + 1)}, w[1])
					if _, err := f.WriteAt(p, int64(w[0])); err != nil {
						t.Fatal(err)
					}
					if end := w[0] + w[1]; end > len(model) {
						model = append(model, make([]byte, end-len(model))...)
					}
					copy(model[w[0]:], p)
					got := make([]byte, len(model))
					if n, err := f.ReadAt(got, 0); n != len(model) || (err != nil && err != io.EOF) || !bytes.Equal(got, model) {
						t.Fatalf("after write %d: read %d, %v; equal %v", i, n, err, bytes.Equal(got, model))
					}
				}
			})
		}
	}
}

// TestCloseToOpen: a second Client sees a first one's writes after the
// writer closed and the reader reopened, and a reader whose file did not
// change keeps its cache across opens.
func TestCloseToOpen(t *testing.T) {
	addr := startCluster(t, 2).MDS.Addr.String()
	ctx := t.Context()
	pol := client.Policy{Access: client.AccessCached, BlockSize: 64 << 10}
	c1 := dialT(t, addr, client.Options{Policy: pol})
	c2 := dialT(t, addr, client.Options{Policy: pol})
	const size = 300 << 10
	write := func(seed byte) {
		t.Helper()
		f, err := c1.Open(ctx, "/cto", os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		p := bytes.Repeat([]byte{seed}, size)
		for off := 0; off < size; off += 4096 {
			if _, err := f.WriteAt(p[off:off+4096], int64(off)); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	read := func(want byte) uint64 {
		t.Helper()
		before := c2.Stats()
		f, err := c2.Open(ctx, "/cto", os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got := make([]byte, size)
		if n, err := f.ReadAt(got, 0); n != size || (err != nil && err != io.EOF) {
			t.Fatalf("read %d, %v", n, err)
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{want}, size)) {
			t.Fatalf("read data is not all %d (first byte %d)", want, got[0])
		}
		after := c2.Stats()
		return after.DSReadBytes + after.MDSIOBytes - before.DSReadBytes - before.MDSIOBytes
	}
	write(1)
	if n := read(1); n == 0 {
		t.Fatal("first read moved no bytes")
	}
	if n := read(1); n != 0 {
		t.Errorf("reopening an unchanged file read %d bytes again; want the cache kept", n)
	}
	write(2)
	if n := read(2); n == 0 {
		t.Fatal("read after change moved no bytes")
	}
	// The writer's own cache stays valid across its close and reopen.
	before := c1.Stats()
	f, err := c1.Open(ctx, "/cto", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if n, err := f.ReadAt(got, 0); n != size || (err != nil && err != io.EOF) || got[size-1] != 2 {
		t.Fatalf("writer reread: %d, %v", n, err)
	}
	f.Close()
	if after := c1.Stats(); after.DSReadBytes != before.DSReadBytes {
		t.Errorf("writer reread %d bytes from data servers; want its cache", after.DSReadBytes-before.DSReadBytes)
	}
}

// TestCachedTruncate: truncating drops cached data past the new end, and
// growing again reads zeros, not stale cached bytes.
func TestCachedTruncate(t *testing.T) {
	addr := startCluster(t, 2).MDS.Addr.String()
	ctx := t.Context()
	c := dialT(t, addr, client.Options{Policy: client.Policy{Access: client.AccessCached, BlockSize: 64 << 10}})
	f, err := c.Open(ctx, "/trunc", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := bytes.Repeat([]byte{7}, 200<<10)
	if _, err := f.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(ctx, 1000); err != nil {
		t.Fatal(err)
	}
	if err := c.SetAttr(ctx, "/trunc", client.SetAttr{Size: ptr(uint64(100 << 10))}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 100<<10)
	n, err := f.ReadAt(got, 0)
	if n != len(got) || (err != nil && err != io.EOF) {
		t.Fatalf("read %d, %v", n, err)
	}
	want := make([]byte, len(got))
	copy(want, p[:1000])
	if !bytes.Equal(got, want) {
		t.Fatal("data after truncate and extend differs from 1000 bytes of 7 and zeros")
	}
	if st, err := c.Stat(ctx, "/trunc"); err != nil || st.Size != 100<<10 {
		t.Fatalf("Stat: %d, %v", st.Size, err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestCacheEvictionConcurrent: several goroutines write and read disjoint
// regions much larger than the cache through Files of one Client.
func TestCacheEvictionConcurrent(t *testing.T) {
	addr := startCluster(t, 2).MDS.Addr.String()
	ctx := t.Context()
	for _, a := range []client.Access{client.AccessCached, client.AccessODirect} {
		t.Run(a.String(), func(t *testing.T) {
			c := dialT(t, addr, client.Options{Policy: client.Policy{Access: a, BlockSize: 32 << 10, CacheSize: 128 << 10}})
			const region = 512 << 10
			const workers = 4
			errc := make(chan error, workers)
			for w := range workers {
				go func() {
					errc <- func() error {
						f, err := c.Open(ctx, "/evict-"+a.String(), os.O_CREATE|os.O_RDWR, 0o644)
						if err != nil {
							return err
						}
						defer f.Close()
						base := int64(w * region)
						want := make([]byte, region)
						pattern(want, base)
						for off := 0; off < region; off += 3000 {
							end := min(off+3000, region)
							if _, err := f.WriteAt(want[off:end], base+int64(off)); err != nil {
								return err
							}
						}
						got := make([]byte, region)
						for off := 0; off < region; off += 5000 {
							end := min(off+5000, region)
							if n, err := f.ReadAt(got[off:end], base+int64(off)); n != end-off {
								return fmt.Errorf("read at %d: %d, %v", off, n, err)
							}
						}
						if !bytes.Equal(got, want) {
							return fmt.Errorf("worker %d read back different data", w)
						}
						return f.Close()
					}()
				}()
			}
			for range workers {
				if err := <-errc; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestPolicyConfig covers the server's block size suggestion and the
// validation of an explicit policy (cmd/shoal tests the YAML file and the
// flags).
func TestPolicyConfig(t *testing.T) {
	cl := startCluster(t, 2)
	c := dialT(t, cl.MDS.Addr.String(), client.Options{})
	if got := c.Policy(); got.BlockSize != 1<<20 || got.Access != client.AccessDirect || got.MaxPerDS != 8 {
		t.Errorf("default policy against a 1 MiB stripe unit: %+v", got)
	}
	c = dialT(t, cl.MDS.Addr.String(), client.Options{MaxPerDS: 3, Policy: client.Policy{BlockSize: 128 << 10}})
	if got := c.Policy(); got.BlockSize != 128<<10 || got.MaxPerDS != 3 {
		t.Errorf("explicit policy: %+v", got)
	}
	if _, err := client.Dial(t.Context(), cl.MDS.Addr.String(), client.Options{Policy: client.Policy{CacheSize: -1}}); err == nil {
		t.Error("Dial accepted an invalid policy")
	}
}

// TestLayoutPolicy: layouts fetched at open, kept after close, and small
// I/O sent to the MDS.
func TestLayoutPolicy(t *testing.T) {
	cl := startCluster(t, 2)
	addr := cl.MDS.Addr.String()
	ctx := t.Context()
	c := dialT(t, addr, client.Options{Policy: client.Policy{LayoutFetch: client.LayoutOnOpen, KeepLayouts: true, SmallIOThreshold: 16 << 10}})
	f, err := c.Open(ctx, "/lp", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().LayoutGets; got != 1 {
		t.Fatalf("LayoutGets after open = %d, want 1", got)
	}
	small := make([]byte, 4096)
	if _, err := f.WriteAt(small, 0); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.MDSIOBytes != 4096 || st.DSWriteBytes != 0 {
		t.Fatalf("small write: MDS %d, DS %d bytes; want it through the MDS", st.MDSIOBytes, st.DSWriteBytes)
	}
	big := make([]byte, 64<<10)
	if _, err := f.WriteAt(big, 0); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.DSWriteBytes != 64<<10 {
		t.Fatalf("large write: DS %d bytes, want 64 KiB", st.DSWriteBytes)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		f, err := c.Open(ctx, "/lp", os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(big, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.LayoutGets != 1 || st.LayoutReturns != 0 {
		t.Errorf("kept layouts: %d LAYOUTGETs, %d LAYOUTRETURNs; want 1 and 0", st.LayoutGets, st.LayoutReturns)
	}
	// A truncate from another client recalls the kept layout.
	c2 := dialT(t, addr, client.Options{})
	if err := c2.SetAttr(ctx, "/lp", client.SetAttr{Size: ptr(uint64(10))}); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.LayoutRecalls != 1 {
		t.Errorf("LayoutRecalls = %d, want 1", st.LayoutRecalls)
	}
}

// TestSetAccessAndClientClose: switching a File's method writes back what
// the old one held, and closing the Client writes back Files left open.
func TestSetAccessAndClientClose(t *testing.T) {
	addr := startCluster(t, 2).MDS.Addr.String()
	ctx := t.Context()
	c := dialer(addr, client.Options{Policy: client.Policy{Access: client.AccessCached}})(t)
	f, err := c.Open(ctx, "/sa", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("cached"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.SetAccess(ctx, client.AccessODirect); err != nil || f.Access() != client.AccessODirect {
		t.Fatalf("SetAccess: %v, now %v", err, f.Access())
	}
	if _, err := f.WriteAt([]byte("+odirect"), 6); err != nil {
		t.Fatal(err)
	}
	if err := f.SetAccess(ctx, client.Access(42)); err == nil {
		t.Error("SetAccess accepted a bogus method")
	}
	if err := c.Close(); err != nil { // f left open
		t.Fatal(err)
	}
	c2 := dialT(t, addr, client.Options{})
	g, err := c2.Open(ctx, "/sa", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got := make([]byte, 64)
	n, _ := g.ReadAt(got, 0)
	if string(got[:n]) != "cached+odirect" {
		t.Fatalf("after client close: %q", got[:n])
	}
}
