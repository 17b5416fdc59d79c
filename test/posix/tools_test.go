package posix

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// runHelper is the body of a helper process (TestMain): it takes locks on
// path as a second process would, prints what it saw and exits 0 if that is
// what the parent expects.
func runHelper(mode, path string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stdout, "FAIL: "+format+"\n", args...)
		return 1
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fail("open: %v", err)
	}
	defer f.Close()
	fd := int(f.Fd())
	wr := func(start, length int64) *syscall.Flock_t {
		return &syscall.Flock_t{Type: syscall.F_WRLCK, Start: start, Len: length}
	}
	switch mode {
	case "lock-conflict":
		err := syscall.FcntlFlock(uintptr(fd), syscall.F_SETLK, wr(0, 10))
		if !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EACCES) {
			return fail("F_SETLK on a locked range: %v, want EAGAIN", err)
		}
		lk := wr(0, 10)
		if err := syscall.FcntlFlock(uintptr(fd), syscall.F_GETLK, lk); err != nil {
			return fail("F_GETLK: %v", err)
		}
		if lk.Type != syscall.F_WRLCK || lk.Start != 0 || lk.Len != 10 {
			return fail("F_GETLK reported type %d start %d len %d, want a write lock on [0,10)", lk.Type, lk.Start, lk.Len)
		}
		if err := syscall.FcntlFlock(uintptr(fd), syscall.F_SETLK, wr(20, 10)); err != nil {
			return fail("F_SETLK on a free range: %v", err)
		}
	case "flock-conflict":
		if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
			return fail("flock while the parent holds one: %v, want EWOULDBLOCK", err)
		}
		if err := syscall.Flock(fd, syscall.LOCK_SH|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
			return fail("shared flock while the parent holds an exclusive one: %v, want EWOULDBLOCK", err)
		}
	case "lock-wait":
		fmt.Println("waiting")
		if err := syscall.FcntlFlock(uintptr(fd), syscall.F_SETLKW, wr(0, 10)); err != nil {
			return fail("F_SETLKW: %v", err)
		}
	default:
		return fail("unknown helper mode %q", mode)
	}
	fmt.Println("ok")
	return 0
}

// testLocks takes fcntl locks against a second process.
func testLocks(t *testing.T, dir string) {
	p := filepath.Join(dir, "locked")
	write(t, p, strings.Repeat("x", 100))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := uintptr(f.Fd())
	if err := syscall.FcntlFlock(fd, syscall.F_SETLK, &syscall.Flock_t{Type: syscall.F_WRLCK, Start: 0, Len: 10}); err != nil {
		t.Fatalf("F_SETLK: %v", err)
	}
	if out, err := helper("lock-conflict", p).CombinedOutput(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}

	// flock on another file (the mount emulates flock with whole-file
	// byte-range locks, so it would meet the fcntl lock above).
	fp := filepath.Join(dir, "flocked")
	write(t, fp, "f")
	// Read-write: an exclusive flock is a write lock, which NFS grants
	// only to opens for writing (EBADF otherwise, as with the kernel
	// NFS client).
	ff, err := os.OpenFile(fp, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ff.Close()
	if err := syscall.Flock(int(ff.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("flock: %v", err)
	}
	if out, err := helper("flock-conflict", fp).CombinedOutput(); err != nil {
		t.Fatalf("flock helper: %v\n%s", err, out)
	}
	if err := syscall.Flock(int(ff.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatalf("flock unlock: %v", err)
	}

	// A waiter blocks in F_SETLKW until the lock is released.
	cmd := helper("lock-wait", p)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "waiting" {
		cmd.Wait()
		t.Fatalf("helper said %q", lines.Text())
	}
	if err := syscall.FcntlFlock(fd, syscall.F_SETLK, &syscall.Flock_t{Type: syscall.F_UNLCK, Start: 0, Len: 10}); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	lines.Scan()
	got := lines.Text()
	if err := cmd.Wait(); err != nil || got != "ok" {
		t.Fatalf("waiting helper: %v, said %q", err, got)
	}
	// The helper's locks went with it.
	if err := syscall.FcntlFlock(fd, syscall.F_SETLK, &syscall.Flock_t{Type: syscall.F_WRLCK, Start: 0, Len: 0}); err != nil {
		t.Fatalf("F_SETLK after the helper exited: %v", err)
	}
}

// makeTree writes a small tree of assorted files into dir.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, d := range []string{"a/b/c", "empty", "x y"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i, size := range []int{0, 1, 4096, 100_000, 1<<20 + 17} {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		name := filepath.Join(dir, []string{"zero", "a/one", "a/b/page", "a/b/c/mid", "x y/big file"}[i])
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "a/run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("b/page", filepath.Join(dir, "a/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "a/one"), filepath.Join(dir, "hard")); err != nil {
		t.Fatal(err)
	}
}

