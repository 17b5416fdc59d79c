package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// cutProxy stands between clients and one data server. Its kill makes the
// data server unreachable for clients (connections reset, new ones
// refused) while the data server itself, and its control connection to
// the MDS, stay up. It can arm itself to kill once it has forwarded a
// given number of bytes from the server, so a failure lands in the middle
// of a transfer without any timing.
type cutProxy struct {
	ln        net.Listener
	target    atomic.Pointer[string]
	killAfter atomic.Int64 // bytes server→client; 0: never
	forwarded atomic.Int64
	killUp    atomic.Int64 // bytes client→server; 0: never
	sent      atomic.Int64
	// calls and replies count RPC records each way, and maxOut is the
	// most calls ever outstanding at once.
	calls, replies, maxOut atomic.Int64
	killed                 atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { p.kill(); p.wg.Wait() })
	return p
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		target := p.target.Load()
		if target == nil {
			cc.Close()
			continue
		}
		sc, err := net.DialTimeout("tcp", *target, 10*time.Second)
		if err != nil {
			cc.Close()
			continue
		}
		p.mu.Lock()
		if p.killed.Load() {
			p.mu.Unlock()
			cc.Close()
			sc.Close()
			return
		}
		p.conns = append(p.conns, cc, sc)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			p.pump(sc, cc, &p.killUp, &p.sent, &recordCounter{n: &p.calls, p: p})
			sc.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.pump(cc, sc, &p.killAfter, &p.forwarded, &recordCounter{n: &p.replies, p: p})
			cc.Close()
		}()
	}
}

// pump copies src to dst, killing the proxy once count passes a non-zero
// limit.
func (p *cutProxy) pump(dst, src net.Conn, limit, count *atomic.Int64, rc *recordCounter) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			rc.feed(buf[:n])
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if lim := limit.Load(); count.Add(int64(n)) >= lim && lim > 0 {
				p.kill()
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// recordCounter counts the RPC records (record-marking, RFC 5531 §11) in
// one direction of a stream. Calls are counted when their first byte
// arrives, replies when their last byte does, so calls minus replies
// never undercounts the calls outstanding.
type recordCounter struct {
	n       *atomic.Int64
	p       *cutProxy
	hdr     []byte
	left    int64 // bytes of the current fragment still to come
	last    bool  // the current fragment ends its record
	started bool
}

func (r *recordCounter) feed(b []byte) {
	for len(b) > 0 {
		if r.left == 0 {
			need := 4 - len(r.hdr)
			k := min(need, len(b))
			r.hdr = append(r.hdr, b[:k]...)
			b = b[k:]
			if len(r.hdr) < 4 {
				return
			}
			m := uint32(r.hdr[0])<<24 | uint32(r.hdr[1])<<16 | uint32(r.hdr[2])<<8 | uint32(r.hdr[3])
			r.hdr = r.hdr[:0]
			r.left, r.last = int64(m&0x7fffffff), m&0x80000000 != 0
			if !r.started && r.n == &r.p.calls {
				r.started = true
				out := r.p.calls.Add(1) - r.p.replies.Load()
				for cur := r.p.maxOut.Load(); out > cur && !r.p.maxOut.CompareAndSwap(cur, out); cur = r.p.maxOut.Load() {
				}
			}
			if r.left == 0 && r.last {
				r.endRecord()
			}
			continue
		}
		k := min(r.left, int64(len(b)))
		r.left -= k
		b = b[k:]
		if r.left == 0 && r.last {
			r.endRecord()
		}
	}
}

func (r *recordCounter) endRecord() {
	r.started = false
	if r.n == &r.p.replies {
		r.p.replies.Add(1)
	}
}

// kill resets every connection and stops accepting new ones.
func (p *cutProxy) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed.Swap(true) {
		return
	}
	p.ln.Close()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, like a crashed peer
		}
		c.Close()
	}
}

