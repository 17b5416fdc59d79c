package posix

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/fusemount"
	"github.com/shoalfs/shoal/internal/bench"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// helperEnv makes the test binary act as a helper process (see TestMain).
const helperEnv = "SHOAL_POSIX_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode, os.Args[len(os.Args)-1]))
	}
	os.Exit(m.Run())
}

// requireFUSE skips the test when FUSE mounts cannot work here.
func requireFUSE(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("FUSE unavailable (%v): these tests mount a file system; load the fuse module or run where /dev/fuse exists", err)
	}
	f.Close()
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			t.Skip("not root and no fusermount3 in PATH: cannot mount FUSE (apt-get install fuse3)")
		}
	}
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func noSquashExports() []*server.Export {
	noSquash := false
	return []*server.Export{{Path: "/", RootSquash: &noSquash}}
}

// startServer runs a single Shoal server on a loopback port.
func startServer(t *testing.T) string {
	t.Helper()
	return startServerIn(t, t.TempDir())
}

// startServerIn is startServer keeping the server's data in dir.
func startServerIn(t *testing.T, dir string) string {
	t.Helper()
	srv, err := server.New(server.Config{Dir: dir, Exports: noSquashExports(), Logger: quietLogger()})
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
	t.Cleanup(func() {
		srv.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("server did not stop within 10s")
		}
	})
	return ln.Addr().String()
}

