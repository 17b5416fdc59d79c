package posix

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

type testCase struct {
	name string
	root bool   // needs root
	tool string // skipped unless this program is installed
	// data marks the cases that move file data, the ones the access
	// method changes; the other methods run only these.
	data bool
	fn   func(t *testing.T, dir string)
}

var suite = []testCase{
	{name: "create", data: true, fn: testCreate},
	{name: "unlink", fn: testUnlink},
	{name: "rename", fn: testRename},
	{name: "link", fn: testLink},
	{name: "symlink", fn: testSymlink},
	{name: "chmod", fn: testChmod},
	{name: "chown", root: true, fn: testChown},
	{name: "truncate", data: true, fn: testTruncate},
	{name: "utimes", fn: testUtimes},
	{name: "excl", fn: testExcl},
	{name: "errors", fn: testErrors},
	{name: "eacces", root: true, tool: "cat", fn: testEACCES},
	{name: "readdir", fn: testReaddir},
	{name: "sparse", data: true, fn: testSparse},
	{name: "fsync", data: true, fn: testFsync},
	{name: "unlinked-open", data: true, fn: testUnlinkedOpen},
	{name: "append", data: true, fn: testAppend},
	{name: "mknod", fn: testMknod},
	{name: "fcntl-locks", fn: testLocks},
	{name: "cp", data: true, tool: "cp", fn: testCp},
	{name: "tar", data: true, tool: "tar", fn: testTar},
	{name: "dd", data: true, tool: "dd", fn: testDd},
	{name: "rsync", data: true, tool: "rsync", fn: testRsync},
	{name: "git", tool: "git", fn: testGit},
	{name: "fio", data: true, tool: "fio", fn: testFio},
	{name: "postmark", data: true, tool: "postmark", fn: testPostmark},
}

func write(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return &st
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lstat %s: %v, want ENOENT", p, err)
	}
}

func testCreate(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	write(t, p, "hello, world\n")
	if got := read(t, p); got != "hello, world\n" {
		t.Fatalf("read back %q", got)
	}
	st := lstat(t, p)
	if st.Size != 13 || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Nlink != 1 {
		t.Fatalf("stat: size %d mode %o nlink %d", st.Size, st.Mode, st.Nlink)
	}
	if st.Uid != uint32(os.Getuid()) {
		t.Errorf("owner %d, want %d", st.Uid, os.Getuid())
	}
	// Overwrite in place keeps the inode.
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("HELLO"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := read(t, p); got != "HELLO, world\n" {
		t.Fatalf("after overwrite %q", got)
	}
	if lstat(t, p).Ino != st.Ino {
		t.Error("inode number changed on overwrite")
	}
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o750); err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, filepath.Join(dir, "d")); st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		t.Fatalf("mkdir made mode %o", st.Mode)
	}
}

func testUnlink(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	write(t, p, "x")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, p)
	if err := errIs(syscall.Unlink(p), syscall.ENOENT); err != nil {
		t.Fatalf("unlink missing: %v", err)
	}
	sub := filepath.Join(dir, "d")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := errIs(syscall.Unlink(sub), syscall.EISDIR); err != nil {
		t.Fatalf("unlink dir: %v", err)
	}
	if err := syscall.Rmdir(sub); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, sub)
}