// startProxiedCluster runs an MDS and n data servers, each advertised to
// clients through a cutProxy.
func startProxiedCluster(t *testing.T, n int) (*wiring.MDS, []*wiring.DS, []*cutProxy) {
	dir := t.TempDir()
	noSquash := false
	mds, err := wiring.StartMDS(wiring.MDSConfig{
		Listen: "127.0.0.1:0", Dir: filepath.Join(dir, "mds"),
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
		Lease:   10 * time.Second, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mds.Close() })
	secret, err := cluster.ReadJoinSecret(mds.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var dss []*wiring.DS
	var proxies []*cutProxy
	for i := range n {
		p := newCutProxy(t)
		d, err := wiring.StartDS(ctx, wiring.DSConfig{
			Listen: "127.0.0.1:0", Dir: filepath.Join(dir, fmt.Sprintf("ds%d", i)),
			MDS: []string{mds.Addr.String()}, JoinSecret: secret, Advertise: p.ln.Addr().String(),
			Lease: 10 * time.Second, Logger: quietLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		target := d.Addr.String()
		p.target.Store(&target)
		dss = append(dss, d)
		proxies = append(proxies, p)
	}
	if err := mds.Registry.WaitFor(ctx, n); err != nil {
		t.Fatal(err)
	}
	return mds, dss, proxies
}

// TestPNFSFailover cuts one data server off from the client in the middle
// of a read and of a write: the client must redo the failed pieces through
// the MDS, return the layout, and neither lose nor corrupt data.
//
// Here the data server is cut off at the network (a proxy between client
// and data server resets and refuses connections) while its control
// connection to the MDS stays up; TestPNFSDataServerKilled kills the whole
// data server process instead.
func TestPNFSFailover(t *testing.T) {
	const size = 16 << 20
	want := make([]byte, size)
	pattern(want, 0)
	for _, tc := range []struct {
		name  string
		write bool
	}{{"read", false}, {"write", true}} {
		t.Run(tc.name, func(t *testing.T) {
			mds, _, proxies := startProxiedCluster(t, 4)
			addr := mds.Addr.String()
			c := dialer(addr, client.Options{})(t)
			defer c.Close()
			ctx := t.Context()
			f, err := c.Open(ctx, "/failover", os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			victim := proxies[1]
			if tc.write {
				// One stripe unit to every data server, UNSTABLE; then
				// the victim dies in the middle of the second WRITE of
				// the next batch, so the rest of its WRITEs and its
				// COMMIT fail.
				if n, err := f.WriteAt(want[:4<<20], 0); n != 4<<20 || err != nil {
					t.Fatalf("WriteAt = %d, %v", n, err)
				}
				victim.killUp.Store(victim.sent.Load() + 3<<19)
				if n, err := f.WriteAt(want[4<<20:], 4<<20); n != size-4<<20 || err != nil {
					t.Fatalf("WriteAt = %d, %v", n, err)
				}
				if err := f.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
			} else {
				if n, err := f.WriteAt(want, 0); n != size || err != nil {
					t.Fatalf("WriteAt = %d, %v", n, err)
				}
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
				// Die after about 1.5 MiB of READ replies.
				victim.killAfter.Store(victim.forwarded.Load() + 3<<19)
				got := make([]byte, size)
				n, err := f.ReadAt(got, 0)
				if n != size || (err != nil && err != io.EOF) {
					t.Fatalf("ReadAt = %d, %v", n, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatal("read wrong data across the failover")
				}
				if err := f.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
			}
			if !victim.killed.Load() {
				t.Fatal("the data server was never cut off")
			}
			st := c.Stats()
			t.Logf("client %+v, MDS %+v", st, serverBytes(mds.Server))
			if st.Failovers == 0 {
				t.Errorf("no failover to the MDS: %+v", st)
			}
			// Everything is there, as seen by a client that uses the MDS
			// only, and by this one again (the cut-off data server's units
			// now go through the MDS).
			for _, opts := range []client.Options{{PNFSOff: true}, {}} {
				c2 := dialer(addr, opts)(t)
				g, err := c2.Open(ctx, "/failover", os.O_RDONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, size+1)
				n, err := g.ReadAt(got, 0)
				if n != size || err != io.EOF || !bytes.Equal(got[:n], want) {
					t.Errorf("PNFSOff=%v: read back %d, %v (equal=%v)", opts.PNFSOff, n, err, bytes.Equal(got[:n], want))
				}
				g.Close()
				c2.Close()
			}
		})
	}
}

// TestPNFSMaxPerDS checks that no more than MaxPerDS requests are ever
// outstanding at one data server, however many Files and goroutines do
// I/O at once, and that the pieces still go out in parallel.
func TestPNFSMaxPerDS(t *testing.T) {
	mds, _, proxies := startProxiedCluster(t, 2)
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			for _, p := range proxies {
				p.maxOut.Store(0)
			}
			c := dialer(mds.Addr.String(), client.Options{MaxPerDS: limit})(t)
			defer c.Close()
			ctx := t.Context()
			b := make([]byte, 12<<20)
			pattern(b, 0)
			var wg sync.WaitGroup
			errs := make(chan error, 3)
			for i := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					f, err := c.Open(ctx, fmt.Sprintf("/perds-%d-%d", limit, i), os.O_CREATE|os.O_RDWR, 0o644)
					if err != nil {
						errs <- err
						return
					}
					if _, err := f.WriteAt(b, 0); err != nil {
						errs <- err
					}
					got := make([]byte, len(b))
					if _, err := f.ReadAt(got, 0); err != nil && err != io.EOF {
						errs <- err
					} else if !bytes.Equal(got, b) {
						errs <- fmt.Errorf("file %d: wrong data", i)
					}
					if err := f.Close(); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			for i, p := range proxies {
				got := p.maxOut.Load()
				t.Logf("data server %d: at most %d requests outstanding", i, got)
				if got > int64(limit) {
					t.Errorf("data server %d had %d requests outstanding, MaxPerDS is %d", i, got, limit)
				}
				if limit > 1 && got < 2 {
					t.Errorf("data server %d never had two requests outstanding", i)
				}
			}
		})
	}
}

// TestPNFSDataServerKilled kills one data server entirely (its NFS service
// and its control agent) between the two halves of a read. The MDS, which
// in a local cluster shares the data servers' disks
// (cluster.Striped.SetFallback), must then serve the dead data server's
// share of the second half, and the read must neither fail nor return
// wrong bytes. Writes to a dead data server are not covered: without
// replicas there is nowhere to put its stripe units.
//
// Killing the agent also makes the MDS see the data server leave, and it
// recalls every layout (CB_LAYOUTRECALL). Which the client meets first is
// a race, and both ways are correct:
//
//   - error-driven: the client still holds the layout, its READs to the
//     dead data server fail, and it redoes them through the MDS
//     (Stats.Failovers);
//   - recall-driven: the client returns the layout before reading, and
//     the MDS refuses or hands out a new one; reads the client has no
//     layout for go to the MDS without any data-server request having
//     failed, so nothing is a failover (Stats.LayoutRecalls).
//
// Failovers only counts data-server requests redone through the MDS, and
// TestPNFSFailover checks it with the MDS unaware of the failure. Here the
// observable is that the dead data server's share came through the MDS,
// as the client and the MDS both count it. The "after the recall" case
// forces the recall-driven way, which the race otherwise picks now and
// then.
func TestPNFSDataServerKilled(t *testing.T) {
	const (
		size  = 16 << 20
		dsN   = 4
		unit  = 1 << 20 // cluster.DefaultStripeUnit
		dead  = 2
		share = size / 2 / dsN // the dead data server's part of the second half
	)
	// The second half is whole stripe rows, so every data server holds
	// exactly share bytes of it wherever the file's striping starts.
	if (size/2)%(dsN*unit) != 0 {
		t.Fatal("the second half must be whole stripe rows")
	}
	want := make([]byte, size)
	pattern(want, 0)
	for _, tc := range []struct {
		name        string
		afterRecall bool
	}{{"at once", false}, {"after the recall", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, dsN)
			c := dialer(cl.MDS.Addr.String(), client.Options{})(t)
			defer c.Close()
			ctx := t.Context()
			f, err := c.Open(ctx, "/killed", os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if n, err := f.WriteAt(want, 0); n != size || err != nil {
				t.Fatalf("WriteAt = %d, %v", n, err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if n, err := f.ReadAt(got[:size/2], 0); n != size/2 || err != nil {
				t.Fatalf("first half: %d, %v", n, err)
			}
			before, mdsBefore := c.Stats(), serverBytes(cl.MDS.Server)
			if before.DSReadBytes == 0 {
				t.Fatalf("the first half did not use the data servers: %+v", before)
			}
			if err := cl.DS[dead].Close(); err != nil {
				t.Fatal(err)
			}
			cl.DS[dead] = nil
			if tc.afterRecall {
				waitFor(t, "the layout recall after the data server left", func() bool {
					return c.Stats().LayoutRecalls > before.LayoutRecalls
				})
			}
			n, err := f.ReadAt(got[size/2:], size/2)
			if n != size/2 || (err != nil && err != io.EOF) {
				t.Fatalf("second half after the kill: %d, %v", n, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("wrong data after a data server was killed mid-read")
			}
			st, mds := c.Stats(), serverBytes(cl.MDS.Server)
			t.Logf("client before the kill %+v, after %+v; MDS read %d bytes of the second half",
				before, st, mds.read-mdsBefore.read)
			if st.Failovers == before.Failovers && st.LayoutRecalls == before.LayoutRecalls {
				t.Errorf("neither a failover nor a layout recall after a data server died: %+v", st)
			}
			// Nobody but the MDS can have served the dead data server's
			// share: check that it did, by both ends' counts.
			if d := st.MDSIOBytes - before.MDSIOBytes; d < share {
				t.Errorf("client read %d bytes of the second half through the MDS, want at least the dead data server's %d", d, share)
			}
			if d := mds.read - mdsBefore.read; d < share {
				t.Errorf("MDS served %d bytes of the second half, want at least the dead data server's %d", d, share)
			}
			if d := st.DSReadBytes - before.DSReadBytes; d > size/2-share {
				t.Errorf("client counts %d bytes of the second half from data servers, more than the %d the live ones hold", d, size/2-share)
			}
		})
	}
}

// waitFor polls cond until it holds, failing the test after a generous
// bound (an event that should come, not a timing requirement).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
