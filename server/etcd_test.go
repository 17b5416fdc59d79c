package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/meta/etcdtest"
	"github.com/shoalfs/shoal/server"
)

// TestEtcdMetadata runs a server whose metadata lives in a real etcd,
// writes through the Go client over loopback TCP, restarts the server on
// the same etcd prefix and reads everything back.
func TestEtcdMetadata(t *testing.T) {
	etcd := etcdtest.Start(t, 1, etcdtest.Options{})
	metaURL := "etcd://" + etcd.Endpoints[0] + "/srvtest"
	dir := t.TempDir()
	noSquash := false
	cfg := server.Config{
		Dir: dir, MetaURL: metaURL, Lease: 2 * time.Second,
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
	}
	start := func() (addr string, stop func()) {
		t.Helper()
		srv, err := server.New(cfg)
		if err != nil {
			t.Fatalf("server.New: %v", err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		return ln.Addr().String(), func() {
			if err := srv.Close(); err != nil {
				t.Errorf("server Close: %v", err)
			}
			<-done
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	data := bytes.Repeat([]byte("etcd-backed "), 10000)

	addr, stop := start()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	if err := c.Mkdir(ctx, "/dir", 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := c.Open(ctx, "/dir/file", os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Symlink(ctx, "file", "/dir/link"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	stop()

	// The namespace is in etcd, not in a database in Dir.
	if _, err := os.Stat(filepath.Join(dir, "meta.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("meta.db in the data directory: %v", err)
	}
	opts, err := meta.ParseEtcdURL(metaURL)
	if err != nil {
		t.Fatal(err)
	}
	e, err := meta.OpenEtcd(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.Lookup(ctx, meta.RootIno, "dir")
	if err == nil {
		var n meta.Node
		if n, err = e.Lookup(ctx, d.Ino, "file"); err == nil && n.Attr.Size != uint64(len(data)) {
			t.Errorf("size in etcd %d, want %d", n.Attr.Size, len(data))
		}
	}
	e.Close()
	if err != nil {
		t.Fatalf("file not in etcd: %v", err)
	}

	addr, stop = start()
	defer stop()
	c, err = client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err = c.Open(ctx, "/dir/file", os.O_RDONLY, 0) // waits out the grace period
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	f.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes (%v), want %d", len(got), err, len(data))
	}
	if target, err := c.Readlink(ctx, "/dir/link"); err != nil || target != "file" {
		t.Fatalf("readlink %q %v", target, err)
	}
	ents, err := c.ReadDir(ctx, "/dir")
	var names []string
	for _, en := range ents {
		names = append(names, en.Name)
	}
	if err != nil || strings.Join(names, " ") != "file link" {
		t.Fatalf("readdir %v %v", names, err)
	}
}

func TestBadMetaURL(t *testing.T) {
	for _, u := range []string{"etcd:///nohost", "bbolt", "etcd://127.0.0.1:1,/p"} {
		if srv, err := server.New(server.Config{Dir: t.TempDir(), MetaURL: u}); err == nil {
			srv.Close()
			t.Errorf("server.New accepted MetaURL %q", u)
		}
	}
}