// startCluster runs a pNFS metadata server with two data servers.
func startCluster(t *testing.T) *wiring.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := wiring.Start(ctx, wiring.Config{
		Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0",
		StripeUnit: 64 << 10, Exports: noSquashExports(), Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("wiring.Start: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// mountpoint makes a directory that every uid may traverse, so that
// permission cases can run as an unprivileged user.
func mountpoint(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shoal-posix-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return mnt
}

// mount mounts addr's export and unmounts it when the test ends, also on
// failure; a mount that stays busy is detached so none is left behind.
func mount(t *testing.T, addr string, access fusemount.Access) string {
	t.Helper()
	return mountRoot(t, addr, "/", access)
}

// mountRoot is mount of the directory export of the server's namespace.
func mountRoot(t *testing.T, addr, export string, access fusemount.Access) string {
	t.Helper()
	dir := mountpoint(t)
	root := os.Geteuid() == 0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := fusemount.New(ctx, dir, fusemount.Config{
		Addr: addr, Root: export, Access: access,
		UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
		PerCaller: root, AllowOther: root,
		Client: client.Options{DialTimeout: 10 * time.Second},
		Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			if err := fusemount.Unmount(dir, true); err != nil {
				t.Errorf("lazy unmount: %v", err)
			}
		}
		if ok, err := fusemount.Mounted(dir); err != nil || ok {
			t.Errorf("%s still mounted after the test (err %v)", dir, err)
		}
	})
	if ok, err := fusemount.Mounted(dir); err != nil || !ok {
		t.Fatalf("%s not in mountinfo after mount (err %v)", dir, err)
	}
	return dir
}

func TestSingleServer(t *testing.T) {
	requireFUSE(t)
	addr := startServer(t)
	for _, access := range []fusemount.Access{fusemount.AccessCached, fusemount.AccessODirect, fusemount.AccessDirect} {
		t.Run(access.String(), func(t *testing.T) {
			mnt := mount(t, addr, access)
			// Both mounts share the server: each runs in its own directory.
			dir := filepath.Join(mnt, access.String())
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			runSuite(t, dir, access != fusemount.AccessCached)
		})
	}
}

func TestCluster(t *testing.T) {
	requireFUSE(t)
	c := startCluster(t)
	runSuite(t, mount(t, c.MDS.Addr.String(), fusemount.AccessCached), false)
	// The file data went the pNFS way: layouts from the metadata server,
	// WRITEs and READs to both data servers.
	if n := c.MDS.Server.Stats().Ops["LAYOUTGET"]; n == 0 {
		t.Error("the metadata server granted no layouts")
	}
	for i, ds := range c.DS {
		if st := ds.Server.Stats(); st.WriteBytes == 0 || st.ReadBytes == 0 {
			t.Errorf("data server %d: %d bytes written, %d read; want both > 0", i, st.WriteBytes, st.ReadBytes)
		}
	}
}

// TestGanesha mounts NFS-Ganesha, a server Shoal did not write, with
// every access method and runs the suite on it: the mount must serve any
// NFSv4.1 server through the client library, not only Shoal's.
func TestGanesha(t *testing.T) {
	if os.Getenv("SHOAL_GANESHA") != "1" {
		t.Skip("set SHOAL_GANESHA=1 to run against NFS-Ganesha")
	}
	requireFUSE(t)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	g := &bench.Ganesha{Script: filepath.Join(wd, "..", "..", "scripts", "ganesha.sh"), Dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ep, err := g.Start(ctx)
	if err != nil {
		t.Fatalf("starting NFS-Ganesha: %v", err)
	}
	t.Cleanup(func() {
		if err := ep.Stop(context.Background()); err != nil {
			t.Errorf("stopping NFS-Ganesha: %v", err)
		}
	})
	looseSymlinkTimes = true
	defer func() { looseSymlinkTimes = false }()
	for _, access := range []fusemount.Access{fusemount.AccessCached, fusemount.AccessODirect, fusemount.AccessDirect} {
		t.Run(access.String(), func(t *testing.T) {
			mnt := mountRoot(t, ep.Addr, ep.Root, access)
			dir := filepath.Join(mnt, access.String())
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			runSuite(t, dir, access != fusemount.AccessCached)
		})
	}
}

// runSuite runs every case (or with dataOnly, those that move file data)
// in its own directory of the mount.
func runSuite(t *testing.T, mnt string, dataOnly bool) {
	for _, tc := range suite {
		if dataOnly && !tc.data {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root")
			}
			if tc.tool != "" {
				if _, err := exec.LookPath(tc.tool); err != nil {
					t.Skipf("%s not installed", tc.tool)
				}
			}
			dir := filepath.Join(mnt, tc.name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			tc.fn(t, dir)
		})
	}
}

// run runs a command and fails the test, with its output, if it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// command prepares a program run with a one-minute limit. It never sets
// the working directory: the child would chdir into the mount between fork
// and exec, while it still shares this process's memory (vfork), and a
// FUSE request this process must answer then can deadlock it. Programs
// get absolute paths (git: -C) instead.
func command(name string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	time.AfterFunc(time.Minute, cancel) // releases the context's timer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// helper runs the test binary as a helper process in the given mode.
func helper(mode, path string) *exec.Cmd {
	cmd := command(os.Args[0], "-test.run=^$", path)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	return cmd
}

func errIs(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return fmt.Errorf("got error %v, want %v", err, target)
}

// TestCloseToOpen checks the cached access method across two mounts of one
// server: a reader that reopens a file sees what another mount wrote and
// closed, even when the size did not change, and keeps its page cache when
// nothing changed.
func TestCloseToOpen(t *testing.T) {
	requireFUSE(t)
	addr := startServer(t)
	a, b := mount(t, addr, fusemount.AccessCached), mount(t, addr, fusemount.AccessCached)
	pa, pb := filepath.Join(a, "shared"), filepath.Join(b, "shared")
	steps := []struct {
		write   bool
		content string // same length each time: size alone cannot tell
	}{
		{true, "first version"},
		{true, "other version"},
		{false, "other version"}, // unchanged: the reader keeps its cache
		{true, "third version"},
	}
	for i, s := range steps {
		if s.write {
			if err := os.WriteFile(pa, []byte(s.content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(pb)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != s.content {
			t.Fatalf("step %d: other mount read %q, want %q", i, got, s.content)
		}
	}
}

// TestStatfs checks that statfs(2) on the mount (what df shows) reports
// the space of the disk the server keeps its data on, and its file counts.
func TestStatfs(t *testing.T) {
	requireFUSE(t)
	dir := t.TempDir()
	mnt := mount(t, startServerIn(t, dir), fusemount.AccessCached)
	var disk, got unix.Statfs_t
	if err := unix.Statfs(dir, &disk); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(mnt, &got); err != nil {
		t.Fatalf("statfs of the mount: %v", err)
	}
	total, free := disk.Blocks*uint64(disk.Bsize), disk.Bfree*uint64(disk.Bsize)
	unit := uint64(got.Frsize)
	// The mount counts in larger blocks, rounded down; other tests may
	// write meanwhile, so free space is compared loosely.
	tol := total / 20
	if unit == 0 || got.Blocks*unit > total || total-got.Blocks*unit >= unit ||
		diff(got.Bfree*unit, free) > tol+unit || got.Bavail > got.Bfree {
		t.Errorf("mount: %d blocks of %d, %d free, %d available; disk: %d bytes, %d free",
			got.Blocks, unit, got.Bfree, got.Bavail, total, free)
	}
	if got.Files == 0 || got.Ffree == 0 || got.Ffree > got.Files {
		t.Errorf("mount: %d files, %d free", got.Files, got.Ffree)
	}
	if df, err := exec.LookPath("df"); err == nil {
		// df -P: a header, then filesystem, 1024-blocks, used, available, ...
		out := run(t, df, "-P", mnt)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		f := strings.Fields(lines[len(lines)-1])
		if len(f) < 4 || f[1] == "0" || f[1] == "-" {
			t.Errorf("df shows no size for the mount:\n%s", out)
		}
	}
}

func diff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}