func testRename(t *testing.T, dir string) {
	j := func(n string) string { return filepath.Join(dir, n) }
	mkdir := func(n string) {
		t.Helper()
		if err := os.Mkdir(j(n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, j("a"), "A")
	if err := os.Rename(j("a"), j("b")); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, j("a"))
	if read(t, j("b")) != "A" {
		t.Fatal("renamed content differs")
	}

	// Over an existing file: the target is replaced atomically.
	write(t, j("c"), "C")
	if err := os.Rename(j("b"), j("c")); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, j("b"))
	if got := read(t, j("c")); got != "A" {
		t.Fatalf("over existing: %q", got)
	}

	// Across directories.
	mkdir("d1")
	mkdir("d2")
	write(t, j("d1/f"), "F")
	if err := os.Rename(j("d1/f"), j("d2/g")); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, j("d1/f"))
	if read(t, j("d2/g")) != "F" {
		t.Fatal("cross-directory content differs")
	}

	// A directory over an empty directory.
	mkdir("empty")
	// syscall.Rename: os.Rename refuses any directory target by itself.
	if err := syscall.Rename(j("d2"), j("empty")); err != nil {
		t.Fatalf("dir over empty dir: %v", err)
	}
	if read(t, j("empty/g")) != "F" {
		t.Fatal("moved directory lost its content")
	}

	// Error cases.
	mkdir("full")
	write(t, j("full/x"), "x")
	mkdir("src")
	cases := []struct {
		name     string
		from, to string
		want     []syscall.Errno
	}{
		{"dir over non-empty dir", "src", "full", []syscall.Errno{syscall.ENOTEMPTY, syscall.EEXIST}},
		{"file over dir", "c", "src", []syscall.Errno{syscall.EISDIR}},
		{"dir over file", "src", "c", []syscall.Errno{syscall.ENOTDIR}},
		{"missing source", "nope", "x", []syscall.Errno{syscall.ENOENT}},
		{"dir into itself", "src", "src/sub", []syscall.Errno{syscall.EINVAL}},
	}
	for _, c := range cases {
		err := syscall.Rename(j(c.from), j(c.to))
		var errno syscall.Errno
		if !errors.As(err, &errno) || !slices.Contains(c.want, errno) {
			t.Errorf("%s: rename %s %s: %v, want one of %v", c.name, c.from, c.to, err, c.want)
		}
	}
	// The failed renames changed nothing.
	if read(t, j("c")) != "A" || read(t, j("full/x")) != "x" {
		t.Error("a failed rename changed the tree")
	}
	if st := lstat(t, j("src")); st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		t.Error("src is no longer a directory")
	}
}

func testLink(t *testing.T, dir string) {
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	write(t, a, "shared")
	nlink := func(p string) uint64 { t.Helper(); return uint64(lstat(t, p).Nlink) }
	if n := nlink(a); n != 1 {
		t.Fatalf("nlink %d, want 1", n)
	}
	if err := os.Link(a, b); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(b, c); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a, b, c} {
		if n := nlink(p); n != 3 {
			t.Fatalf("%s: nlink %d, want 3", filepath.Base(p), n)
		}
	}
	if lstat(t, a).Ino != lstat(t, c).Ino {
		t.Fatal("links have different inode numbers")
	}
	write(t, c, "changed")
	if read(t, a) != "changed" {
		t.Fatal("write through one link not seen through another")
	}
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	if n := nlink(b); n != 2 {
		t.Fatalf("after unlink: nlink %d, want 2", n)
	}
	if err := errIs(os.Link(b, c), syscall.EEXIST); err != nil {
		t.Errorf("link over existing: %v", err)
	}
	if err := errIs(os.Link(dir, filepath.Join(dir, "dirlink")), syscall.EPERM); err != nil {
		t.Errorf("link to directory: %v", err)
	}
}

