package pcopy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/pcopy"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startCluster starts an in-process MDS with two data servers and returns
// the FS of a pNFS client connected to it.
func startCluster(t testing.TB) (pcopy.FS, *client.Client) {
	t.Helper()
	ctx := testCtx(t)
	f := false
	c, err := wiring.Start(ctx, wiring.Config{
		Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl, err := client.Dial(ctx, c.MDS.Addr.String(), client.Options{DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return pcopy.NFS(cl), cl
}

// node is one object of a test tree.
type node struct {
	path   string
	typ    pcopy.Type
	perm   uint32
	size   int    // files
	target string // symlinks
}

var base = time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)

// testTree has nested directories, empty, small and multi-MiB files (the
// large ones span several chunks and stripe units) and a symlink.
var testTree = []node{
	{path: "zero", typ: pcopy.TypeFile, perm: 0o644, size: 0},
	{path: "small.txt", typ: pcopy.TypeFile, perm: 0o600, size: 13},
	{path: "a", typ: pcopy.TypeDir, perm: 0o755},
	{path: "a/mid", typ: pcopy.TypeFile, perm: 0o640, size: 100 << 10},
	{path: "a/b", typ: pcopy.TypeDir, perm: 0o750},
	{path: "a/b/big", typ: pcopy.TypeFile, perm: 0o755, size: 9<<20 + 123},
	{path: "a/b/c", typ: pcopy.TypeDir, perm: 0o700},
	{path: "a/b/c/big2", typ: pcopy.TypeFile, perm: 0o4755, size: 5 << 20},
	{path: "a/link", typ: pcopy.TypeSymlink, target: "b/big"},
	{path: "empty", typ: pcopy.TypeDir, perm: 0o555},
}

func content(p string, size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(len(p)), uint64(size)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	copy(b, p)
	return b
}

// makeTree creates tree under root of fsys, through the FS interface, so
// the same code fills a cluster and a local directory.
func makeTree(t testing.TB, fsys pcopy.FS, root string, tree []node) {
	t.Helper()
	ctx := testCtx(t)
	if err := fsys.MkdirAll(ctx, root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range tree {
		p := path.Join(root, n.path)
		var err error
		switch n.typ {
		case pcopy.TypeDir:
			err = fsys.MkdirAll(ctx, p, 0o755)
		case pcopy.TypeSymlink:
			err = fsys.Symlink(ctx, n.target, p)
		case pcopy.TypeFile:
			var w pcopy.WriteFile
			if w, err = fsys.Create(ctx, p, true); err != nil {
				break
			}
			if n.size > 0 {
				_, err = w.WriteAt(ctx, content(n.path, n.size), 0)
			}
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			t.Fatalf("make %s: %v", p, err)
		}
	}
	// Attributes last, deepest first, as a copy must do too.
	for i := len(tree) - 1; i >= 0; i-- {
		n := tree[i]
		if n.typ == pcopy.TypeSymlink {
			continue
		}
		mt := base.Add(time.Duration(i) * time.Hour).Add(time.Duration(i) * time.Microsecond)
		if err := fsys.SetAttr(ctx, path.Join(root, n.path), n.typ, n.perm, mt); err != nil {
			t.Fatal(err)
		}
	}
}

func readAll(t testing.TB, fsys pcopy.FS, p string, size int64) []byte {
	t.Helper()
	ctx := testCtx(t)
	r, err := fsys.Open(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b := make([]byte, size)
	n, err := r.ReadAt(ctx, b, 0)
	if int64(n) != size {
		t.Fatalf("read %s: %d of %d bytes: %v", p, n, size, err)
	}
	return b
}

// listTree returns every object under root by relative path.
func listTree(t testing.TB, fsys pcopy.FS, root string) map[string]pcopy.Info {
	t.Helper()
	ctx := testCtx(t)
	out := map[string]pcopy.Info{}
	var rec func(rel string, depth int)
	rec = func(rel string, depth int) {
		if depth > 16 {
			t.Fatalf("tree too deep at %s", rel)
		}
		ents, err := fsys.ReadDir(ctx, path.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			r := path.Join(rel, e.Name)
			out[r] = e
			if e.Type == pcopy.TypeDir {
				rec(r, depth+1)
			}
		}
	}
	rec(".", 0)
	return out
}

// sameTree checks that dst holds exactly what src holds: types, sizes,
// permission bits, mtimes of files and directories, contents and link
// targets.
func sameTree(t testing.TB, sfs pcopy.FS, src string, dfs pcopy.FS, dst string) {
	t.Helper()
	ctx := testCtx(t)
	s, d := listTree(t, sfs, src), listTree(t, dfs, dst)
	for rel, si := range s {
		di, ok := d[rel]
		if !ok {
			t.Errorf("%s: missing at destination", rel)
			continue
		}
		if si.Type != di.Type || (si.Type == pcopy.TypeFile && si.Size != di.Size) {
			t.Errorf("%s: %s of %d bytes, want %s of %d", rel, di.Type, di.Size, si.Type, si.Size)
			continue
		}
		switch si.Type {
		case pcopy.TypeSymlink:
			st, _ := sfs.Readlink(ctx, path.Join(src, rel))
			dt, err := dfs.Readlink(ctx, path.Join(dst, rel))
			if err != nil || st != dt {
				t.Errorf("%s: link to %q (%v), want %q", rel, dt, err, st)
			}
			continue
		case pcopy.TypeFile:
			if !bytes.Equal(readAll(t, sfs, path.Join(src, rel), si.Size), readAll(t, dfs, path.Join(dst, rel), di.Size)) {
				t.Errorf("%s: contents differ", rel)
			}
		}
		if si.Perm != di.Perm {
			t.Errorf("%s: mode %04o, want %04o", rel, di.Perm, si.Perm)
		}
		if !si.Mtime.Equal(di.Mtime) {
			t.Errorf("%s: mtime %v, want %v", rel, di.Mtime, si.Mtime)
		}
	}
	for rel := range d {
		if _, ok := s[rel]; !ok {
			t.Errorf("%s: extra at destination", rel)
		}
	}
}

func TestCopyTree(t *testing.T) {
	a, _ := startCluster(t)
	b, _ := startCluster(t)
	local := pcopy.Local()
	ldir := t.TempDir()
	makeTree(t, a, "/src", testTree)
	makeTree(t, local, ldir+"/src", testTree)

	for _, tc := range []struct {
		name     string
		src, dst pcopy.Endpoint
		opts     pcopy.Options
	}{
		{"cluster to cluster", pcopy.Endpoint{FS: a, Path: "/src"}, pcopy.Endpoint{FS: b, Path: "/c2c"}, pcopy.Options{}},
		{"cluster to cluster verify", pcopy.Endpoint{FS: a, Path: "/src"}, pcopy.Endpoint{FS: b, Path: "/c2cv"}, pcopy.Options{Verify: true, Chunk: 1 << 20, Jobs: 3}},
		{"cluster to local", pcopy.Endpoint{FS: a, Path: "/src"}, pcopy.Endpoint{FS: local, Path: ldir + "/c2l"}, pcopy.Options{Verify: true}},
		{"local to cluster", pcopy.Endpoint{FS: local, Path: ldir + "/src"}, pcopy.Endpoint{FS: b, Path: "/l2c"}, pcopy.Options{Chunk: 2 << 20}},
		{"local to local", pcopy.Endpoint{FS: local, Path: ldir + "/src"}, pcopy.Endpoint{FS: local, Path: ldir + "/l2l"}, pcopy.Options{Jobs: 1, Verify: true, Chunk: 1 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Recursive = true
			sum, err := pcopy.Copy(testCtx(t), tc.src, tc.dst, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			sameTree(t, tc.src.FS, tc.src.Path, tc.dst.FS, tc.dst.Path)
			if sum.Files != 5 || sum.Dirs != 5 || sum.Symlinks != 1 || sum.Bytes != 14<<20+123+13+100<<10 {
				t.Errorf("summary %+v", sum)
			}
			if tc.opts.Verify && (sum.Verified != 5 || len(sum.Mismatches) != 0) {
				t.Errorf("verify summary %+v", sum)
			}
			// Copying again into the now existing directory nests it, like cp.
			sum, err = pcopy.Copy(testCtx(t), tc.src, tc.dst, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := path.Join(tc.dst.Path, "src"); sum.Target != want {
				t.Errorf("second copy went to %s, want %s", sum.Target, want)
			}
		})
	}
}

func TestCopyFile(t *testing.T) {
	a, _ := startCluster(t)
	ctx := testCtx(t)
	makeTree(t, a, "/f", testTree)
	dir := t.TempDir()
	local := pcopy.Local()

	if _, err := pcopy.Copy(ctx, pcopy.Endpoint{FS: a, Path: "/f"}, pcopy.Endpoint{FS: local, Path: dir}, pcopy.Options{}); err == nil || !strings.Contains(err.Error(), "use -r") {
		t.Fatalf("directory without Recursive: %v", err)
	}
	// Into an existing directory, then to a new name.
	for _, dst := range []string{dir, dir + "/renamed"} {
		sum, err := pcopy.Copy(ctx, pcopy.Endpoint{FS: a, Path: "/f/a/b/big"}, pcopy.Endpoint{FS: local, Path: dst}, pcopy.Options{Verify: true})
		if err != nil {
			t.Fatal(err)
		}
		in, err := local.Lstat(ctx, sum.Target)
		if err != nil || in.Size != 9<<20+123 || in.Perm != 0o755 {
			t.Fatalf("%s: %+v %v", sum.Target, in, err)
		}
	}
	if got := listTree(t, local, dir); len(got) != 2 {
		t.Errorf("destination holds %v, want big and renamed only (no journal, no temp files)", got)
	}
	// A symlink source is copied as a symlink.
	sum, err := pcopy.Copy(ctx, pcopy.Endpoint{FS: a, Path: "/f/a/link"}, pcopy.Endpoint{FS: local, Path: dir}, pcopy.Options{})
	if err != nil || sum.Symlinks != 1 {
		t.Fatalf("symlink: %+v %v", sum, err)
	}
	if target, err := local.Readlink(ctx, dir+"/link"); err != nil || target != "b/big" {
		t.Fatalf("link target %q %v", target, err)
	}
}

// countingFS wraps an FS: it counts bytes read per path, and calls
// onWrite after each data write (not the journal's).
type countingFS struct {
	pcopy.FS
	mu      sync.Mutex
	read    map[string]int64
	writes  atomic.Int64
	onWrite func(name string, p []byte, n int64) // n: this write's number, about
}

func (c *countingFS) Open(ctx context.Context, name string) (pcopy.ReadFile, error) {
	r, err := c.FS.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return &countingFile{ReadFile: r, fs: c, name: name}, nil
}

func (c *countingFS) Create(ctx context.Context, name string, truncate bool) (pcopy.WriteFile, error) {
	w, err := c.FS.Create(ctx, name, truncate)
	if err != nil || path.Base(name) == pcopy.JournalName {
		return w, err
	}
	return &countingWriter{WriteFile: w, fs: c, name: name}, nil
}

func (c *countingFS) bytesRead() (total int64, per map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.read {
		total += n
	}
	return total, maps.Clone(c.read)
}

type countingFile struct {
	pcopy.ReadFile
	fs   *countingFS
	name string
}

func (f *countingFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	n, err := f.ReadFile.ReadAt(ctx, p, off)
	f.fs.mu.Lock()
	if f.fs.read == nil {
		f.fs.read = map[string]int64{}
	}
	f.fs.read[f.name] += int64(n)
	f.fs.mu.Unlock()
	return n, err
}

type countingWriter struct {
	pcopy.WriteFile
	fs   *countingFS
	name string
}

func (w *countingWriter) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if w.fs.onWrite != nil {
		q := bytes.Clone(p)
		w.fs.onWrite(w.name, q, w.fs.writes.Load()+1)
		p = q
	}
	n, err := w.WriteFile.WriteAt(ctx, p, off)
	w.fs.writes.Add(1)
	return n, err
}

// resumeTree is several multi-chunk files, so an interrupted copy has
// completed files, partly copied files and untouched ones.
func resumeTree() []node {
	tree := []node{{path: "d", typ: pcopy.TypeDir, perm: 0o755}}
	for i := range 6 {
		tree = append(tree, node{path: fmt.Sprintf("d/f%d", i), typ: pcopy.TypeFile, perm: 0o644, size: (3 + i) << 20})
	}
	return append(tree, node{path: "d/l", typ: pcopy.TypeSymlink, target: "f0"})
}

func TestInterruptAndResume(t *testing.T) {
	a, _ := startCluster(t)
	b, _ := startCluster(t)
	makeTree(t, a, "/src", resumeTree())
	var total int64
	for _, n := range resumeTree() {
		total += int64(n.size)
	}
	ctx := testCtx(t)
	src := pcopy.Endpoint{FS: a, Path: "/src"}
	opts := pcopy.Options{Recursive: true, Jobs: 2, Chunk: 1 << 20, Checkpoint: 1 << 20}

	// First run: cancelled after 10 chunks were written.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	dst := &countingFS{FS: b, onWrite: func(_ string, _ []byte, n int64) {
		if n >= 10 {
			cancel()
		}
	}}
	_, err := pcopy.Copy(runCtx, src, pcopy.Endpoint{FS: dst, Path: "/dst"}, opts)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted copy: %v", err)
	}
	// Whatever is in place under its final name is complete and right.
	complete := map[string]bool{}
	for rel, in := range listTree(t, b, "/dst") {
		if in.Type != pcopy.TypeFile || strings.HasPrefix(path.Base(rel), ".") {
			continue
		}
		complete[rel] = true
		if !bytes.Equal(readAll(t, b, "/dst/"+rel, in.Size), readAll(t, a, "/src/"+rel, in.Size)) {
			t.Errorf("%s: in place after interruption but wrong", rel)
		}
	}
	if _, err := b.Lstat(ctx, "/dst/"+pcopy.JournalName); err != nil {
		t.Fatalf("no journal after interruption: %v", err)
	}

	// Without Resume the journal stops a fresh start.
	if _, err := pcopy.Copy(ctx, src, pcopy.Endpoint{FS: b, Path: "/dst"}, opts); err == nil || !strings.Contains(err.Error(), "--resume") {
		t.Fatalf("copy over a journal without Resume: %v", err)
	}

	// Second run resumes; it reads nothing of completed files and less
	// than everything in all.
	counted := &countingFS{FS: a}
	opts.Resume = true
	opts.Chunk = 4 << 20 // ignored: the journal's chunk size wins
	sum, err := pcopy.Copy(ctx, pcopy.Endpoint{FS: counted, Path: "/src"}, pcopy.Endpoint{FS: b, Path: "/dst"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	read, per := counted.bytesRead()
	for rel := range complete {
		if per["/src/"+rel] != 0 {
			t.Errorf("%s was complete but read again (%d bytes)", rel, per["/src/"+rel])
		}
	}
	if read >= total || sum.ResumedBytes == 0 || read+sum.ResumedBytes != total || sum.Bytes != read {
		t.Errorf("resumed copy read %d bytes of %d; summary %+v", read, total, sum)
	}
	if sum.Target != "/dst" {
		t.Errorf("resumed copy went to %s, want /dst", sum.Target)
	}
	t.Logf("first run completed %d files; second read %d of %d bytes, resumed %d", len(complete), read, total, sum.ResumedBytes)
	sameTree(t, a, "/src", b, "/dst")
}

func TestVerifyDetectsCorruption(t *testing.T) {
	a, _ := startCluster(t)
	b, _ := startCluster(t)
	makeTree(t, a, "/src", testTree)
	ctx := testCtx(t)
	// The destination flips a bit of one file's data on the way to disk.
	dst := &countingFS{FS: b, onWrite: func(name string, p []byte, _ int64) {
		if strings.Contains(name, "big2") && len(p) > 100 {
			p[100] ^= 1
		}
	}}
	sum, err := pcopy.Copy(ctx, pcopy.Endpoint{FS: a, Path: "/src"}, pcopy.Endpoint{FS: dst, Path: "/dst"},
		pcopy.Options{Recursive: true, Verify: true})
	if !errors.Is(err, pcopy.ErrVerify) {
		t.Fatalf("copy with a corrupting destination: %v", err)
	}
	if len(sum.Mismatches) != 1 || sum.Mismatches[0].Path != "a/b/c/big2" || sum.Mismatches[0].Src == sum.Mismatches[0].Dest {
		t.Fatalf("mismatches %+v", sum.Mismatches)
	}
	if sum.Verified != 4 {
		t.Errorf("verified %d files, want 4", sum.Verified)
	}
	got := listTree(t, b, "/dst")
	if _, ok := got["a/b/c/big2"]; ok {
		t.Error("corrupt file installed under its final name")
	}
	if _, ok := got[pcopy.JournalName]; !ok {
		t.Error("journal removed although a file still needs copying")
	}
	// A resumed copy without the fault fixes just that file.
	sum, err = pcopy.Copy(ctx, pcopy.Endpoint{FS: a, Path: "/src"}, pcopy.Endpoint{FS: b, Path: "/dst"},
		pcopy.Options{Recursive: true, Verify: true, Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Files != 1 || sum.ResumedFiles != 4 {
		t.Errorf("resume after mismatch: %+v", sum)
	}
	sameTree(t, a, "/src", b, "/dst")
}

func TestCopyErrors(t *testing.T) {
	ctx := testCtx(t)
	local := pcopy.Local()
	dir := t.TempDir()
	makeTree(t, local, dir+"/src", testTree)
	for _, tc := range []struct {
		name     string
		src, dst string
		want     string
	}{
		{"missing source", dir + "/nope", dir + "/x", "no such file"},
		{"special file", "/dev/null", dir + "/x", "special file"},
		{"missing destination parent", dir + "/src/small.txt", dir + "/no/such/dir/x", "no such file"},
		{"directory over a file", dir + "/src", dir + "/src/small.txt", "cannot copy directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pcopy.Copy(ctx, pcopy.Endpoint{FS: local, Path: tc.src}, pcopy.Endpoint{FS: local, Path: tc.dst}, pcopy.Options{Recursive: true})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestFormatProgress(t *testing.T) {
	for _, tc := range []struct {
		p    pcopy.Progress
		bar  bool
		want []string
	}{
		{pcopy.Progress{Bytes: 1 << 30, TotalBytes: 2 << 30, Copied: 1 << 30, Files: 3, TotalFiles: 64, Elapsed: 10 * time.Second}, true,
			[]string{"[############............]", " 50% 1.0 GiB/2.0 GiB", "3/64 files", "107.4 MB/s", "ETA 0:10"}},
		{pcopy.Progress{Scanning: true, TotalBytes: 5000, TotalFiles: 2, Elapsed: time.Second}, false,
			[]string{"0% 0 B/4.9 KiB", "0/2 files", "scanning"}},
		{pcopy.Progress{Bytes: 10, TotalBytes: 10, Files: 1, TotalFiles: 1, Elapsed: 61 * time.Second}, false,
			[]string{"100%", "1:01"}},
	} {
		got := pcopy.FormatProgress(tc.p, tc.bar)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("FormatProgress(%+v) = %q, want it to contain %q", tc.p, got, w)
			}
		}
	}
	var buf bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	pcopy.Report(ctx, &buf, false, time.Hour, func() pcopy.Progress { return pcopy.Progress{} })
	if buf.Len() != 0 {
		t.Errorf("Report that never ticked printed %q", buf.String())
	}
}

// TestCopyArchive copies a tree that holds what an operating system's
// root holds besides files (owners other than root, hard links, devices,
// a FIFO and a socket) from the local disk to a cluster and back, and
// checks that Archive kept all of it both ways, and that a second,
// resumed-style copy over the first gives the same result.
func TestCopyArchive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mknod of devices and chown")
	}
	ctx := testCtx(t)
	cl, _ := startCluster(t)
	local := pcopy.Local()
	dir := t.TempDir()
	src := dir + "/src"
	for _, d := range []string{"etc", "dev", "run", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string, data string, perm os.FileMode, uid, gid int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(src, p), []byte(data), perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(src, p), uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(src, p), perm); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/shadow", "root:*:1::::::\n", 0o640, 0, 42)
	write("usr/bin/chage", "#!/bin/true\n", 0o2755, 0, 42)
	write("usr/bin/perl5.36", "perl", 0o755, 0, 0)
	write("etc/owned", "x", 0o600, 1234, 5678)
	for _, l := range [][2]string{{"usr/bin/perl5.36", "usr/bin/perl"}, {"usr/bin/perl5.36", "etc/perl-again"}} {
		if err := os.Link(filepath.Join(src, l[0]), filepath.Join(src, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("shadow", filepath.Join(src, "etc/shadow-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(src, "etc/shadow-link"), 101, 102); err != nil {
		t.Fatal(err)
	}
	specials := []struct {
		name     string
		mode     uint32
		maj, min uint32
		uid, gid int
	}{
		{"dev/null", unix.S_IFCHR | 0o666, 1, 3, 0, 0},
		{"dev/tty", unix.S_IFCHR | 0o666, 5, 0, 0, 5},
		{"dev/sda", unix.S_IFBLK | 0o660, 8, 0, 0, 6},
		{"run/initctl", unix.S_IFIFO | 0o600, 0, 0, 0, 0},
		{"run/sock", unix.S_IFSOCK | 0o755, 0, 0, 7, 8},
	}
	for _, s := range specials {
		p := filepath.Join(src, s.name)
		if err := unix.Mknod(p, s.mode, int(unix.Mkdev(s.maj, s.min))); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, s.uid, s.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, os.FileMode(s.mode&0o777)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(src, "run"), 0, 99); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name     string
		src, dst pcopy.Endpoint
	}{
		{"local to cluster", pcopy.Endpoint{FS: local, Path: src}, pcopy.Endpoint{FS: cl, Path: "/root"}},
		{"cluster to local", pcopy.Endpoint{FS: cl, Path: "/root"}, pcopy.Endpoint{FS: local, Path: dir + "/back"}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			sum, err := pcopy.Copy(ctx, st.src, st.dst, pcopy.Options{Recursive: true, Archive: true})
			if err != nil {
				t.Fatal(err)
			}
			if sum.Links != 2 || sum.Specials != 5 || sum.Skipped != 0 || sum.Files != 4 {
				t.Errorf("summary %+v: want 4 files, 2 links, 5 special files", sum)
			}
			sameArchive(t, st.src.FS, st.src.Path, st.dst.FS, st.dst.Path)
		})
	}
	// Without Archive, the special files are skipped and the links are
	// separate files: the difference the option makes.
	sum, err := pcopy.Copy(ctx, pcopy.Endpoint{FS: local, Path: src}, pcopy.Endpoint{FS: cl, Path: "/plain"}, pcopy.Options{Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Skipped != 5 || sum.Files != 6 || sum.Links != 0 {
		t.Errorf("copy without Archive: %+v, want 6 files and 5 skipped", sum)
	}
}

// sameArchive checks what sameTree checks plus owners, groups, device
// numbers and special types, and that names that share an ID at the
// source share one at the destination (and only those).
func sameArchive(t *testing.T, sfs pcopy.FS, src string, dfs pcopy.FS, dst string) {
	t.Helper()
	sameTree(t, sfs, src, dfs, dst)
	s, d := listTree(t, sfs, src), listTree(t, dfs, dst)
	sGroups, dGroups := map[pcopy.FileID][]string{}, map[pcopy.FileID][]string{}
	for rel, si := range s {
		di, ok := d[rel]
		if !ok {
			continue // sameTree reported it
		}
		if si.UID != di.UID || si.GID != di.GID {
			t.Errorf("%s: owner %d:%d, want %d:%d", rel, di.UID, di.GID, si.UID, si.GID)
		}
		if si.Special != di.Special || si.RdevMajor != di.RdevMajor || si.RdevMinor != di.RdevMinor {
			t.Errorf("%s: special %o %d,%d, want %o %d,%d", rel, di.Special, di.RdevMajor, di.RdevMinor, si.Special, si.RdevMajor, si.RdevMinor)
		}
		if si.Type == pcopy.TypeFile {
			if si.Nlink != di.Nlink {
				t.Errorf("%s: %d links, want %d", rel, di.Nlink, si.Nlink)
			}
			sGroups[si.ID] = append(sGroups[si.ID], rel)
			dGroups[di.ID] = append(dGroups[di.ID], rel)
		}
	}
	norm := func(g map[pcopy.FileID][]string) map[string]bool {
		out := map[string]bool{}
		for _, names := range g {
			slices.Sort(names)
			out[strings.Join(names, " ")] = true
		}
		return out
	}
	if sg, dg := norm(sGroups), norm(dGroups); !maps.Equal(sg, dg) {
		t.Errorf("names of one file: %v, want %v", dg, sg)
	}
}
