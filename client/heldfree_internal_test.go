package client

import (
	"runtime"
	"syscall"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// BenchmarkHeldCopy1MiB is what a streaming UNSTABLE write costs the
// client beyond sending: each 1 MiB WRITE is copied into a held buffer,
// and every 64 MiB (Policy.UnstableLimit) a commit drops them all. In
// "gc" a garbage collection follows every second commit, as in a mount
// streaming 4 files (8 cycles per GiB written, GODEBUG=gctrace=1); its
// time is not counted. faults/op is the minor page faults per 1 MiB copy
// (getrusage): a buffer that went back to the collector is faulted in and
// zeroed again, which costs more than the copy. Timings are noisy on a
// shared machine; faults/op is not.
func BenchmarkHeldCopy1MiB(b *testing.B) {
	for _, tc := range []struct {
		name string
		gc   bool
	}{{"steady", false}, {"gc", true}} {
		b.Run(tc.name, func(b *testing.B) {
			const chunk = 1 << 20
			const perCommit = DefaultUnstableLimit / chunk
			p := make([]byte, chunk)
			for i := range p {
				p[i] = byte(i)
			}
			var u unstable
			var off uint64
			commits := 0
			b.SetBytes(chunk)
			b.ReportAllocs()
			f0 := minorFaults(b)
			for b.Loop() {
				u.insert(newHeld(off, p, nfs4.Verifier4{1}))
				off += chunk
				if off == perCommit*chunk {
					u.reset()
					off = 0
					if commits++; tc.gc && commits%2 == 0 {
						b.StopTimer()
						runtime.GC()
						b.StartTimer()
					}
				}
			}
			b.ReportMetric(float64(minorFaults(b)-f0)/float64(b.N), "faults/op")
			u.reset()
		})
	}
}

func minorFaults(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Minflt
}

// TestHeldFreeList: the list takes buffers up to heldFreeMax bytes and
// refuses more, hands back the ones of the class asked for, and empties
// itself at a trim check that finds it unused since the last one.
func TestHeldFreeList(t *testing.T) {
	var l heldFreeList
	const class = heldMaxShift - heldMinShift // 1 MiB buffers
	n := heldFreeMax >> heldMaxShift
	for i := range n {
		if !l.put(&heldBuf{b: make([]byte, 0, 1<<heldMaxShift)}, class) {
			t.Fatalf("put %d of %d refused", i+1, n)
		}
	}
	if l.put(&heldBuf{b: make([]byte, 0, 1<<heldMaxShift)}, class) {
		t.Fatalf("put past %d bytes taken", heldFreeMax)
	}
	if hb := l.get(0); hb != nil {
		t.Fatalf("get of the 512-byte class returned a buffer of %d bytes", cap(hb.b))
	}
	if hb := l.get(class); hb == nil || cap(hb.b) != 1<<heldMaxShift {
		t.Fatalf("get of the 1 MiB class = %v", hb)
	}
	l.trim() // used since the last check: kept
	if l.bytes != heldFreeMax-1<<heldMaxShift {
		t.Fatalf("after a trim of a used list: %d bytes listed", l.bytes)
	}
	l.trim() // unused since: emptied
	if l.bytes != 0 || l.get(class) != nil {
		t.Fatalf("after a trim of an unused list: %d bytes listed", l.bytes)
	}
}
