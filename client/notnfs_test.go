package client_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// TestDialNotNFS dials addresses where something other than an NFS server
// listens: Dial must fail with ErrNotNFS within a few seconds, not wait out
// its DialTimeout.
func TestDialNotNFS(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(ctx context.Context, c net.Conn)
	}{
		{"silent", func(ctx context.Context, c net.Conn) { <-ctx.Done() }},
		{"web server", func(ctx context.Context, c net.Conn) {
			c.Read(make([]byte, 512))
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			<-ctx.Done()
		}},
		{"hangs up", func(ctx context.Context, c net.Conn) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := listen(t, tc.serve)
			start := time.Now()
			c, err := client.Dial(t.Context(), addr, client.Options{DialTimeout: 30 * time.Second})
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if !errors.Is(err, client.ErrNotNFS) {
				t.Errorf("Dial: %v, want ErrNotNFS", err)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("Dial took %v", took)
			}
		})
	}
}

// listen serves each connection to a loopback listener with serve until
// the test ends.
func listen(t *testing.T, serve func(ctx context.Context, c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				serve(ctx, c)
			})
		}
	})
	return ln.Addr().String()
}
