package wiring

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// TestMDSFirstStartSubtreeExports: a fresh MDS whose exports are subtrees
// creates their root directories before it looks for a cluster record;
// those directories are not data of an older server, so the MDS must
// start (it did not: the diskless recipe's /images and /nodes exports
// stopped it on its first start), and start again on the same directory.
// A store with a regular file and no cluster record is still refused.
func TestMDSFirstStartSubtreeExports(t *testing.T) {
	f := false
	exports := func() []*server.Export {
		return []*server.Export{
			{Path: "/images", ReadOnly: true, WriteClients: []string{"127.0.0.1"}, RootSquash: &f},
			{Path: "/nodes/rack1", RootSquash: &f},
		}
	}
	dir := t.TempDir()
	for i := range 2 {
		m, err := StartMDS(MDSConfig{Listen: "127.0.0.1:0", Dir: dir, Exports: exports(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("start %d of an MDS exporting subtrees: %v", i+1, err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// What shoal serve leaves behind: a file whose data is not on any
	// data server, and no cluster record.
	legacy := t.TempDir()
	srv, err := server.New(server.Config{Dir: legacy, Exports: exports(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nd, err := srv.Meta().Lookup(ctx, meta.RootIno, "images")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := srv.Meta().Create(ctx, nd.Ino, "vmlinuz", meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Now()); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	_, err = StartMDS(MDSConfig{Listen: "127.0.0.1:0", Dir: legacy, Exports: exports(), Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "no cluster record") {
		t.Fatalf("MDS on a store with a file and no cluster record: %v, want a refusal", err)
	}
}
