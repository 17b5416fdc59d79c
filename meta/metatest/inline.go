package metatest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/shoalfs/shoal/meta"
)

func (v *env) inline(ino meta.Ino) ([]byte, bool) {
	v.t.Helper()
	d, ok, err := v.e.InlineData(v.ctx, ino)
	if err != nil {
		v.t.Fatalf("InlineData %d: %v", ino, err)
	}
	return d, ok
}

// testInline covers inline data: writes splice into the record and move
// size and mtime in the same transaction, writes past the bound or to a
// file with a stripe map are refused without a change, truncation cuts
// the record, the record survives a reopen, DropInline needs a map for
// bytes to go to, and the record goes with its inode.
func testInline(t *testing.T, v *env) {
	const limit = 64
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	if _, ok := v.inline(f.Ino); ok {
		t.Fatal("a new file has inline data")
	}

	steps := []struct {
		name     string
		off      uint64
		data     string
		want     string // the record afterwards
		wantSize uint64
		err      error
	}{
		{"first write", 0, "hello", "hello", 5, nil},
		{"overwrite inside", 1, "EL", "hELlo", 5, nil},
		{"past the end leaves zeros", 8, "xy", "hELlo\x00\x00\x00xy", 10, nil},
		{"up to the limit", 60, "abcd", "", 64, nil},
		{"one byte past the limit", 64, "z", "", 64, meta.ErrNotInline},
		{"straddling the limit", 62, "abc", "", 64, meta.ErrNotInline},
	}
	for _, s := range steps {
		before := v.attr(f.Ino)
		now := v.tick()
		a, err := v.e.WriteInline(v.ctx, f.Ino, s.off, []byte(s.data), limit, now)
		wantErr(t, s.name, err, s.err)
		got, ok := v.inline(f.Ino)
		if !ok {
			t.Fatalf("%s: no inline data", s.name)
		}
		if s.want != "" && string(got) != s.want {
			t.Fatalf("%s: data %q, want %q", s.name, got, s.want)
		}
		after := v.attr(f.Ino)
		if after.Size != s.wantSize {
			t.Fatalf("%s: size %d, want %d", s.name, after.Size, s.wantSize)
		}
		if s.err != nil {
			if after.Change != before.Change || !after.Mtime.Equal(before.Mtime) {
				t.Fatalf("%s: refused write changed the attributes", s.name)
			}
			continue
		}
		if !after.Mtime.Equal(now) || after.Change <= before.Change || a.Size != after.Size {
			t.Fatalf("%s: attrs %+v (returned %+v), want mtime %v and a new change", s.name, after, a, now)
		}
	}
	full, _ := v.inline(f.Ino)
	if len(full) != limit || !bytes.HasSuffix(full, []byte("abcd")) {
		t.Fatalf("data after the writes: %q", full)
	}

	_, err := v.e.WriteInline(v.ctx, d.Ino, 0, []byte("x"), limit, v.tick())
	wantErr(t, "WriteInline to a directory", err, meta.ErrInval)
	_, err = v.e.WriteInline(v.ctx, 1<<40, 0, []byte("x"), limit, v.tick())
	wantErr(t, "WriteInline to a missing inode", err, meta.ErrStale)

	// Truncation cuts the record, never lengthens it.
	if err := v.e.TruncateInline(v.ctx, f.Ino, 3); err != nil {
		t.Fatal(err)
	}
	if err := v.e.TruncateInline(v.ctx, f.Ino, 50); err != nil {
		t.Fatal(err)
	}
	if got, _ := v.inline(f.Ino); string(got) != "hEL" {
		t.Fatalf("after truncating to 3 and growing: %q", got)
	}

	v.reopen()
	if got, ok := v.inline(f.Ino); !ok || string(got) != "hEL" {
		t.Fatalf("after reopen: %q, %v", got, ok)
	}

	// Moving the data out: a map first, then the record is dropped, and
	// the file is never written inline again.
	wantErr(t, "DropInline without a map", v.e.DropInline(v.ctx, f.Ino), meta.ErrInval)
	m := meta.StripeMap{Unit: 4096, DataServers: []string{"ds-a"}}
	if _, err := v.e.PlaceStripeMap(v.ctx, f.Ino, m); err != nil {
		t.Fatal(err)
	}
	if got, ok := v.inline(f.Ino); !ok || string(got) != "hEL" {
		t.Fatalf("a placed map hid the record: %q, %v", got, ok)
	}
	_, err = v.e.WriteInline(v.ctx, f.Ino, 0, []byte("x"), limit, v.tick())
	wantErr(t, "WriteInline with a map", err, meta.ErrNotInline)
	if err := v.e.DropInline(v.ctx, f.Ino); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.inline(f.Ino); ok {
		t.Fatal("record still there after DropInline")
	}
	if err := v.e.DropInline(v.ctx, f.Ino); err != nil {
		t.Fatalf("DropInline of a file without a record: %v", err)
	}

	// An empty record can be dropped without a map.
	g := v.create(meta.RootIno, "g", meta.TypeRegular)
	if _, err := v.e.WriteInline(v.ctx, g.Ino, 0, []byte("abc"), limit, v.tick()); err != nil {
		t.Fatal(err)
	}
	if err := v.e.TruncateInline(v.ctx, g.Ino, 0); err != nil {
		t.Fatal(err)
	}
	if err := v.e.DropInline(v.ctx, g.Ino); err != nil {
		t.Fatalf("DropInline of an empty record: %v", err)
	}

	// The record goes with the inode.
	h := v.create(meta.RootIno, "h", meta.TypeRegular)
	if _, err := v.e.WriteInline(v.ctx, h.Ino, 0, []byte("data"), limit, v.tick()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.e.Remove(v.ctx, meta.RootIno, "h", v.tick()); err != nil {
		t.Fatal(err)
	}
	if got, ok := v.inline(h.Ino); !ok || string(got) != "data" {
		t.Fatalf("an orphan lost its data before it was freed: %q, %v", got, ok)
	}
	if _, err := v.e.FreeOrphan(v.ctx, h.Ino); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := v.e.InlineData(v.ctx, h.Ino); ok || err != nil && !errors.Is(err, meta.ErrStale) {
		t.Fatalf("after FreeOrphan: ok %v, err %v", ok, err)
	}
}
