package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta/etcdtest"
)

// TestServeEtcdMeta runs `shoal serve --meta etcd://...` against a real
// etcd, writes with the file commands, restarts the server and reads back.
func TestServeEtcdMeta(t *testing.T) {
	etcd := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	metaURL := "etcd://" + etcd.Endpoints[0] + "/cmdtest"
	dir := t.TempDir()
	serve := func() (base string, stop func()) {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		ctx, cancel := context.WithCancel(t.Context())
		// The serve command alone, not under a root command: root
		// commands share a global (--log-level) that run, called while
		// this one runs, would write concurrently.
		cmd := newServeCmd()
		cmd.SetArgs([]string{"--listen", addr, "--dir", dir, "--meta", metaURL, "--no-root-squash", "--lease", "2s"})
		done := make(chan error, 1)
		go func() { done <- cmd.ExecuteContext(ctx) }()
		for range 200 {
			select {
			case err := <-done:
				cancel()
				t.Fatalf("shoal serve exited: %v", err)
			default:
			}
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				return "nfs://" + addr, func() {
					cancel()
					if err := <-done; err != nil {
						t.Errorf("shoal serve: %v", err)
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		<-done
		t.Fatalf("shoal serve did not listen on %s within 10s", addr)
		return "", nil
	}
	src := filepath.Join(t.TempDir(), "hello.txt")
	if err := os.WriteFile(src, []byte("hello from etcd metadata\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	base, stop := serve()
	for _, args := range [][]string{{"mkdir", "-p", base + "/x/y"}, {"put", src, base + "/x/y/"}} {
		if out, err := run(t, args...); err != nil {
			stop()
			t.Fatalf("shoal %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	stop()
	if _, err := os.Stat(filepath.Join(dir, "meta.db")); err == nil {
		t.Fatal("serve --meta etcd:// created meta.db")
	}

	base, stop = serve()
	defer stop()
	if out, err := run(t, "cat", base+"/x/y/hello.txt"); err != nil || out != "hello from etcd metadata\n" {
		t.Fatalf("cat after restart: %q %v", out, err)
	}
	if out, err := run(t, "ls", base+"/x"); err != nil || out != "y\n" {
		t.Fatalf("ls after restart: %q %v", out, err)
	}
}

func TestMetaFlagInvalid(t *testing.T) {
	for _, cmd := range []string{"serve", "mds"} {
		for _, u := range []string{"etcd:///p", "bbolt", "etcd://h:1,,h:2/p"} {
			_, err := run(t, cmd, "--dir", t.TempDir(), "--listen", "127.0.0.1:0", "--meta", u)
			if err == nil || !strings.Contains(err.Error(), "--meta") {
				t.Errorf("shoal %s --meta %s: %v, want a --meta error", cmd, u, err)
			}
		}
	}
}
