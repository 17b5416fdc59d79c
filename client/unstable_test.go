package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// mirroredCluster is a metadata server and data servers in one process,
// with replicated stripes (`shoal mds --mirrors`), whose data servers a
// test can stop and start again on the same directory and port.
type mirroredCluster struct {
	mds    *wiring.MDS
	ds     []*wiring.DS // nil while stopped
	dirs   []string
	secret []byte
}

func startMirroredCluster(t *testing.T, n, mirrors int) *mirroredCluster {
	t.Helper()
	dir := t.TempDir()
	noSquash := false
	mds, err := wiring.StartMDS(wiring.MDSConfig{
		Listen: "127.0.0.1:0", Dir: filepath.Join(dir, "mds"), Mirrors: mirrors,
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
		Lease:   10 * time.Second, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &mirroredCluster{mds: mds}
	t.Cleanup(func() {
		for _, d := range c.ds {
			if d != nil {
				d.Close()
			}
		}
		mds.Close()
	})
	if c.secret, err = cluster.ReadJoinSecret(mds.JoinSecretFile); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		c.dirs = append(c.dirs, filepath.Join(dir, fmt.Sprintf("ds%d", i)))
		c.ds = append(c.ds, nil)
		c.start(t, i)
	}
	return c
}

// start starts data server i (again) and waits until every running data
// server is in service.
func (c *mirroredCluster) start(t *testing.T, i int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	d, err := wiring.StartDS(ctx, wiring.DSConfig{
		Listen: "127.0.0.1:0", Dir: c.dirs[i], MDS: []string{c.mds.Addr.String()}, JoinSecret: c.secret,
		Lease: 10 * time.Second, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("data server %d: %v", i, err)
	}
	c.ds[i] = d
	up := 0
	for _, d := range c.ds {
		if d != nil {
			up++
		}
	}
	if err := c.mds.Registry.WaitFor(ctx, up); err != nil {
		t.Fatal(err)
	}
}

// stop closes data server i, as if its process died: clients' connections
// to it break and new ones are refused.
func (c *mirroredCluster) stop(t *testing.T, i int) {
	t.Helper()
	if err := c.ds[i].Close(); err != nil {
		t.Logf("closing data server %d: %v", i, err)
	}
	c.ds[i] = nil
}

// copies returns the data servers that hold copies of f's offset off.
func (c *mirroredCluster) copies(t *testing.T, f *client.File, off int64) []int {
	t.Helper()
	ctx := t.Context()
	a, err := f.Stat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, ok, err := c.mds.Striped.Map(ctx, a.Fileid)
	if err != nil || !ok {
		t.Fatalf("stripe map of %s: %v, %v", f.Name(), ok, err)
	}
	var out []int
	for _, id := range m.Good(m.Position(uint64(off))) {
		for i, d := range c.ds {
			if d != nil && d.Agent.ID() == id {
				out = append(out, i)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("offset %d of %s has no copy in service", off, f.Name())
	}
	return out
}

// holders returns the data servers of f's offset off: the one the layout
// sends the client's WRITEs to, and the one that holds the other copy
// (the first data server forwards the data to it).
func (c *mirroredCluster) holders(t *testing.T, f *client.File, off int64) (written, copy int) {
	t.Helper()
	addr, _, _, err := client.StripeOf(t.Context(), f, off)
	if err != nil {
		t.Fatal(err)
	}
	cs := c.copies(t, f, off)
	if len(cs) != 2 {
		t.Fatalf("offset %d of %s has %d copies in service, want 2", off, f.Name(), len(cs))
	}
	switch addr {
	case c.ds[cs[0]].Addr.String():
		return cs[0], cs[1]
	case c.ds[cs[1]].Addr.String():
		return cs[1], cs[0]
	}
	t.Fatalf("offset %d: the layout names data server %s, which holds no copy", off, addr)
	return
}

// readBack reads path through a new Client and compares it with want.
func readBack(t *testing.T, addr, path string, want []byte) {
	t.Helper()
	c := dialer(addr, client.Options{})(t)
	defer c.Close()
	g, err := c.Open(t.Context(), path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got := make([]byte, len(want)+1)
	n, err := g.ReadAt(got, 0)
	if n != len(want) || err != io.EOF || !bytes.Equal(got[:n], want) {
		t.Fatalf("read back %d bytes of %d, %v (equal: %v)", n, len(want), err, bytes.Equal(got[:n], want))
	}
}

// unit is the cluster's stripe unit (cluster.DefaultStripeUnit): writing
// [0, unit) puts the data on one position of the stripe map only.
const unit = 1 << 20

// TestSyncAfterDataServerLoss writes one stripe unit UNSTABLE through a
// layout to a cluster that keeps two copies of it, then stops one of the
// two data servers before Sync. Either way Sync must succeed and the data
// read back: when the data server the client wrote to is gone, its COMMIT
// fails and the client writes the data again through the MDS, which
// puts it on the surviving copy; when the other copy is gone, the data
// server the client wrote to marks it stale and commits.
func TestSyncAfterDataServerLoss(t *testing.T) {
	for _, tc := range []struct {
		name       string
		stopWriter bool // stop the data server written to, else the copy's
	}{
		{"the data server written to", true},
		{"the data server holding the copy", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := startMirroredCluster(t, 3, 2)
			addr := mc.mds.Addr.String()
			c := dialer(addr, client.Options{})(t)
			defer c.Close()
			f, err := c.Open(t.Context(), "/lost", os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := make([]byte, unit)
			pattern(want, 0)
			if n, err := f.WriteAt(want, 0); n != len(want) || err != nil {
				t.Fatalf("WriteAt = %d, %v", n, err)
			}
			written, copy := mc.holders(t, f, 0)
			before := c.Stats()
			if before.DSWriteBytes < unit {
				t.Fatalf("the write did not go to a data server: %+v", before)
			}
			victim := copy
			if tc.stopWriter {
				victim = written
			}
			mc.stop(t, victim)
			if err := f.Sync(); err != nil {
				t.Fatalf("Sync after a data server holding the data stopped: %v", err)
			}
			st := c.Stats()
			t.Logf("stopped data server %d (written %d, copy %d); client %+v", victim, written, copy, st)
			if resent := st.ResentBytes - before.ResentBytes; tc.stopWriter && resent < unit {
				t.Errorf("%d bytes written again through the MDS, want the %d the stopped data server took UNSTABLE", resent, unit)
			}
			readBack(t, addr, "/lost", want)
		})
	}
}

// TestSyncAfterVerifierChange writes one stripe unit UNSTABLE, then
// restarts a data server that holds it, between the WRITEs and the
// COMMIT. Sync must write the data again and succeed:
//
//   - through a layout, the data server written to restarted: the
//     client's COMMIT to it fails (its session is gone with the old
//     process);
//   - through a layout, the data server holding the other copy
//     restarted: the data server written to finds at its COMMIT that
//     the copy it forwarded the data to may have lost it, and changes
//     its write verifier;
//   - through the MDS (pNFS off) to a file with one copy, its data
//     server restarted: the MDS finds at its COMMIT that the data server
//     may have lost the data and changes its write verifier. (With two
//     copies the MDS marks the restarted one stale instead: the other
//     has the data.)
//
// The restart makes the MDS recall the client's layouts, and the client
// commits what it wrote through a layout before returning it; the
// callbacks are held back until the data server is up again, so that
// the COMMIT meets the restarted data server rather than a stopped one.
func TestSyncAfterVerifierChange(t *testing.T) {
	for _, tc := range []struct {
		name          string
		pnfsOff       bool
		restartWriter bool
	}{
		{"the data server written to restarted", false, true},
		{"the data server holding the copy restarted", false, false},
		{"through the MDS, the only copy restarted", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mirrors := 2
			if tc.pnfsOff {
				mirrors = 1
			}
			mc := startMirroredCluster(t, 3, mirrors)
			addr := mc.mds.Addr.String()
			proxy := newCBProxy(t, addr)
			c := dialer(proxy.ln.Addr().String(), client.Options{PNFSOff: tc.pnfsOff})(t)
			defer c.Close()
			f, err := c.Open(t.Context(), "/restarted", os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := make([]byte, unit)
			pattern(want, 7)
			if n, err := f.WriteAt(want, 0); n != len(want) || err != nil {
				t.Fatalf("WriteAt = %d, %v", n, err)
			}
			var victim int
			if tc.pnfsOff {
				victim = mc.copies(t, f, 0)[0]
			} else {
				written, copy := mc.holders(t, f, 0)
				victim = copy
				if tc.restartWriter {
					victim = written
				}
			}
			before := c.Stats()
			proxy.hold()
			mc.stop(t, victim)
			mc.start(t, victim)
			proxy.release()
			if err := f.Sync(); err != nil {
				t.Fatalf("Sync after a data server holding the data restarted: %v", err)
			}
			st := c.Stats()
			t.Logf("restarted data server %d; client %+v", victim, st)
			if resent := st.ResentBytes - before.ResentBytes; resent < unit {
				t.Errorf("%d bytes written again, want the %d written UNSTABLE before the restart", resent, unit)
			}
			readBack(t, addr, "/restarted", want)
		})
	}
}

// cbProxy stands between a client and the MDS and can hold back the
// server's callbacks (RPC calls from the server on the backchannel, such
// as CB_LAYOUTRECALL) while it forwards everything else, so a test can
// decide when a recall reaches the client; holdAll holds back the
// server's replies too.
type cbProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex // serializes writes to the client and guards below
	holding bool
	all     bool // holding replies too
	held    []heldCall
	nheld   atomic.Int32
	conns   []net.Conn
}

type heldCall struct {
	dst net.Conn
	rec []byte
}

func newCBProxy(t *testing.T, target string) *cbProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cbProxy{ln: ln, target: target}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", target)
			if err != nil {
				cc.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, cc, sc)
			p.mu.Unlock()
			wg.Go(func() { io.Copy(sc, cc); sc.Close() })
			wg.Go(func() { p.fromServer(cc, sc); cc.Close() })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	return p
}

// fromServer forwards RPC records from the server, holding back calls
// (msg_type CALL) while holding is set.
func (p *cbProxy) fromServer(dst, src net.Conn) {
	var rec []byte
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(src, hdr[:]); err != nil {
			return
		}
		mark := binary.BigEndian.Uint32(hdr[:])
		frag := make([]byte, mark&0x7fffffff)
		if _, err := io.ReadFull(src, frag); err != nil {
			return
		}
		rec = append(rec, hdr[:]...)
		rec = append(rec, frag...)
		if mark&0x80000000 == 0 {
			continue // more fragments to come
		}
		isCall := len(rec) >= 12 && binary.BigEndian.Uint32(rec[8:12]) == 0
		p.mu.Lock()
		if (isCall || p.all) && p.holding {
			p.held = append(p.held, heldCall{dst, rec})
			p.nheld.Add(1)
		} else if _, err := dst.Write(rec); err != nil {
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		rec = nil
	}
}

func (p *cbProxy) hold() {
	p.mu.Lock()
	p.holding = true
	p.mu.Unlock()
}

// holdAll holds back everything the server sends, replies too, until
// release.
func (p *cbProxy) holdAll() {
	p.mu.Lock()
	p.holding, p.all = true, true
	p.mu.Unlock()
}

// release forwards the calls held back and stops holding.
func (p *cbProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding, p.all = false, false
	for _, h := range p.held {
		h.dst.Write(h.rec)
	}
	p.held = nil
}

// logRecorder is a slog.Handler that keeps the messages it gets.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	r.mu.Unlock()
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// TestLayoutCommitStateid checks that LAYOUTCOMMIT carries the layout
// stateid the server holds for the client and file at the time, however
// it moved since the layout was granted:
//
//   - a recall moved the seqid, and the CB_LAYOUTRECALL that carries the
//     new one reaches the client only after its LAYOUTCOMMIT went out with
//     the old one. Shoal accepts an older seqid of the current layout
//     stateid in LAYOUTCOMMIT (the Linux client, which never learns a
//     seqid moved by a delegation's OPEN, looped on NFS4ERR_OLD_STATEID
//     otherwise), so no retry is needed; the client's wait-and-retry on
//     NFS4ERR_OLD_STATEID is for servers that refuse it;
//   - the layout was recalled and returned, and a new one granted: the
//     LAYOUTCOMMIT of the writes through it must carry the new stateid;
//   - another File of the Client asked for a layout of the same file,
//     which moved the seqid of the layout state they share.
//
// Each time Sync must succeed and the data and size read back.
func TestLayoutCommitStateid(t *testing.T) {
	const retryMsg = "LAYOUTCOMMIT: retrying with the current layout stateid"
	for _, tc := range []struct {
		name string
		// between runs after the first write, before Sync; it returns
		// what to do while Sync is in flight, or nil.
		between func(t *testing.T, env *stateidEnv) func()
		retries bool // a LAYOUTCOMMIT retry is expected
	}{
		{"recall reaches the client after its LAYOUTCOMMIT", func(t *testing.T, e *stateidEnv) func() {
			e.proxy.hold()
			e.mds.Server.RecallLayouts(e.ino)
			waitFor(t, "the held CB_LAYOUTRECALL", func() bool { return e.proxy.nheld.Load() > 0 })
			return func() {
				time.Sleep(200 * time.Millisecond) // let LAYOUTCOMMIT meet the moved seqid
				e.proxy.release()
			}
		}, false},
		{"recall, then a new layout", func(t *testing.T, e *stateidEnv) func() {
			before := e.c.Stats()
			e.mds.Server.RecallLayouts(e.ino)
			waitFor(t, "the layout's return", func() bool { return e.c.Stats().LayoutReturns > before.LayoutReturns })
			e.write(t, unit, unit) // through a new layout
			if st := e.c.Stats(); st.LayoutGets <= before.LayoutGets {
				t.Fatalf("no new layout after the recall: %+v", st)
			}
			return nil
		}, false},
		{"a sibling File's LAYOUTGET", func(t *testing.T, e *stateidEnv) func() {
			before := e.c.Stats()
			g, err := e.c.Open(t.Context(), e.path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { g.Close() })
			b := make([]byte, unit)
			pattern(b, unit)
			if n, err := g.WriteAt(b, unit); n != unit || err != nil {
				t.Fatalf("sibling WriteAt = %d, %v", n, err)
			}
			copy(e.want[unit:], b)
			e.end = 2 * unit
			if st := e.c.Stats(); st.LayoutGets <= before.LayoutGets {
				t.Fatalf("the sibling got no layout of its own: %+v", st)
			}
			return nil
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, 2)
			e := &stateidEnv{mds: cl.MDS, path: "/stateid", want: make([]byte, 2*unit), log: &logRecorder{}}
			e.proxy = newCBProxy(t, cl.MDS.Addr.String())
			e.c = dialer(e.proxy.ln.Addr().String(), client.Options{Logger: slog.New(e.log)})(t)
			defer e.c.Close()
			var err error
			if e.f, err = e.c.Open(t.Context(), e.path, os.O_CREATE|os.O_RDWR, 0o644); err != nil {
				t.Fatal(err)
			}
			defer e.f.Close()
			e.write(t, 0, unit)
			a, err := e.f.Stat(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			e.ino = a.Fileid
			during := tc.between(t, e)
			done := make(chan error, 1)
			go func() { done <- e.f.Sync() }()
			if during != nil {
				during()
			}
			if err := <-done; err != nil {
				t.Fatalf("Sync: %v", err)
			}
			e.proxy.release()
			if err := e.f.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			retries := e.log.count(retryMsg)
			t.Logf("client %+v; %d LAYOUTCOMMIT retries", e.c.Stats(), retries)
			if tc.retries && retries == 0 {
				t.Errorf("the LAYOUTCOMMIT that met the moved seqid was not retried")
			}
			if !tc.retries && retries > 0 {
				t.Errorf("LAYOUTCOMMIT was sent with an old stateid %d times", retries)
			}
			if st := e.c.Stats(); st.ResentBytes != 0 {
				t.Errorf("%d bytes written again through the MDS: the size was not published with LAYOUTCOMMIT", st.ResentBytes)
			}
			readBack(t, cl.MDS.Addr.String(), e.path, e.want[:e.end])
		})
	}
}

type stateidEnv struct {
	mds   *wiring.MDS
	proxy *cbProxy
	c     *client.Client
	f     *client.File
	path  string
	ino   uint64
	want  []byte // the file's contents up to end
	end   int
	log   *logRecorder
}

// write writes n bytes at off through the File.
func (e *stateidEnv) write(t *testing.T, off, n int) {
	t.Helper()
	b := e.want[off : off+n]
	pattern(b, int64(off))
	if got, err := e.f.WriteAt(b, int64(off)); got != n || err != nil {
		t.Fatalf("WriteAt = %d, %v", got, err)
	}
	e.end = max(e.end, off+n)
}

// TestUnstableLimit writes far more than Policy.UnstableLimit without
// Sync: the File must commit on its own to stay within the limit, and
// every byte must read back.
func TestUnstableLimit(t *testing.T) {
	const limit = 1 << 20
	for _, tc := range []struct {
		name string
		opts client.Options
	}{
		{"through data servers", client.Options{Policy: client.Policy{UnstableLimit: limit}}},
		{"through the metadata server", client.Options{PNFSOff: true, Policy: client.Policy{UnstableLimit: limit}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, 2)
			addr := cl.MDS.Addr.String()
			c := dialer(addr, tc.opts)(t)
			defer c.Close()
			f, err := c.Open(t.Context(), "/limit", os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := make([]byte, 8<<20)
			pattern(want, 0)
			var most int64
			for off := 0; off < len(want); off += 64 << 10 {
				if _, err := f.WriteAt(want[off:off+64<<10], int64(off)); err != nil {
					t.Fatal(err)
				}
				most = max(most, client.HeldBytes(f))
			}
			// A write of 64 KiB goes out whole: the File may hold one
			// more than the limit.
			if most > limit+64<<10 {
				t.Errorf("the File kept %d bytes of unstable data, limit %d", most, limit)
			}
			if most == 0 {
				t.Errorf("the File kept no copy of its unstable writes")
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if n := client.HeldBytes(f); n != 0 {
				t.Errorf("the File still keeps %d bytes after Sync", n)
			}
			readBack(t, addr, "/limit", want)
		})
	}
}

// TestUnstableLimitDefault: the default (cmd/shoal tests the setting's
// file and flag).
func TestUnstableLimitDefault(t *testing.T) {
	if d := client.DefaultPolicy().UnstableLimit; d != client.DefaultUnstableLimit {
		t.Errorf("DefaultPolicy().UnstableLimit = %d", d)
	}
}

// TestUnstableLimitConcurrent: many writes of one File at once, as a FUSE
// mount's writeback sends them, that find the File over its limit share
// one commit round instead of each running one after the other. Counted
// as the LAYOUTCOMMITs the MDS gets: one per round that published new
// writes.
func TestUnstableLimitConcurrent(t *testing.T) {
	const (
		limit   = 1 << 20
		chunk   = 128 << 10
		writers = 16
		size    = 16 << 20
	)
	cl := startCluster(t, 2)
	addr := cl.MDS.Addr.String()
	c := dialer(addr, client.Options{Policy: client.Policy{UnstableLimit: limit}})(t)
	defer c.Close()
	f, err := c.Open(t.Context(), "/herd", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := make([]byte, size)
	pattern(want, 0)
	before := cl.MDS.Server.Stats().Ops["LAYOUTCOMMIT"]
	// Each writer takes the next chunk until the file is written.
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			for {
				off := next.Add(chunk) - chunk
				if off >= size {
					return
				}
				if _, err := f.WriteAt(want[off:off+chunk], off); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rounds := cl.MDS.Server.Stats().Ops["LAYOUTCOMMIT"] - before
	t.Logf("%d LAYOUTCOMMITs", rounds)
	// size/limit rounds make room; the writes in flight when one starts
	// may each add a little, so twice that is the bound. Each write
	// committing on its own ran one round per write past the first
	// limit's worth: about size/chunk.
	if max := uint64(2 * size / limit); rounds > max {
		t.Errorf("%d LAYOUTCOMMITs while writing %d MiB at a %d MiB limit, want at most %d", rounds, size>>20, limit>>20, max)
	}
	if rounds == 0 {
		t.Errorf("no LAYOUTCOMMIT while writing %d MiB at a %d MiB limit: the File did not commit on its own", size>>20, limit>>20)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	readBack(t, addr, "/herd", want)
}
