package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/meta/etcdtest"
	"github.com/shoalfs/shoal/server"
)

// freeAddr returns a loopback address where nothing listens (a port that
// was free a moment ago).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentAddr returns a loopback address that accepts connections and
// never answers, as a paused process whose kernel still completes TCP
// handshakes would.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestDialAddressList dials lists of addresses in which the first ones
// cannot serve: Dial must pass them and use the one that answers, or fail
// naming every address when none does.
func TestDialAddressList(t *testing.T) {
	live := startShoalLease(t, 5*time.Second)
	dead := freeAddr(t)
	silent := silentAddr(t)
	for _, tc := range []struct {
		name    string
		addrs   []string
		wantErr bool
	}{
		{name: "dead first", addrs: []string{dead, live}},
		{name: "silent first", addrs: []string{silent, dead, live}},
		{name: "only live", addrs: []string{live}},
		{name: "none answers", addrs: []string{dead, silent}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			list := strings.Join(tc.addrs, ",")
			c, err := client.Dial(ctx, list, client.Options{DialTimeout: 10 * time.Second, Logger: quietLogger()})
			if tc.wantErr {
				if err == nil {
					c.Close()
					t.Fatalf("Dial(%s) succeeded, want an error", list)
				}
				for _, a := range tc.addrs {
					if !strings.Contains(err.Error(), a) {
						t.Errorf("error %q does not name %s", err, a)
					}
				}
				if !errors.Is(err, client.ErrNotNFS) {
					t.Errorf("error %q does not wrap ErrNotNFS (the silent address)", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Dial(%s): %v", list, err)
			}
			defer c.Close()
			name := "/" + strings.ReplaceAll(tc.name, " ", "-")
			writeAll(t, ctx, c, name, []byte(tc.name))
			f, err := c.Open(ctx, name, os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			checkRead(t, f, []byte(tc.name))
			f.Close()
		})
	}
}

// TestMDSFailover runs a metadata server on etcd with data servers, and a
// client dialed with two addresses: the MDS's and a second one where
// nothing listens yet. With a file open, locked, written and not synced,
// and a second file open under a read delegation, the MDS stops and
// another MDS takes over the same etcd prefix on the second address (a new
// server instance, with its own data directory). The client's next calls
// must find it, recover its state there (new client ID, reclaims in the
// grace period) and go on without an error: the lock is still its own
// (another client's conflicting lock is refused until it unlocks), and
// every byte it wrote, before and after, is there.
//
// The data servers are restarted (same directories and ports) pointed at
// the new MDS, since a data server registers with one MDS address; their
// restart also makes the client's unsynced pNFS writes uncommitted, which
// it must write again through the new MDS.
func TestMDSFailover(t *testing.T) {
	etcd := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	metaURL := "etcd://" + etcd.Endpoints[0] + "/mdsfailover"
	dir := t.TempDir()
	secretFile := filepath.Join(dir, wiring.JoinSecretName)
	noSquash := false
	const lease = 5 * time.Second
	startMDS := func(name, listen string) *wiring.MDS {
		t.Helper()
		m, err := wiring.StartMDS(wiring.MDSConfig{
			Listen: listen, Dir: filepath.Join(dir, name), MetaURL: metaURL, JoinSecretFile: secretFile,
			Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
			Lease:   lease, Logger: quietLogger(),
		})
		if err != nil {
			t.Fatalf("start %s on %s: %v", name, listen, err)
		}
		return m
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const nDS = 2
	startDSes := func(m *wiring.MDS) []*wiring.DS {
		t.Helper()
		secret, err := cluster.ReadJoinSecret(secretFile)
		if err != nil {
			t.Fatal(err)
		}
		var dss []*wiring.DS
		for i := range nDS {
			d, err := wiring.StartDS(ctx, wiring.DSConfig{
				Listen: "127.0.0.1:0", Dir: filepath.Join(dir, fmt.Sprintf("ds%d", i)),
				MDS: []string{m.Addr.String()}, JoinSecret: secret, Lease: lease, Logger: quietLogger(),
			})
			if err != nil {
				t.Fatalf("start data server %d: %v", i, err)
			}
			dss = append(dss, d)
		}
		if err := m.Registry.WaitFor(ctx, nDS); err != nil {
			t.Fatal(err)
		}
		return dss
	}
	var (
		mds *wiring.MDS
		dss []*wiring.DS
	)
	stop := func() {
		for _, d := range dss {
			d.Close()
		}
		dss = nil
		if mds != nil {
			mds.Close()
			mds = nil
		}
	}
	t.Cleanup(stop)
	mds = startMDS("mds1", "127.0.0.1:0")
	dss = startDSes(mds)
	second := freeAddr(t)

	c := dialOpts(t, mds.Addr.String()+","+second, client.Options{DialTimeout: 10 * time.Second, Logger: quietLogger()})
	// More than a stripe unit, so the write spans both data servers.
	before := bytes.Repeat([]byte("before the failover "), 1<<17)
	after := bytes.Repeat([]byte("after it "), 1<<16)
	delegated := []byte("read under a delegation")
	writeAll(t, ctx, c, "/delegated", delegated)
	g := localOpen(t, ctx, delegServer{name: "shoal", addr: mds.Addr.String(), root: "/"}, c, "/delegated")
	defer g.Close()

	f, err := c.Open(ctx, "/locked", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Lock(ctx, 0, 4096, true, false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(before, 0); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.DSWriteBytes == 0 {
		t.Fatalf("nothing written to the data servers before the failover: %+v", st)
	}

	// The takeover: never two MDSes on the prefix at once.
	stop()
	mds = startMDS("mds2", second)
	dss = startDSes(mds)

	if _, err := f.WriteAt(after, int64(len(before))); err != nil {
		t.Fatalf("write after the failover: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync after the failover: %v", err)
	}
	want := append(append([]byte(nil), before...), after...)
	checkRead(t, f, want)
	checkRead(t, g, delegated)
	st := c.Stats()
	if st.Reconnects == 0 || st.Recoveries == 0 {
		t.Errorf("after the failover: %d reconnects, %d recoveries; want both > 0", st.Reconnects, st.Recoveries)
	}

	// The lock came along: another client is refused it until f unlocks.
	o := dialOpts(t, second, client.Options{Logger: quietLogger()})
	of, err := o.Open(ctx, "/locked", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer of.Close()
	if err := of.Lock(ctx, 100, 10, true, false); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("another client's conflicting lock after the failover: %v, want EAGAIN", err)
	}
	if err := f.Unlock(ctx, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if err := of.Lock(ctx, 100, 10, true, false); err != nil {
		t.Fatalf("another client's lock after the unlock: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close after the failover: %v", err)
	}
	got, err := io.ReadAll(io.NewSectionReader(of, 0, int64(len(want))+1))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("another client reads %d bytes (%v), want the %d written", len(got), err, len(want))
	}
}

func TestSplitAddrs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // joined by spaces; "" wants an error
	}{
		{"127.0.0.1:2049", "127.0.0.1:2049"},
		{"a:1,b:2", "a:1 b:2"},
		{"a,b,c:2049", "a:2049 b:2049 c:2049"},
		{"a,b:1,c:2", "a:1 b:1 c:2"},
		{" a , b:7 ", "a:7 b:7"},
		{"[::1],[fe80::1]:2049", "[::1]:2049 [fe80::1]:2049"},
		{"::1,b:9", "[::1]:9 b:9"},
		{"a", ""},
		{"a:1,b", ""},
		{"a,,b:1", ""},
		{"a:0", ""},
		{"a:65536", ""},
		{"a:x,b:1", ""},
		{"[a,b:1", ""},
		{"", ""},
	} {
		got, err := client.SplitAddrs(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("SplitAddrs(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("SplitAddrs(%q) = %q, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

// pauseProxy forwards connections to a server until paused; then it
// forwards nothing either way and closes nothing, and accepts new
// connections without ever answering on them, as a metadata server does
// whose process was stopped (SIGSTOP) while its kernel keeps its sockets.
type pauseProxy struct {
	ln     net.Listener
	target string
	paused chan struct{}

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newPauseProxy(t *testing.T, target string) *pauseProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pauseProxy{ln: ln, target: target, paused: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *pauseProxy) pause() { close(p.paused) }

func (p *pauseProxy) isPaused() bool {
	select {
	case <-p.paused:
		return true
	default:
		return false
	}
}

func (p *pauseProxy) track(cs ...net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, cs...)
	p.mu.Unlock()
}

func (p *pauseProxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(cc)
		if p.isPaused() {
			continue // held open, never answered
		}
		sc, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			cc.Close()
			continue
		}
		p.track(sc)
		p.wg.Add(2)
		go p.pump(sc, cc)
		go p.pump(cc, sc)
	}
}

// pump copies src to dst until paused or either side fails; once paused
// it drops what it reads and leaves dst open.
func (p *pauseProxy) pump(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if p.isPaused() {
			if err != nil {
				return
			}
			continue
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// TestMDSFailoverPausedLeader: the metadata server a client is connected
// to stops answering without closing anything (paused, then deposed), and
// another takes over on the client's second address. The client must
// notice the silence on its established connection, pass the first
// address (it accepts connections and answers nothing), and recover its
// open file and lock on the new server.
func TestMDSFailoverPausedLeader(t *testing.T) {
	etcd := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	metaURL := "etcd://" + etcd.Endpoints[0] + "/pausedleader"
	dir := t.TempDir()
	noSquash := false
	// A server without data servers keeps file data in its Dir, so both
	// use one (one after the other): what stands for the shared data
	// servers of a real cluster. The lease is long because it is the new
	// server's grace period too: the client notices the silence only
	// after silenceProbe and a NULL left unanswered, and it must come
	// within the grace period to reclaim its lock (after it, the lock
	// would be lost: ErrLockLost). The grace period ends as soon as the
	// one client has reclaimed, so the test does not wait it out.
	start := func(name, listen string) (stop func()) {
		t.Helper()
		srv, err := server.New(server.Config{
			Dir: dir, MetaURL: metaURL, Lease: time.Minute, Logger: quietLogger(),
			Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
		})
		if err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		var once sync.Once
		stop = func() { once.Do(func() { srv.Close(); <-done }) }
		t.Cleanup(stop)
		return stop
	}
	first := freeAddr(t)
	stopFirst := start("mds1", first)
	proxy := newPauseProxy(t, first)
	second := freeAddr(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	c := dialOpts(t, proxy.ln.Addr().String()+","+second, client.Options{DialTimeout: 10 * time.Second, Logger: quietLogger()})
	f, err := c.Open(ctx, "/paused", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Lock(ctx, 0, 0, true, false); err != nil {
		t.Fatal(err)
	}
	before := []byte("written before the pause; ")
	if _, err := f.WriteAt(before, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}

	proxy.pause()
	stopFirst() // deposed: never two servers on the prefix at once
	start("mds2", second)

	after := []byte("and after the takeover")
	if _, err := f.WriteAt(after, int64(len(before))); err != nil {
		t.Fatalf("write after the takeover: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync after the takeover: %v", err)
	}
	want := append(append([]byte(nil), before...), after...)
	checkRead(t, f, want)
	if st := c.Stats(); st.Reconnects == 0 || st.Recoveries == 0 {
		t.Errorf("after the takeover: %d reconnects, %d recoveries; want both > 0", st.Reconnects, st.Recoveries)
	}
	o := dialOpts(t, second, client.Options{Logger: quietLogger()})
	of, err := o.Open(ctx, "/paused", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer of.Close()
	if err := of.Lock(ctx, 0, 1, true, false); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("another client's conflicting lock after the takeover: %v, want EAGAIN", err)
	}
}
