package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// startServer runs Shoal's server in-process on a loopback port and returns
// the nfs:// URL prefix for it.
func startServer(t *testing.T) string {
	t.Helper()
	noSquash := false
	srv, err := server.New(server.Config{Dir: t.TempDir(), Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("server did not stop")
		}
	})
	return "nfs://" + ln.Addr().String()
}

// run executes the shoal command line args and returns its output.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--log-level", "error"}, args...))
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

func TestFileCommands(t *testing.T) {
	base := startServer(t)
	local := t.TempDir()
	payload := bytes.Repeat([]byte("shoal file commands\n"), 300_000) // ~6 MB: split I/O
	src := filepath.Join(local, "payload.txt")
	if err := os.WriteFile(src, payload, 0o640); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		args    []string
		want    string // substring of the output, or of the error
		wantErr bool
	}{
		{args: []string{"mkdir", "-p", base + "/a/b/c"}},
		{args: []string{"mkdir", base + "/a"}, want: "mkdir " + base + "/a: file exists", wantErr: true},
		{args: []string{"put", src, base + "/a/b/"}},
		{args: []string{"ls", base + "/a/b"}, want: "c\npayload.txt\n"},
		{args: []string{"ls", "-l", base + "/a/b"}, want: "-rw-r-----"},
		{args: []string{"stat", base + "/a/b/payload.txt"}, want: "Size: 6000000"},
		{args: []string{"mv", base + "/a/b/payload.txt", base + "/a/moved.txt"}},
		{args: []string{"get", base + "/a/moved.txt", local}},
		{args: []string{"cat", base + "/a/moved.txt"}, want: "shoal file commands\n"},
		{args: []string{"stat", base + "/a/b/payload.txt"}, want: "stat " + base + "/a/b/payload.txt: no such file or directory", wantErr: true},
		{args: []string{"rm", base + "/a"}, want: "directory not empty", wantErr: true},
		{args: []string{"rm", "-r", base + "/a"}},
		{args: []string{"ls", base + "/"}, want: ""},
		{args: []string{"rm", base + "/a"}, want: "no such file or directory", wantErr: true},
		{args: []string{"ls", "http://x/"}, want: "is not an nfs://host[:port]/path URL", wantErr: true},
	}
	for _, s := range steps {
		out, err := run(t, s.args...)
		if (err != nil) != s.wantErr {
			t.Fatalf("shoal %s: err %v, want error %v\n%s", strings.Join(s.args, " "), err, s.wantErr, out)
		}
		got := out
		if err != nil {
			got = describe(err)
		}
		if !strings.Contains(got, s.want) {
			t.Fatalf("shoal %s: %q does not contain %q", strings.Join(s.args, " "), got, s.want)
		}
	}
	got, err := os.ReadFile(filepath.Join(local, "moved.txt"))
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("round trip through put/mv/get: %d bytes, %v", len(got), err)
	}
	if out, _ := run(t, "cat", base+"/nothing"); strings.Contains(out, "goroutine") {
		t.Fatalf("stack trace in output: %s", out)
	}
}

func TestFileCommandsConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = run(t, "ls", "nfs://"+addr+"/")
	if err == nil {
		t.Fatal("ls against a closed port succeeded")
	}
	if msg := describe(err); msg != "connection refused to "+addr+": is a Shoal server (shoal serve, shoal up or shoal mds) listening there?" {
		t.Fatalf("message %q", msg)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) {
		t.Fatalf("dial error lost its type: %T", err)
	}
}

