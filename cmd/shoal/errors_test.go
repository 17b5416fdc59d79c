package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestCLIErrors runs the shoal binary as a user would, with command lines
// that go wrong, and checks the exit status and what it says on stderr:
// every error names what failed and, where there is one, the next step.
// The servers are real: a `shoal up` process (one data server, root
// squashed) and loopback listeners that are not NFS servers.
func TestCLIErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the shoal binary")
	}
	bin := buildShoal(t)
	tmp := t.TempDir()

	upDir := filepath.Join(tmp, "up")
	up := startUp(t, bin, upDir, "--root-squash")
	mdsURL := "nfs://" + up.MDS

	refused := closedPort(t)
	silent := fakeServer(t, func(c net.Conn) { <-t.Context().Done() })
	web := fakeServer(t, func(c net.Conn) {
		buf := make([]byte, 512)
		c.Read(buf)
		c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
		<-t.Context().Done()
	})
	hangup := fakeServer(t, func(c net.Conn) {})

	local := filepath.Join(tmp, "local.txt")
	if err := os.WriteFile(local, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory with something of the user's in it, for a start that
	// fails: it must keep what it had and gain nothing.
	kept := filepath.Join(tmp, "kept")
	if err := os.MkdirAll(kept, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kept, "notes"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string      // substrings of stderr (of stdout for code 0)
		not  []string      // must not appear
		max  time.Duration // how long it may take (default 10s)
		post func(t *testing.T)
	}{
		{
			name: "wrong port names every server command",
			args: []string{"ls", "nfs://" + refused + "/"},
			code: 1,
			want: []string{"connection refused to " + refused, "shoal serve, shoal up or shoal mds"},
		},
		{
			name: "port that accepts and says nothing",
			args: []string{"ls", "nfs://" + silent + "/"},
			code: 1,
			want: []string{silent + " did not answer as an NFSv4 server", "no answer", "is that the address of a Shoal server"},
			not:  []string{"context deadline exceeded"},
			max:  8 * time.Second,
		},
		{
			name: "web server",
			args: []string{"ls", "nfs://" + web + "/"},
			code: 1,
			want: []string{web + " did not answer as an NFSv4 server", "not an RPC reply"},
			max:  3 * time.Second,
		},
		{
			name: "port that hangs up",
			args: []string{"stat", "nfs://" + hangup + "/x"},
			code: 1,
			want: []string{hangup + " did not answer as an NFSv4 server", "closed the connection"},
			max:  3 * time.Second,
		},
		{
			name: "data server instead of the MDS",
			args: []string{"ls", "nfs://" + up.DataServers[0] + "/"},
			code: 1,
			want: []string{up.DataServers[0] + " is a Shoal data server", "use the metadata server's address"},
			not:  []string{"PUTROOTFH", "NOTSUPP"},
		},
		{
			name: "put of a missing local file",
			args: []string{"put", filepath.Join(tmp, "missing.txt"), mdsURL + "/x"},
			code: 1,
			want: []string{"put " + filepath.Join(tmp, "missing.txt") + ": no such file or directory"},
		},
		{
			name: "put as root into a root-squashed export",
			args: []string{"put", "--uid", "0", "--gid", "0", local, mdsURL + "/"},
			code: 1,
			want: []string{"put " + mdsURL + "/local.txt: permission denied", "you are root", "--no-root-squash", "root_squash: false"},
		},
		{
			name: "put as another user is not told about root",
			args: []string{"put", "--uid", "1000", "--gid", "1000", local, mdsURL + "/"},
			code: 1,
			want: []string{"permission denied"},
			not:  []string{"you are root"},
		},
		{
			name: "second shoal up on a directory in use",
			args: []string{"up", "--listen", "127.0.0.1:0", "--ds", "1", "--dir", upDir},
			code: 1,
			want: []string{upDir + " is in use by another shoal process (pid " + strconv.Itoa(up.PID) + ")", "another --dir"},
			not:  []string{"timeout"},
			max:  3 * time.Second,
			post: func(t *testing.T) { mustExist(t, filepath.Join(upDir, "mds", "meta.db")) },
		},
		{
			name: "shoal serve on a directory in use",
			args: []string{"serve", "--listen", "127.0.0.1:0", "--dir", upDir},
			code: 1,
			want: []string{upDir + " is in use by another shoal process"},
			max:  3 * time.Second,
		},
		{
			name: "shoal mds on a directory in use",
			args: []string{"mds", "--listen", "127.0.0.1:0", "--dir", upDir},
			code: 1,
			want: []string{upDir + " is in use by another shoal process"},
			max:  3 * time.Second,
		},
		{
			name: "shoal mds on the directory of shoal up's MDS",
			args: []string{"mds", "--listen", "127.0.0.1:0", "--dir", filepath.Join(upDir, "mds")},
			code: 1,
			want: []string{filepath.Join(upDir, "mds") + " is in use by another shoal process (pid " + strconv.Itoa(up.PID) + ")"},
			not:  []string{"timeout"},
			max:  3 * time.Second,
		},
		{
			name: "shoal ds on the directory of one of shoal up's data servers",
			args: []string{"ds", "--listen", "127.0.0.1:0", "--dir", filepath.Join(upDir, "ds0"), "--mds", up.MDS, "--join-secret-file", filepath.Join(upDir, "mds", "join-secret")},
			code: 1,
			want: []string{filepath.Join(upDir, "ds0") + " is in use by another shoal process (pid " + strconv.Itoa(up.PID) + ")"},
			max:  3 * time.Second,
		},
		{
			name: "failed shoal up leaves no directory",
			args: []string{"up", "--listen", up.MDS, "--ds", "1", "--dir", filepath.Join(tmp, "fresh-up2")},
			code: 1,
			want: []string{up.MDS + " is in use by another process"},
			post: func(t *testing.T) { mustNotExist(t, filepath.Join(tmp, "fresh-up2")) },
		},
		{
			name: "port out of range in a URL",
			args: []string{"ls", "nfs://127.0.0.1:99999/"},
			code: 1,
			want: []string{"nfs://127.0.0.1:99999/: port 99999 is not a number from 1 to 65535"},
			not:  []string{"address 99999"},
		},
		{
			name: "port out of range to listen on leaves no directory",
			args: []string{"up", "--listen", "127.0.0.1:99999", "--dir", filepath.Join(tmp, "fresh-up")},
			code: 1,
			want: []string{"--listen 127.0.0.1:99999: port 99999 is not a number from 0 to 65535"},
			not:  []string{"address 99999"},
			post: func(t *testing.T) { mustNotExist(t, filepath.Join(tmp, "fresh-up")) },
		},
		{
			name: "failed serve leaves no meta.db",
			args: []string{"serve", "--listen", up.MDS, "--dir", filepath.Join(tmp, "fresh-serve")},
			code: 1,
			want: []string{up.MDS + " is in use by another process"},
			post: func(t *testing.T) { mustNotExist(t, filepath.Join(tmp, "fresh-serve")) },
		},
		{
			name: "failed mds keeps the directory's own files",
			args: []string{"mds", "--listen", up.MDS, "--dir", kept},
			code: 1,
			want: []string{up.MDS + " is in use by another process"},
			post: func(t *testing.T) {
				ents, err := os.ReadDir(kept)
				if err != nil || len(ents) != 1 || ents[0].Name() != "notes" {
					t.Errorf("%s after the failed start: %v, %v; want only notes", kept, ents, err)
				}
			},
		},
		{
			name: "stray argument",
			args: []string{"up", "extra-arg"},
			code: 1,
			want: []string{`unknown command "extra-arg" for "shoal up"`, "usage: shoal up"},
		},
		{
			name: "missing argument",
			args: []string{"mv", mdsURL + "/a"},
			code: 1,
			want: []string{"accepts 2 arg(s), received 1", "usage: shoal mv FROM-URL TO-URL"},
		},
		{
			name: "umount of a directory that is not mounted",
			args: []string{"umount", tmp},
			code: 1,
			want: []string{"umount " + tmp + ": not mounted"},
			not:  []string{"invalid argument"},
		},
		{
			name: "bad size",
			args: []string{"cp", "--chunk", "4 parsecs", local, filepath.Join(tmp, "copy")},
			code: 1,
			want: []string{`--chunk: bad size "4 parsecs"`, "64KiB (65536)", "64KB (64000)"},
		},
		{
			name: "bench help shows each default once",
			args: []string{"bench", "--help"},
			code: 0,
			want: []string{`--size string`, `(default "1GiB")`},
			not:  []string{"(default 256MiB) (default", "(default 500) (default", "--label shoal", "--servers shoal", "--testbed shoal"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			max := tc.max
			if max == 0 {
				max = 10 * time.Second
			}
			start := time.Now()
			code, stdout, stderr := runShoal(t, bin, 30*time.Second, tc.args...)
			took := time.Since(start)
			out := stderr
			if tc.code == 0 {
				out = stdout
			}
			if code != tc.code {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not say %q:\n%s", w, out)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("output says %q:\n%s", n, out)
				}
			}
			if took > max {
				t.Errorf("took %v, want at most %v", took.Round(time.Millisecond), max)
			}
			if tc.post != nil {
				tc.post(t)
			}
		})
	}
}

