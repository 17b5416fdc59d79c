package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	if msg := describe(err); msg != "connection refused to "+addr+": is `shoal serve` running?" {
		t.Fatalf("message %q", msg)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) {
		t.Fatalf("dial error lost its type: %T", err)
	}
}