// TestGetDataServerDown runs `shoal get` (and `shoal cp` to local disk) of
// a file striped over two data servers after one of them stopped, with a
// metadata server that cannot read its disk (like separate `shoal mds`
// and `shoal ds` processes): the copy must fail within the client's bound,
// name the data server, and leave no file that looks complete: no new
// file, an existing one unchanged, no temporary file from get.
func TestGetDataServerDown(t *testing.T) {
	dir := t.TempDir()
	noSquash := false
	mds, err := wiring.StartMDS(wiring.MDSConfig{
		Listen: "127.0.0.1:0", Dir: filepath.Join(dir, "mds"),
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
		Lease:   10 * time.Second, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mds.Close() })
	secret, err := cluster.ReadJoinSecret(mds.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	var dss []*wiring.DS
	for i := range 2 {
		d, err := wiring.StartDS(t.Context(), wiring.DSConfig{
			Listen: "127.0.0.1:0", Dir: filepath.Join(dir, fmt.Sprintf("ds%d", i)),
			MDS: []string{mds.Addr.String()}, JoinSecret: secret, Lease: 10 * time.Second, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		dss = append(dss, d)
	}
	t.Cleanup(func() {
		for _, d := range dss {
			if d != nil {
				d.Close()
			}
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := mds.Registry.WaitFor(ctx, 2); err != nil {
		t.Fatal(err)
	}
	base := "nfs://" + mds.Addr.String()

	local := t.TempDir()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16) // 4 stripe units: both data servers
	src := filepath.Join(local, "striped.bin")
	if err := os.WriteFile(src, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "put", src, base+"/"); err != nil {
		t.Fatalf("put: %v\n%s", err, out)
	}
	// A working get first, over an existing file.
	into := t.TempDir()
	old := []byte("the old contents\n")
	existing := filepath.Join(into, "existing.bin")
	if err := os.WriteFile(existing, old, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "get", base+"/striped.bin", existing); err != nil {
		t.Fatalf("get: %v\n%s", err, out)
	}
	if got, err := os.ReadFile(existing); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("get over an existing file: %d bytes, %v", len(got), err)
	}
	if err := os.WriteFile(existing, old, 0o600); err != nil {
		t.Fatal(err)
	}

	deadAddr := dss[1].Addr.String()
	if err := dss[1].Close(); err != nil {
		t.Fatal(err)
	}
	dss[1] = nil

	const budget = "1s"
	for _, tc := range []struct{ name, dst string }{
		{"into a directory", into},
		{"new file", filepath.Join(into, "new.bin")},
		{"existing file", existing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := run(t, "get", "--io-retry-timeout", budget, base+"/striped.bin", tc.dst)
			took := time.Since(start)
			if err == nil {
				t.Fatal("get with a data server down succeeded")
			}
			msg := describe(err)
			t.Logf("failed after %v: %s", took, msg)
			// A fresh `shoal get` gets no layout while a data server of
			// the file is out of service, so it names the data server
			// only if it can; otherwise it must say where to look.
			if !strings.HasPrefix(msg, "get "+base+"/striped.bin: ") ||
				(!strings.Contains(msg, "data server "+deadAddr) && !strings.Contains(msg, "shoal admin status")) {
				t.Errorf("message neither names data server %s nor points at shoal admin status: %q", deadAddr, msg)
			}
			if took > 10*time.Second {
				t.Errorf("get took %v with --io-retry-timeout %s", took, budget)
			}
			ents, err := os.ReadDir(into)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				if e.Name() != "existing.bin" {
					t.Errorf("failed get left %s behind", e.Name())
				}
			}
			if got, err := os.ReadFile(existing); err != nil || !bytes.Equal(got, old) {
				t.Errorf("failed get changed an existing file: %q, %v", got, err)
			}
		})
	}

	// cp writes under a temporary name (kept, with its journal, for
	// --resume) and never creates the file itself unless complete.
	t.Run("cp", func(t *testing.T) {
		to := t.TempDir()
		_, err := run(t, "cp", "-q", "--io-retry-timeout", budget, base+"/striped.bin", to)
		if err == nil {
			t.Fatal("cp with a data server down succeeded")
		}
		msg := describe(err)
		t.Logf("cp: %s", msg)
		if !strings.Contains(msg, deadAddr) && !strings.Contains(msg, "shoal admin status") {
			t.Errorf("cp message neither names data server %s nor points at shoal admin status: %q", deadAddr, msg)
		}
		if _, err := os.Stat(filepath.Join(to, "striped.bin")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("failed cp left striped.bin: %v", err)
		}
	})
}