func diffTrees(t *testing.T, a, b string) {
	t.Helper()
	run(t, "diff", "-r", "--no-dereference", a, b)
}

func testCp(t *testing.T, dir string) {
	src := t.TempDir()
	makeTree(t, src)
	run(t, "cp", "-a", src, filepath.Join(dir, "copy"))
	diffTrees(t, src, filepath.Join(dir, "copy"))
	back := filepath.Join(t.TempDir(), "back")
	run(t, "cp", "-r", filepath.Join(dir, "copy"), back)
	diffTrees(t, src, back)
}

func testTar(t *testing.T, dir string) {
	src := t.TempDir()
	makeTree(t, src)
	in := filepath.Join(dir, "in")
	if err := os.Mkdir(in, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "sh", "-c", `tar -C "$1" -cf - . | tar -C "$2" -xpf -`, "sh", src, in)
	diffTrees(t, src, in)
	out := t.TempDir()
	run(t, "sh", "-c", `tar -C "$1" -cf - . | tar -C "$2" -xpf -`, "sh", in, out)
	diffTrees(t, src, out)
	// An archive file written into the mount and listed back.
	run(t, "tar", "-C", src, "-czf", filepath.Join(dir, "tree.tgz"), ".")
	if list := run(t, "tar", "-tzf", filepath.Join(dir, "tree.tgz")); !strings.Contains(list, "x y/big file") {
		t.Fatalf("archive listing lacks a file:\n%s", list)
	}
}

func sha256sum(t *testing.T, p string) string {
	t.Helper()
	return strings.Fields(run(t, "sha256sum", p))[0]
}

func testDd(t *testing.T, dir string) {
	local := filepath.Join(t.TempDir(), "random")
	run(t, "dd", "if=/dev/urandom", "of="+local, "bs=1M", "count=8", "status=none")
	remote := filepath.Join(dir, "random")
	run(t, "dd", "if="+local, "of="+remote, "bs=1M", "conv=fsync", "status=none")
	back := filepath.Join(t.TempDir(), "back")
	run(t, "dd", "if="+remote, "of="+back, "bs=4k", "status=none")
	want := sha256sum(t, local)
	if got := sha256sum(t, remote); got != want {
		t.Fatalf("sha256 through the mount %s, want %s", got, want)
	}
	if got := sha256sum(t, back); got != want {
		t.Fatalf("sha256 of the copy back %s, want %s", got, want)
	}
	// An unaligned overwrite in the middle, done to both copies.
	for _, p := range []string{local, remote} {
		run(t, "dd", "if=/dev/zero", "of="+p, "bs=1000", "seek=3001", "count=7", "conv=notrunc", "status=none")
	}
	if sha256sum(t, remote) != sha256sum(t, local) {
		t.Fatal("unaligned dd overwrite differs from the local one")
	}
	if _, err := os.Stat(remote); err != nil {
		t.Fatal(err)
	}
}

func testRsync(t *testing.T, dir string) {
	src := t.TempDir()
	makeTree(t, src)
	dst := filepath.Join(dir, "r")
	run(t, "rsync", "-aH", src+"/", dst+"/")
	diffTrees(t, src, dst)
	// A second run finds nothing to do: sizes, mtimes and modes stuck.
	if out := strings.TrimSpace(run(t, "rsync", "-aHi", src+"/", dst+"/")); out != "" {
		if !looseSymlinkTimes || !onlySymlinkTimes(out) {
			t.Fatalf("second rsync changed things:\n%s", out)
		}
		t.Logf("second rsync set symlink times again (tolerated on this server):\n%s", out)
	}
	if lstat(t, filepath.Join(dst, "hard")).Ino != lstat(t, filepath.Join(dst, "a/one")).Ino {
		t.Error("rsync -H hard link not preserved")
	}
}

