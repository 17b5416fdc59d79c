package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// TestAdminFsck runs `shoal admin fsck` on a server directory made by the
// metadata engine: consistent, then with a data object no file owns (a
// file in data/ for an inode that does not exist), then on a directory
// with no database.
func TestAdminFsck(t *testing.T) {
	dir := t.TempDir()
	e, err := meta.OpenBolt(filepath.Join(dir, "meta.db"), meta.BoltOptions{WAL: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n, _, err := e.Create(ctx, meta.RootIno, "f", meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	object := func(ino meta.Ino) {
		t.Helper()
		sub := filepath.Join(dir, "data", strconv.FormatUint(uint64(ino)&0xff+0x100, 16)[1:])
		if err := os.MkdirAll(sub, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, strconv.FormatUint(uint64(ino), 10)), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 256 { // the store's layout: 256 folders, all present
		if err := os.MkdirAll(filepath.Join(dir, "data", strconv.FormatUint(uint64(i)+0x100, 16)[1:]), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	object(n.Ino)
	run := func(args ...string) error {
		cmd := newAdminFsckCmd()
		cmd.SetArgs(args)
		cmd.SetOut(os.Stderr)
		return cmd.ExecuteContext(ctx)
	}
	if err := run("--dir", dir); err != nil {
		t.Fatalf("consistent directory: %v", err)
	}
	object(n.Ino + 1000)
	var ee *exitError
	if err := run("--dir", dir, "--json"); !errors.As(err, &ee) || ee.code != exitInconsistent {
		t.Fatalf("data object of no inode: %v, want exit status %d", err, exitInconsistent)
	}
	// --repair removes the object no file owns, keeps the file's, and
	// the directory is consistent again.
	if err := run("--dir", dir, "--repair"); err != nil {
		t.Fatalf("--repair: %v", err)
	}
	objs, err := dataObjects(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0] != n.Ino {
		t.Fatalf("after --repair the data objects are %v, want only %d", objs, n.Ino)
	}
	if err := run("--dir", dir); err != nil {
		t.Fatalf("after --repair: %v", err)
	}
	if err := run("--dir", t.TempDir()); err == nil || errors.As(err, &ee) {
		t.Fatalf("directory without a database: %v", err)
	}
}
