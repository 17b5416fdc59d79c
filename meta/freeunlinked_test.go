package meta_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// TestFreeUnlinked: Remove with meta.WithFreeUnlinked deletes the inode of
// a regular file whose last link it drops, in the same transaction, when
// the entry still names the inode the caller checked; otherwise the file
// becomes an orphan (or keeps its other links) as without it.
func TestFreeUnlinked(t *testing.T) {
	for _, tc := range []struct {
		name      string
		otherIno  bool // the caller checked another inode
		link      bool // the file has a second link
		dir       bool // the name is an empty directory
		wantFreed bool
	}{
		{name: "last link", wantFreed: true},
		{name: "another inode under the name", otherIno: true},
		{name: "second link", link: true},
		{name: "directory", dir: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := meta.OpenBolt(filepath.Join(t.TempDir(), "meta.db"), meta.BoltOptions{GroupCommit: true, WAL: true})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			typ, mode := meta.TypeRegular, uint32(0o644)
			if tc.dir {
				typ, mode = meta.TypeDirectory, 0o755
			}
			nd, _, err := e.Create(ctx, meta.RootIno, "f", meta.CreateArgs{Type: typ, Mode: mode}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.link {
				if _, _, err := e.Link(ctx, nd.Ino, meta.RootIno, "g", time.Time{}); err != nil {
					t.Fatal(err)
				}
			}
			before, err := e.StatFS(ctx)
			if err != nil {
				t.Fatal(err)
			}
			f := &meta.FreeUnlinked{Ino: nd.Ino}
			if tc.otherIno {
				f.Ino = nd.Ino + 1
			}
			got, _, err := e.Remove(meta.WithFreeUnlinked(ctx, f), meta.RootIno, "f", time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if f.Freed != tc.wantFreed {
				t.Fatalf("Freed %v, want %v", f.Freed, tc.wantFreed)
			}
			orphans, err := e.Orphans(ctx)
			if err != nil {
				t.Fatal(err)
			}
			orphan := slices.Contains(orphans, nd.Ino)
			_, err = e.GetAttr(ctx, nd.Ino)
			gone := errors.Is(err, meta.ErrStale)
			after, serr := e.StatFS(ctx)
			if serr != nil {
				t.Fatal(serr)
			}
			switch {
			case tc.wantFreed:
				if !gone || orphan || got.Attr.Nlink != 0 || after.Files != before.Files-1 {
					t.Fatalf("freed: getattr %v, orphan %v, nlink %d, files %d -> %d", err, orphan, got.Attr.Nlink, before.Files, after.Files)
				}
			case tc.link:
				if gone || orphan || got.Attr.Nlink != 1 {
					t.Fatalf("second link: getattr %v, orphan %v, nlink %d", err, orphan, got.Attr.Nlink)
				}
			case tc.dir:
				if !gone || orphan {
					t.Fatalf("directory: getattr %v, orphan %v", err, orphan)
				}
			default:
				if gone || !orphan || got.Attr.Nlink != 0 {
					t.Fatalf("kept as an orphan: getattr %v, orphan %v, nlink %d", err, orphan, got.Attr.Nlink)
				}
				if _, err := e.FreeOrphan(ctx, nd.Ino); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
