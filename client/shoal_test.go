package client_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/client/clienttest"
	"github.com/shoalfs/shoal/server"
)

// startShoal runs Shoal's own server in-process on a loopback port, with
// root squashing off so the suite may chown, and returns its address.
func startShoal(tb testing.TB) string {
	tb.Helper()
	noSquash := false
	srv, err := server.New(server.Config{
		Dir:     tb.TempDir(),
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

// TestShoalRestart restarts Shoal's server on the same directory and port;
// its grace period (one lease) makes the client reclaim with CLAIM_PREVIOUS.
func TestShoalRestart(t *testing.T) {
	dir := t.TempDir()
	noSquash := false
	cfg := server.Config{Dir: dir, Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}}, Lease: 3 * time.Second}
	start := func(t *testing.T, addr string) (*server.Server, net.Listener, chan error) {
		srv, err := server.New(cfg)
		if err != nil {
			t.Fatalf("server.New: %v", err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		return srv, ln, done
	}
	srv, ln, done := start(t, "127.0.0.1:0")
	addr := ln.Addr().String()
	t.Cleanup(func() { srv.Close(); <-done })
	clienttest.RunRestart(t, dialer(addr, client.Options{}), func(t *testing.T) {
		srv.Close()
		<-done
		srv, ln, done = start(t, addr)
	})
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

// TestMinorVersionFallback asks for NFSv4.3, which no server speaks: the
// client must step down on NFS4ERR_MINOR_VERS_MISMATCH.
func TestMinorVersionFallback(t *testing.T) {
	targets := map[string]func(t *testing.T) (string, client.Options){
		"shoal": func(t *testing.T) (string, client.Options) { return startShoal(t), client.Options{} },
		"ganesha": func(t *testing.T) (string, client.Options) {
			return ganeshaAddr(t), client.Options{Root: "/export"}
		},
	}
	for name, target := range targets {
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
