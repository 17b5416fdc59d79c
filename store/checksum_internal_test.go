//go:build linux

package store

import (
	"bytes"
	"os"
	"testing"
)

// TestAlignedWriteReadsNothing swaps an object's descriptor for a
// write-only one: an aligned 1 MiB write must still succeed (it reads
// nothing back), while an unaligned one, which must read, fails.
func TestAlignedWriteReadsNothing(t *testing.T) {
	l, err := NewLocal(t.TempDir(), LocalOptions{Checksums: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := l.Open(1, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := f.(*handle)
	if _, err := h.WriteAt(bytes.Repeat([]byte{1}, 2<<20), 0); err != nil {
		t.Fatal(err)
	}
	wo, err := os.OpenFile(l.path(1), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	rw := h.e.f
	h.e.f = wo
	defer func() { h.e.f = rw; wo.Close() }()
	for _, off := range []int64{0, 1 << 20, 4 << 20} {
		if _, err := h.WriteAt(bytes.Repeat([]byte{2}, 1<<20), off); err != nil {
			t.Fatalf("aligned write at %d read back: %v", off, err)
		}
	}
	if _, err := h.WriteAt([]byte{3}, 5); err == nil {
		t.Fatal("unaligned write did not need to read")
	}
}