func testGit(t *testing.T, dir string) {
	git := func(args ...string) string {
		t.Helper()
		return run(t, "git", append([]string{"-C", dir, "-c", "user.name=Posix Suite", "-c", "user.email=posix@example.invalid", "-c", "init.defaultBranch=main"}, args...)...)
	}
	git("init", "-q")
	makeTree(t, filepath.Join(dir, "src"))
	if err := os.Remove(filepath.Join(dir, "src/empty")); err != nil { // git keeps no empty directories
		t.Fatal(err)
	}
	git("add", ".")
	git("commit", "-q", "-m", "first")
	write(t, filepath.Join(dir, "src/zero"), "now something\n")
	if err := os.Remove(filepath.Join(dir, "src/a/b/page")); err != nil {
		t.Fatal(err)
	}
	git("commit", "-q", "-a", "-m", "second")
	if n := len(strings.Fields(git("log", "--format=%h"))); n != 2 {
		t.Fatalf("git log shows %d commits, want 2", n)
	}
	if st := git("status", "--porcelain"); strings.TrimSpace(st) != "" {
		t.Fatalf("work tree not clean after commit:\n%s", st)
	}
	git("fsck", "--full", "--strict")
	git("gc", "-q")
	git("fsck", "--full")
	clone := filepath.Join(t.TempDir(), "clone")
	run(t, "git", "clone", "-q", dir, clone)
	diffTrees(t, filepath.Join(dir, "src"), filepath.Join(clone, "src"))
}

// testFio runs fio through the mount with crc32c verification: a
// sequential write of large blocks and a random write of small ones, each
// read back and checked by fio after an fsync, then a separate read-only
// pass that checks the sequential file again through a fresh open (for the
// cached method, after the write's own pages were synced).
func testFio(t *testing.T, dir string) {
	jobs := []struct {
		name, rw, bs, size string
	}{
		{"seq", "write", "1m", "24m"},
		{"rand", "randwrite", "4k", "2m"},
	}
	for _, j := range jobs {
		// --verify_state_save=0: fio would otherwise leave a state file in
		// its working directory, which command() must not set.
		run(t, "fio", "--name="+j.name, "--directory="+dir, "--rw="+j.rw, "--bs="+j.bs, "--size="+j.size,
			"--ioengine=psync", "--end_fsync=1", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1",
			"--verify_state_save=0", "--output-format=terse")
	}
	// The same block size as the write: fio's verify header records it.
	run(t, "fio", "--name=seq", "--directory="+dir, "--rw=read", "--bs=1m", "--size=24m", "--ioengine=psync",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0", "--invalidate=1",
		"--output-format=terse")
}

// testPostmark runs postmark's small-file transactions (create, delete,
// read, append) in the mount. postmark checks every call's result and
// removes what it made at the end, so the directory must be empty after.
func testPostmark(t *testing.T, dir string) {
	loc := filepath.Join(dir, "pm")
	if err := os.Mkdir(loc, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "pm.cfg")
	script := fmt.Sprintf("set location %s\nset number 200\nset transactions 600\nset size 500 20000\nset subdirectories 4\nrun\nquit\n", loc)
	if err := os.WriteFile(cfg, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run(t, "postmark", cfg)
	for _, want := range []string{"Creating files...Done", "Performing transactions", "Deleting files...Done"} {
		if !strings.Contains(out, want) {
			t.Fatalf("postmark output lacks %q:\n%s", want, out)
		}
	}
	// Every file postmark created, it deleted again ("N created", "N deleted").
	created, deleted := postmarkCount(out, "created"), postmarkCount(out, "deleted")
	if created < 200 || created != deleted {
		t.Fatalf("postmark created %d files and deleted %d; want equal and >= 200:\n%s", created, deleted, out)
	}
	left, err := os.ReadDir(loc)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		names := make([]string, 0, len(left))
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Fatalf("postmark left %v behind", names)
	}
}

// postmarkCount returns N from postmark's "N <what> (...)" summary line.
func postmarkCount(out, what string) int {
	for _, line := range strings.Split(out, "\n") {
		var n int
		var w string
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "%d %s", &n, &w); err == nil && w == what {
			return n
		}
	}
	return -1
}

// looseSymlinkTimes tolerates, in testRsync's second run, symlinks whose
// times rsync sets again. Set for NFS-Ganesha: one CI run saw
// ".L..t...... a/link -> b/page" there (odirect mount), which six local
// reruns did not reproduce; the cause is not known yet.
var looseSymlinkTimes bool

// onlySymlinkTimes reports whether every line of rsync -i output is a
// symlink whose only change is its time.
func onlySymlinkTimes(out string) bool {
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, ".L..t......") {
			return false
		}
	}
	return true
}
