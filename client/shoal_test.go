package client_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/client/clienttest"
	"github.com/shoalfs/shoal/server"
)

// startShoal runs Shoal's own server in-process on a loopback port, with
// root squashing off so the suite may chown, and returns its address.
func startShoal(tb testing.TB) string {
	tb.Helper()
	return startShoalIn(tb, tb.TempDir())
}

// startShoalIn is startShoal with the server's data directory given.
func startShoalIn(tb testing.TB, dir string) string {
	tb.Helper()
	noSquash := false
	srv, err := server.New(server.Config{
		Dir:     dir,
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
	})
	if err != nil {
		tb.Fatalf("server.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		srv.Close()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, net.ErrClosed) && err.Error() != "rpc: server closed" {
				tb.Logf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			tb.Error("server did not stop within 10s")
		}
	})
	return ln.Addr().String()
}

func TestShoal(t *testing.T) {
	addr := startShoal(t)
	for _, minor := range []uint32{2, 1} {
		t.Run(fmt.Sprintf("v4.%d", minor), func(t *testing.T) {
			clienttest.Run(t, dialer(addr, client.Options{MinorVersion: minor}))
		})
	}
}

// TestShoalRestart restarts Shoal's server on the same directory and port.
// Back within its grace period (one lease), the client reclaims with
// CLAIM_PREVIOUS and reclaim locks. Back after it (the new server listens
// only once a lease has passed), the server refuses the reclaims
// (NFS4ERR_NO_GRACE) and the client opens and locks anew, which the server
// allows only after the client's RECLAIM_COMPLETE (RFC 8881 §18.51.3).
func TestShoalRestart(t *testing.T) {
	const lease = 3 * time.Second
	for _, tc := range []struct {
		name       string
		afterGrace bool
	}{
		{"in grace", false},
		{"after grace", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			noSquash := false
			cfg := server.Config{Dir: dir, Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}}, Lease: lease}
			start := func(t *testing.T, addr string, wait time.Duration) (*server.Server, net.Listener, chan error) {
				srv, err := server.New(cfg)
				if err != nil {
					t.Fatalf("server.New: %v", err)
				}
				// The grace period runs from server.New; the client
				// cannot connect until the listener exists.
				time.Sleep(wait)
				ln, err := net.Listen("tcp", addr)
				if err != nil {
					srv.Close()
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- srv.Serve(ln) }()
				return srv, ln, done
			}
			srv, ln, done := start(t, "127.0.0.1:0", 0)
			addr := ln.Addr().String()
			t.Cleanup(func() { srv.Close(); <-done })
			clienttest.RunRestart(t, dialer(addr, client.Options{}), func(t *testing.T) {
				srv.Close()
				<-done
				var wait time.Duration
				if tc.afterGrace {
					wait = lease + time.Second
				}
				srv, ln, done = start(t, addr, wait)
			})
		})
	}
}

