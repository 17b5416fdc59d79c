// Package faultfs mounts a directory through FUSE so that a test can make
// the fsync and fdatasync calls on its files fail or wait, as a failing or
// overloaded disk does. The files are real files (a loopback of a backing
// directory): a program under test opens, writes, mmaps and renames them
// as usual, and only the syncs are steered.
//
// Written by hand because what it needs is one method on top of go-fuse's
// loopback file system; no library offers a disk whose fsync a test can
// fail on command, and the kernel's device-mapper targets (dm-error,
// dm-flakey) are not available on every machine the tests run on.
package faultfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FS is a mounted loopback file system with steerable syncs.
type FS struct {
	// Dir is the mount point: the files the program under test uses.
	Dir string

	server *fuse.Server

	mu      sync.Mutex
	fail    func(name string) bool // matching syncs fail with EIO
	hold    func(name string) bool // matching syncs wait for release
	release chan struct{}
	held    chan string
	syncs   map[string]int
}

// Mount mounts backing at a fresh directory and returns the file system;
// Close unmounts it. Mounting needs /dev/fuse and root (or fusermount3).
func Mount(backing string) (*FS, error) {
	mnt, err := os.MkdirTemp("", "faultfs-mnt-")
	if err != nil {
		return nil, err
	}
	f := &FS{Dir: mnt, held: make(chan string, 1024), syncs: map[string]int{}}
	root := &fs.LoopbackRoot{Path: backing}
	root.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: fs.LoopbackNode{RootData: r}, fs: f}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		os.Remove(mnt)
		return nil, fmt.Errorf("faultfs: %w", err)
	}
	root.Dev = uint64(st.Dev)
	rootNode := root.NewNode(root, nil, "", &st)
	root.RootNode = rootNode
	sec := time.Second
	srv, err := fs.Mount(mnt, rootNode, &fs.Options{
		EntryTimeout: &sec, AttrTimeout: &sec,
		MountOptions: fuse.MountOptions{FsName: "faultfs", Name: "faultfs"},
	})
	if err != nil {
		os.Remove(mnt)
		return nil, fmt.Errorf("faultfs: mount %s: %w", mnt, err)
	}
	f.server = srv
	return f, nil
}

// Close lets every held sync go and unmounts. If files are still open
// (a test that failed before closing what it opened), it aborts the FUSE
// connection first, so that the test process cannot hang at exit on a
// request to its own, stopped, file server.
func (f *FS) Close() error {
	f.Release()
	err := f.server.Unmount()
	if err != nil {
		f.abort()
		err = syscall.Unmount(f.Dir, syscall.MNT_DETACH)
	}
	os.Remove(f.Dir)
	return err
}

// abort aborts the mount's FUSE connection through fusectl: every request
// waiting on it and every later one fails with ENOTCONN.
func (f *FS) abort() {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 || fields[4] != f.Dir {
			continue
		}
		_, minor, ok := strings.Cut(fields[2], ":")
		if !ok {
			return
		}
		const ctl = "/sys/fs/fuse/connections"
		if ents, _ := os.ReadDir(ctl); len(ents) == 0 {
			_ = syscall.Mount("fusectl", ctl, "fusectl", 0, "")
		}
		_ = os.WriteFile(filepath.Join(ctl, minor, "abort"), []byte("1"), 0o200)
		return
	}
}

// FailSyncs makes every later sync of a file whose base name matches fail
// with EIO (nil: none fail).
func (f *FS) FailSyncs(match func(name string) bool) {
	f.mu.Lock()
	f.fail = match
	f.mu.Unlock()
}

// HoldSyncs makes every later sync of a file whose base name matches wait
// until Release, and report the name on Held when it starts waiting.
func (f *FS) HoldSyncs(match func(name string) bool) {
	f.mu.Lock()
	f.hold = match
	if f.release == nil {
		f.release = make(chan struct{})
	}
	f.mu.Unlock()
}

// Held reports, in order, the base names of syncs that began to wait.
func (f *FS) Held() <-chan string { return f.held }

// Release ends HoldSyncs and lets the waiting syncs go on.
func (f *FS) Release() {
	f.mu.Lock()
	f.hold = nil
	if f.release != nil {
		close(f.release)
		f.release = nil
	}
	f.mu.Unlock()
}

// Syncs reports how many syncs of files whose base name matches have
// reached the file system (failed, held or done).
func (f *FS) Syncs(match func(name string) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for name, c := range f.syncs {
		if match(name) {
			n += c
		}
	}
	return n
}

// node is a loopback node whose syncs go through the FS's rules.
type node struct {
	fs.LoopbackNode
	fs *FS
}

var _ fs.NodeFsyncer = (*node)(nil)

// Fsync serves both fsync and fdatasync (FUSE does not tell them apart
// beyond a flag).
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	name := filepath.Base(n.Path(n.Root()))
	f := n.fs
	f.mu.Lock()
	f.syncs[name]++
	fail := f.fail != nil && f.fail(name)
	var wait chan struct{}
	if f.hold != nil && f.hold(name) {
		wait = f.release
	}
	f.mu.Unlock()
	if fail {
		return syscall.EIO
	}
	if wait != nil {
		select {
		case f.held <- name:
		default:
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return syscall.EINTR
		}
	}
	if s, ok := fh.(fs.FileFsyncer); ok {
		return s.Fsync(ctx, flags)
	}
	return syscall.ENOSYS
}

// ForTest mounts a fresh temporary directory for t and unmounts it when t
// ends, or skips t where FUSE is not available.
func ForTest(t testing.TB) *FS {
	t.Helper()
	if dev, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		t.Skipf("FUSE unavailable (%v)", err)
	} else {
		dev.Close()
	}
	f, err := Mount(t.TempDir())
	if err != nil {
		t.Skipf("cannot mount faultfs: %v", err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("faultfs: %v", err)
		}
	})
	return f
}
