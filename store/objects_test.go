//go:build linux

package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/shoalfs/shoal/store"
)

// TestLocalPage: paging through a store's objects with any page size
// lists each object exactly once (sidecars never), in the store's order
// (folder, then number), and the last page says so; ListObjects yields
// the same; RemoveObject removes only what it names.
func TestLocalPage(t *testing.T) {
	dir := t.TempDir()
	l, err := store.NewLocal(dir, store.LocalOptions{Checksums: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Numbers in the same folder (low byte 0x02), neighbours, large ones.
	objs := []uint64{2, 3, 258, 514, 255, 256, 1 << 40, 1<<40 + 2, 99999}
	for _, ino := range objs {
		f, err := l.Open(ino, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	order := func(a, b uint64) int {
		if a&0xff != b&0xff {
			return int(a&0xff) - int(b&0xff)
		}
		if a < b {
			return -1
		}
		return 1
	}
	want := slices.Clone(objs)
	slices.SortFunc(want, order)
	for _, max := range []int{1, 2, 3, len(objs), 1000} {
		var got []uint64
		var after uint64
		for pages := 0; ; pages++ {
			if pages > len(objs)+1 {
				t.Fatalf("max %d: no end after %d pages", max, pages)
			}
			inos, eof, err := l.Page(after, max)
			if err != nil {
				t.Fatal(err)
			}
			if len(inos) > max {
				t.Fatalf("max %d: page of %d", max, len(inos))
			}
			got = append(got, inos...)
			if eof {
				break
			}
			after = inos[len(inos)-1]
		}
		if !slices.Equal(got, want) {
			t.Errorf("max %d: listed %v, want %v", max, got, want)
		}
	}
	var listed []uint64
	if err := l.ListObjects(context.Background(), func(place string, inos []uint64) error {
		if place != "" {
			t.Errorf("place %q", place)
		}
		listed = append(listed, inos...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(listed, want) {
		t.Errorf("ListObjects: %v, want %v", listed, want)
	}
	if err := l.RemoveObject(context.Background(), "", 258); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveObject(context.Background(), "ds1", 2); err == nil {
		t.Error("RemoveObject at a place of a local store succeeded")
	}
	inos, _, err := l.Page(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.DeleteFunc(want, func(i uint64) bool { return i == 258 }); !slices.Equal(inos, want) {
		t.Errorf("after removing 258: %v, want %v", inos, want)
	}
}

var _ store.ObjectLister = (*store.Local)(nil)