// buildShoal builds the shoal binary into a directory of the test, with
// the go build flags given (-tags noplot).
func buildShoal(t *testing.T, flags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "shoal")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if p, err := exec.LookPath("go"); err == nil {
		goBin = p
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, goBin, append(append([]string{"build"}, flags...), "-o", bin, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runShoal runs the binary with args, bounded by limit, and returns its
// exit status and output.
func runShoal(t *testing.T, bin string, limit time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("shoal %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("shoal %s: still running after %v", strings.Join(args, " "), limit)
	}
	return code, o.String(), e.String()
}

// upCluster is what `shoal up --ready-file` writes.
type upCluster struct {
	MDS         string   `json:"mds"`
	DataServers []string `json:"data_servers"`
	PID         int      `json:"pid"`
}

// startUp starts `shoal up` with one data server on loopback and waits
// until it is ready; the cluster stops when the test ends.
func startUp(t *testing.T, bin, dir string, extra ...string) upCluster {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready.json")
	args := append([]string{"up", "--listen", "127.0.0.1:0", "--ds", "1", "--dir", dir, "--ready-file", ready, "--log-level", "warn"}, extra...)
	cmd := exec.Command(bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("shoal up did not stop within 30s of SIGTERM")
		}
	})
	deadline := time.After(60 * time.Second)
	for {
		if b, err := os.ReadFile(ready); err == nil && len(b) > 0 {
			var c upCluster
			if err := json.Unmarshal(b, &c); err == nil && len(c.DataServers) > 0 {
				return c
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("shoal up exited: %v\n%s", err, logs.String())
		case <-deadline:
			t.Fatalf("shoal up not ready after 60s\n%s", logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// fakeServer listens on loopback and runs serve on each connection, which
// it closes afterwards; it returns the address.
func fakeServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func mustExist(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("%s is gone: %v", path, err)
	}
}

func mustNotExist(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is left behind (stat: %v)", path, err)
	}
}