// TestShoalLeaseRenewal leaves a client idle for several leases: its
// background renewal must keep its lock alive.
func TestShoalLeaseRenewal(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps for several leases")
	}
	dir := t.TempDir()
	noSquash := false
	srv, err := server.New(server.Config{Dir: dir, Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}}, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	dial := dialer(ln.Addr().String(), client.Options{})
	c1, c2 := dial(t), dial(t)
	defer c1.Close()
	defer c2.Close()
	ctx := t.Context()
	f1, err := c1.Open(ctx, "/leased", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	if err := f1.Lock(ctx, 0, 0, true, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // idle for four leases; c2 keeps renewing too
	f2, err := c2.Open(ctx, "/leased", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	if err := f2.Lock(ctx, 0, 0, true, false); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("lock of an idle but renewing client was lost: %v", err)
	}
	if _, err := f1.ReadAt(make([]byte, 1), 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("idle client's open stopped working: %v", err)
	}
}

func TestShoalReplay(t *testing.T) {
	clienttest.RunReplay(t, startShoal(t), client.Options{})
}

// shoalAndGanesha are the two servers a client test runs against, each
// with the options its export needs (Ganesha's is skipped unless enabled).
var shoalAndGanesha = map[string]func(t *testing.T) (string, client.Options){
	"shoal": func(t *testing.T) (string, client.Options) { return startShoal(t), client.Options{} },
	"ganesha": func(t *testing.T) (string, client.Options) {
		return ganeshaAddr(t), client.Options{Root: "/export"}
	},
}

// TestMinorVersionFallback asks for NFSv4.3, which no server speaks: the
// client must step down on NFS4ERR_MINOR_VERS_MISMATCH.
func TestMinorVersionFallback(t *testing.T) {
	for name, target := range shoalAndGanesha {
		t.Run(name, func(t *testing.T) {
			addr, opts := target(t)
			opts.MinorVersion = 3
			c := dialer(addr, opts)(t)
			defer c.Close()
			if v := c.MinorVersion(); v != 2 {
				t.Fatalf("negotiated minor version %d, want 2", v)
			}
			if _, err := c.Stat(t.Context(), "/"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestUnprivileged runs clienttest.RunUnprivileged with a second client
// whose AUTH_SYS credential is uid 1000.
func TestUnprivileged(t *testing.T) {
	for name, target := range shoalAndGanesha {
		t.Run(name, func(t *testing.T) {
			addr, opts := target(t)
			user := opts
			user.UID, user.GID = 1000, 1000
			clienttest.RunUnprivileged(t, dialer(addr, opts), dialer(addr, user))
		})
	}
}

// TestStatfsMatchesDisk compares Client.Statfs with statfs(2) of the
// directories the server keeps its data in: one for a single server, the
// sum over the data servers for a pNFS metadata server (from their
// heartbeats, so it is polled for until the first ones arrived), and
// Ganesha's export directory.
func TestStatfsMatchesDisk(t *testing.T) {
	targets := map[string]func(t *testing.T) (addr string, opts client.Options, dirs []string){
		"shoal": func(t *testing.T) (string, client.Options, []string) {
			dir := t.TempDir()
			return startShoalIn(t, dir), client.Options{}, []string{dir}
		},
		"pnfs": func(t *testing.T) (string, client.Options, []string) {
			cl := startCluster(t, 2)
			// Both data servers keep their data in temporary
			// directories of the test, on the file system of this one.
			dir := t.TempDir()
			return cl.MDS.Addr.String(), client.Options{}, []string{dir, dir}
		},
		"ganesha": func(t *testing.T) (string, client.Options, []string) {
			addr := ganeshaAddr(t)
			return addr, client.Options{Root: "/export"}, []string{filepath.Join(ganesha.dir, "export")}
		},
	}
	for name, target := range targets {
		t.Run(name, func(t *testing.T) {
			addr, opts, dirs := target(t)
			c := dialT(t, addr, opts)
			var want client.FSStat
			for _, d := range dirs {
				var st unix.Statfs_t
				if err := unix.Statfs(d, &st); err != nil {
					t.Fatal(err)
				}
				bs := uint64(st.Bsize)
				want.Total += st.Blocks * bs
				want.Free += st.Bfree * bs
			}
			var got client.FSStat
			for range 300 { // data servers report every few seconds
				var err error
				if got, err = c.Statfs(t.Context(), "/"); err != nil {
					t.Fatal(err)
				}
				if got.Total != 0 {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			// Other tests write meanwhile: free space may move a little.
			tol := want.Total / 20
			if got.Total != want.Total || diff(got.Free, want.Free) > tol || got.Avail > got.Free {
				t.Errorf("statfs: total %d, free %d, avail %d; disk: total %d, free %d (tolerance %d)",
					got.Total, got.Free, got.Avail, want.Total, want.Free, tol)
			}
			if got.Files == 0 || got.FilesFree == 0 || got.FilesFree > got.Files {
				t.Errorf("statfs: %d files, %d free", got.Files, got.FilesFree)
			}
		})
	}
}

func diff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}
