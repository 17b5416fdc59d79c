package client_test

import (
	"context"
	"errors"
	"net"
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

func dialer(addr string, opts client.Options) clienttest.Dialer {
	return func(t *testing.T) *client.Client {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, addr, opts)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		return c
	}
}

func TestShoal(t *testing.T) {
	clienttest.Run(t, dialer(startShoal(t), client.Options{}))
}