func testSymlink(t *testing.T, dir string) {
	j := func(n string) string { return filepath.Join(dir, n) }
	write(t, j("target"), "T")
	if err := os.Symlink("target", j("s")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(j("s")); err != nil || got != "target" {
		t.Fatalf("readlink %q %v", got, err)
	}
	if st := lstat(t, j("s")); st.Mode&syscall.S_IFMT != syscall.S_IFLNK || st.Size != int64(len("target")) {
		t.Fatalf("lstat symlink: mode %o size %d", st.Mode, st.Size)
	}
	if read(t, j("s")) != "T" {
		t.Fatal("open through symlink")
	}
	// A dangling link, a link to a directory used in a path, a long target.
	if err := os.Symlink("nowhere", j("dangling")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(j("dangling")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat dangling: %v", err)
	}
	if err := os.Mkdir(j("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, j("d/inner"), "I")
	if err := os.Symlink("d", j("dl")); err != nil {
		t.Fatal(err)
	}
	if read(t, j("dl/inner")) != "I" {
		t.Fatal("path through a directory symlink")
	}
	long := strings.Repeat("x/", 500) + "end"
	if err := os.Symlink(long, j("long")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(j("long")); got != long {
		t.Fatal("long symlink target changed")
	}
	if err := errIs(os.Symlink("x", j("target")), syscall.EEXIST); err != nil {
		t.Errorf("symlink over existing: %v", err)
	}
}

func testChmod(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	write(t, p, "x")
	for _, mode := range []uint32{0o600, 0o755, 0o640, 0o4755, 0o1777, 0o000} {
		if err := syscall.Chmod(p, mode); err != nil {
			t.Fatalf("chmod %o: %v", mode, err)
		}
		if got := lstat(t, p).Mode & 0o7777; got != mode {
			t.Errorf("chmod %o: mode now %o", mode, got)
		}
	}
	// fchmod through an open descriptor.
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Chmod(0o604); err != nil {
		t.Fatal(err)
	}
	if got := lstat(t, p).Mode & 0o7777; got != 0o604 {
		t.Errorf("fchmod: mode %o", got)
	}
}

func testChown(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	write(t, p, "x")
	if err := os.Chown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, p); st.Uid != 1234 || st.Gid != 5678 {
		t.Fatalf("owner %d:%d, want 1234:5678", st.Uid, st.Gid)
	}
	if err := os.Chown(p, -1, 42); err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, p); st.Uid != 1234 || st.Gid != 42 {
		t.Fatalf("owner %d:%d, want 1234:42", st.Uid, st.Gid)
	}
	s := filepath.Join(dir, "s")
	if err := os.Symlink("f", s); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(s, 99, 98); err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, s); st.Uid != 99 || st.Gid != 98 {
		t.Fatalf("lchown: %d:%d", st.Uid, st.Gid)
	}
	if st := lstat(t, p); st.Uid != 1234 {
		t.Fatal("lchown followed the link")
	}
}

func testTruncate(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	write(t, p, "0123456789")
	if err := os.Truncate(p, 4); err != nil {
		t.Fatal(err)
	}
	if got := read(t, p); got != "0123" {
		t.Fatalf("truncate down: %q", got)
	}
	if err := os.Truncate(p, 100); err != nil {
		t.Fatal(err)
	}
	want := "0123" + strings.Repeat("\x00", 96)
	if got := read(t, p); got != want {
		t.Fatalf("truncate up: %q", got)
	}
	// ftruncate on a descriptor, then a write past the new end.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("Z"), 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := read(t, p); got != "01\x00\x00\x00Z" {
		t.Fatalf("ftruncate + write: %q", got)
	}
	// O_TRUNC at open.
	if err := os.WriteFile(p, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := read(t, p); got != "new" {
		t.Fatalf("O_TRUNC: %q", got)
	}
}

func testUtimes(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	write(t, p, "x")
	atime := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
	mtime := time.Date(2011, 12, 13, 14, 15, 16, 17000, time.UTC)
	if err := os.Chtimes(p, atime, mtime); err != nil {
		t.Fatal(err)
	}
	st := lstat(t, p)
	if got := time.Unix(st.Atim.Unix()); !got.Equal(atime) {
		t.Errorf("atime %v, want %v", got.UTC(), atime)
	}
	if got := time.Unix(st.Mtim.Unix()); !got.Equal(mtime) {
		t.Errorf("mtime %v, want %v", got.UTC(), mtime)
	}
	// Only mtime; atime stays (UTIME_OMIT).
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime.Add(time.Hour).UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0); err != nil {
		t.Fatal(err)
	}
	st = lstat(t, p)
	if got := time.Unix(st.Atim.Unix()); !got.Equal(atime) {
		t.Errorf("after UTIME_OMIT: atime %v, want %v", got.UTC(), atime)
	}
	if got := time.Unix(st.Mtim.Unix()); !got.Equal(mtime.Add(time.Hour)) {
		t.Errorf("mtime %v, want %v", got.UTC(), mtime.Add(time.Hour))
	}
	// Writing moves mtime forward to about now.
	before := time.Now().Add(-time.Hour)
	write(t, p, "y")
	if got := time.Unix(lstat(t, p).Mtim.Unix()); got.Before(before) {
		t.Errorf("mtime after write %v, want about now", got)
	}
}

func testExcl(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err := errIs(err, syscall.EEXIST); err != nil {
		t.Fatalf("second O_EXCL create: %v", err)
	}
	if err := os.Symlink("dangling", filepath.Join(dir, "s")); err != nil {
		t.Fatal(err)
	}
	_, err = os.OpenFile(filepath.Join(dir, "s"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err := errIs(err, syscall.EEXIST); err != nil {
		t.Fatalf("O_EXCL on a dangling symlink: %v", err)
	}
}

func testErrors(t *testing.T, dir string) {
	j := func(n string) string { return filepath.Join(dir, n) }
	write(t, j("file"), "x")
	if err := os.Mkdir(j("full"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, j("full/x"), "x")
	cases := []struct {
		name string
		op   func() error
		want syscall.Errno
	}{
		{"open missing", func() error { _, err := os.Open(j("missing")); return err }, syscall.ENOENT},
		{"stat under missing dir", func() error { _, err := os.Stat(j("missing/x")); return err }, syscall.ENOENT},
		{"mkdir existing", func() error { return os.Mkdir(j("file"), 0o755) }, syscall.EEXIST},
		{"path through a file", func() error { _, err := os.Stat(j("file/x")); return err }, syscall.ENOTDIR},
		{"open dir for writing", func() error { _, err := os.OpenFile(j("full"), os.O_WRONLY, 0); return err }, syscall.EISDIR},
		{"rmdir non-empty", func() error { return syscall.Rmdir(j("full")) }, syscall.ENOTEMPTY},
		{"rmdir a file", func() error { return syscall.Rmdir(j("file")) }, syscall.ENOTDIR},
		{"readlink a file", func() error { _, err := os.Readlink(j("file")); return err }, syscall.EINVAL},
		{"name too long", func() error { _, err := os.Create(j(strings.Repeat("n", 300))); return err }, syscall.ENAMETOOLONG},
	}
	for _, c := range cases {
		if err := errIs(c.op(), c.want); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// testEACCES runs programs as an unprivileged uid: the mount sends that
// uid as the NFS credential and the server refuses.
func testEACCES(t *testing.T, dir string) {
	const nobody = 65534
	j := func(n string) string { return filepath.Join(dir, n) }
	write(t, j("secret"), "s")
	if err := os.Chmod(j("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	write(t, j("public"), "p")
	if err := os.Mkdir(j("private"), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, j("private/f"), "f")
	if err := os.Mkdir(j("mine"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(j("mine"), nobody, nobody); err != nil {
		t.Fatal(err)
	}
	asNobody := func(name string, args ...string) (string, error) {
		cmd := command(name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	denied := []struct {
		name string
		args []string
	}{
		{"cat", []string{j("secret")}},
		{"cat", []string{j("private/f")}},
		{"touch", []string{j("new")}},
		{"rm", []string{"-f", j("public")}},
		{"chmod", []string{"777", j("public")}},
	}
	for _, c := range denied {
		out, err := asNobody(c.name, c.args...)
		if err == nil || !strings.Contains(out, "Permission denied") && !strings.Contains(out, "not permitted") {
			t.Errorf("%s %v as uid %d: err %v, output %q; want permission denied", c.name, c.args, nobody, err, out)
		}
	}
	// What nobody may do still works, and files it creates are its own.
	if out, err := asNobody("cat", j("public")); err != nil || out != "p" {
		t.Errorf("cat public as nobody: %v %q", err, out)
	}
	if out, err := asNobody("touch", j("mine/own")); err != nil {
		t.Fatalf("touch in own dir as nobody: %v %q", err, out)
	}
	if st := lstat(t, j("mine/own")); st.Uid != nobody {
		t.Errorf("file created by nobody is owned by %d", st.Uid)
	}
	if _, err := os.Stat(j("public")); err != nil {
		t.Errorf("public was removed: %v", err)
	}
}

func testReaddir(t *testing.T, dir string) {
	const n, workers = 1000, 8
	want := make([]string, 0, n)
	for i := range n {
		want = append(want, fmt.Sprintf("entry-%04d", i))
	}
	// Created by several goroutines at once, as parallel builds do.
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				f, err := os.Create(filepath.Join(dir, want[i]))
				if err != nil {
					errs <- err
					return
				}
				f.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, 0, len(ents))
	for _, e := range ents {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("readdir: %d entries, want %d", len(got), n)
	}
	// Removing while listing in chunks, the way rm -r does.
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	removed := 0
	for range n {
		names, err := d.Readdirnames(100)
		for _, name := range names {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			removed++
		}
		if err == io.EOF || len(names) == 0 {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("after removing %d: %d entries left (%v)", removed, len(ents), err)
	}
}

func testSparse(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	const off = 3<<20 + 5
	if _, err := f.WriteAt([]byte("tail"), off); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("head"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st := lstat(t, p)
	if st.Size != off+4 {
		t.Fatalf("size %d, want %d", st.Size, off+4)
	}
	b := []byte(read(t, p))
	if string(b[:4]) != "head" || string(b[off:]) != "tail" {
		t.Fatal("data at the ends is wrong")
	}
	if i := slices.IndexFunc(b[4:off], func(c byte) bool { return c != 0 }); i >= 0 {
		t.Fatalf("hole has non-zero byte at %d", 4+i)
	}
}

func testFsync(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := bytes.Repeat([]byte("durable "), 64<<10)
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	if err := syscall.Fdatasync(int(f.Fd())); err != nil {
		t.Fatalf("fdatasync: %v", err)
	}
	if got := read(t, p); got != string(data) {
		t.Fatal("data read back after fsync differs")
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync of a directory: %v", err)
	}
}

// testUnlinkedOpen: a descriptor outlives its name for reads, writes and
// fstat.
func testUnlinkedOpen(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	write(t, p, "still here")
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, p)
	buf := make([]byte, 64)
	n, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF || string(buf[:n]) != "still here" {
		t.Fatalf("read after unlink: %q %v", buf[:n], err)
	}
	if _, err := f.Stat(); err != nil {
		t.Fatalf("fstat after unlink: %v", err)
	}
}

func testAppend(t *testing.T, dir string) {
	p := filepath.Join(dir, "log")
	for i := range 5 {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(f, "line %d\n", i); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := read(t, p); got != "line 0\nline 1\nline 2\nline 3\nline 4\n" {
		t.Fatalf("appended: %q", got)
	}
}

func testMknod(t *testing.T, dir string) {
	root := os.Geteuid() == 0
	// No group or other write bits: the umask leaves the modes alone.
	tests := []struct {
		name string
		mode uint32
		dev  uint64
		root bool // devices need CAP_MKNOD
	}{
		{"reg", syscall.S_IFREG | 0o640, 0, false},
		{"fifo", syscall.S_IFIFO | 0o644, 0, false},
		{"sock", syscall.S_IFSOCK | 0o600, 0, false},
		{"chr", syscall.S_IFCHR | 0o640, unix.Mkdev(1, 3), true},
		{"blk", syscall.S_IFBLK | 0o604, unix.Mkdev(259, 1<<18), true},
	}
	for _, tc := range tests {
		p := filepath.Join(dir, tc.name)
		err := unix.Mknod(p, tc.mode, int(tc.dev))
		if tc.root && !root {
			if !errors.Is(err, syscall.EPERM) {
				t.Errorf("mknod %s as uid %d: %v, want EPERM", tc.name, os.Geteuid(), err)
			}
			continue
		}
		if err != nil {
			t.Errorf("mknod %s %o: %v", tc.name, tc.mode, err)
			continue
		}
		// lstat goes to the server, not to what Mknod answered.
		st := lstat(t, p)
		if st.Mode != tc.mode || st.Rdev != tc.dev || st.Size != 0 || st.Nlink != 1 {
			t.Errorf("%s: mode %o, rdev %#x, size %d, nlink %d; want mode %o, rdev %#x, empty, one link",
				tc.name, st.Mode, st.Rdev, st.Size, st.Nlink, tc.mode, tc.dev)
		}
		if err := unix.Mknod(p, tc.mode, int(tc.dev)); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("mknod %s again: %v, want EEXIST", tc.name, err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "nope", "fifo"), 0o644); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("mkfifo under a missing directory: %v, want ENOENT", err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "reg", "fifo"), 0o644); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("mkfifo under a file: %v, want ENOTDIR", err)
	}
	// The FIFO is a pipe: the kernel serves it, the file system only names
	// it. O_RDWR opens it without waiting for a peer.
	fifo := filepath.Join(dir, "fifo")
	fd, err := syscall.Open(fifo, syscall.O_RDWR|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatalf("open fifo: %v", err)
	}
	defer syscall.Close(fd)
	if _, err := syscall.Write(fd, []byte("through the pipe")); err != nil {
		t.Fatalf("write fifo: %v", err)
	}
	buf := make([]byte, 64)
	n, err := syscall.Read(fd, buf)
	if err != nil || string(buf[:n]) != "through the pipe" {
		t.Fatalf("read fifo: %q, %v", buf[:n], err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]os.FileMode{}
	for _, e := range ents {
		types[e.Name()] = e.Type()
	}
	if types["fifo"] != os.ModeNamedPipe || types["sock"] != os.ModeSocket {
		t.Errorf("readdir types: %v", types)
	}
}
