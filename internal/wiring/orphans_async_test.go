package wiring

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/server"
)

// TestAsyncFreerWaitsOncePerRound: on an async server, whose metadata log
// is synced only every commit interval, the orphan freer waits for that
// sync once per round of removed files (up to 1024) before it deletes
// their data, not once per file: a burst of removes is freed after a few
// of the interval's fdatasyncs. With one wait per file, eight at a time,
// 96 files took twelve or more, and a burst of thousands was freed at
// about eighty a second.
func TestAsyncFreerWaitsOncePerRound(t *testing.T) {
	const files = 96
	f := false
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := Start(ctx, Config{
		Dir: t.TempDir(), DataServers: 1, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Lease:   10 * time.Second, Logger: slog.New(slog.DiscardHandler),
		Async: true, CommitInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	c, err := client.Dial(ctx, cl.MDS.Addr.String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Mkdir(ctx, "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, _, err := c.Lookup(ctx, "/d")
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		fl, err := c.OpenAt(ctx, dir, "f"+strconv.Itoa(i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fl.Write([]byte("small")); err != nil {
			t.Fatal(err)
		}
		if err := fl.Close(); err != nil {
			t.Fatal(err)
		}
	}
	srv := cl.MDS.Server
	if err := srv.Meta().(interface{ Sync(context.Context) error }).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	before := srv.Stats().Log.Syncs
	for i := range files {
		if err := c.RemoveAt(ctx, dir, "f"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; ; i++ {
		inos, err := srv.Meta().Orphans(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(inos) == 0 {
			break
		}
		if i == 1000 {
			t.Fatalf("%d orphans not freed after 1000 polls", len(inos))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Per round one sync it waits for and one that makes its frees
	// durable, and spares for a burst that a slow machine splits over
	// more rounds.
	if syncs := srv.Stats().Log.Syncs - before; syncs > 6 {
		t.Errorf("freeing %d orphans took %d log fdatasyncs, want at most 6", files, syncs)
	}
}
