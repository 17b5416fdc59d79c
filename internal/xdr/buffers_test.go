package xdr

import (
	"bytes"
	"net"
	"testing"
)

// TestAppendBuffers: AppendBuffers appends what Buffers returns, for
// output with and without spliced slices (at the start, the middle, the
// end), and costs no allocation when dst has room.
func TestAppendBuffers(t *testing.T) {
	for _, tc := range []struct {
		name string
		enc  func(e *Encoder)
	}{
		{"empty", func(e *Encoder) {}},
		{"plain", func(e *Encoder) { e.Uint32(7); e.Opaque([]byte("abc")) }},
		{"spliced first", func(e *Encoder) { e.OpaqueRef([]byte("data")); e.Uint32(1) }},
		{"spliced middle", func(e *Encoder) { e.Uint32(1); e.OpaqueRef([]byte("data")); e.Uint32(2) }},
		{"spliced last", func(e *Encoder) { e.Uint32(1); e.OpaqueRef([]byte("abcd")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := NewEncoder(64)
			tc.enc(e)
			want := e.Buffers()
			head := []byte("head")
			got := e.AppendBuffers(net.Buffers{head})
			if len(got) != len(want)+1 || !bytes.Equal(got[0], head) {
				t.Fatalf("AppendBuffers: %q, want %q after %q", got, want, head)
			}
			for i := range want {
				if !bytes.Equal(got[i+1], want[i]) {
					t.Fatalf("AppendBuffers: %q, want %q after %q", got, want, head)
				}
			}
			var arr [8][]byte
			if n := testing.AllocsPerRun(10, func() { _ = e.AppendBuffers(arr[:0]) }); n != 0 {
				t.Fatalf("AppendBuffers with room allocated %v times", n)
			}
		})
	}
}
