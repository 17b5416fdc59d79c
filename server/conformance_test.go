package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
	"github.com/shoalfs/shoal/store"
	"github.com/shoalfs/shoal/store/storetest"
)

// TestInlineStoreConformance runs the backend conformance suite on the
// data backend of a pNFS metadata server as the shoal binary wires it
// (wiring.Start, two data servers, the default inline limit): the inline
// store, which keeps files of up to server.DefaultInlineMax bytes in the
// metadata engine and moves them to the data servers (cluster.Striped)
// when they grow. The suite's small files stay inline, its larger ones
// move. The stripe unit is 64 KiB, so ranges cross units. Reopening
// restarts the whole cluster on its directory.
func TestInlineStoreConformance(t *testing.T) {
	dir := t.TempDir()
	start := func(t *testing.T) *wiring.Cluster {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		f := false
		c, err := wiring.Start(ctx, wiring.Config{
			Dir: dir, DataServers: 2, Listen: "127.0.0.1:0", StripeUnit: 64 << 10,
			Exports: []*server.Export{{Path: "/", RootSquash: &f}},
			Logger:  slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := start(t)
	t.Cleanup(func() { c.Close() })
	var seq atomic.Uint64
	storetest.Run(t, func(t *testing.T) storetest.Target {
		return storetest.Target{
			Backend: c.MDS.Server.DataBackend(),
			NewFile: func(t *testing.T) uint64 {
				nd, _, err := c.MDS.Server.Meta().Create(context.Background(), meta.RootIno,
					fmt.Sprintf("f%d", seq.Add(1)), meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Now())
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				return uint64(nd.Ino)
			},
			Reopen: func(t *testing.T) store.Backend {
				if err := c.Close(); err != nil {
					t.Fatalf("close the cluster: %v", err)
				}
				c = start(t)
				return c.MDS.Server.DataBackend()
			},
		}
	})
}
