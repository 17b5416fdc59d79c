package xdr

import (
	"bytes"
	"testing"
)

func TestMarkTruncate(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 1000)
	e := NewEncoder(16)
	e.Uint32(1)
	e.OpaqueRef(big)
	m := e.Mark()
	e.Uint32(2)
	e.OpaqueRef(big)
	e.Uint32(3)
	tail := e.BytesSince(m)
	if len(tail) != 4+4+1000+4 {
		t.Fatalf("tail len %d", len(tail))
	}
	all := e.Bytes()
	if !bytes.Equal(all[m:], tail) {
		t.Fatal("BytesSince mismatch")
	}
	e.Truncate(m)
	if e.Len() != m || !bytes.Equal(e.Bytes(), all[:m]) {
		t.Fatalf("after truncate len %d want %d", e.Len(), m)
	}
	e.Uint32(9)
	if got := e.Bytes(); len(got) != m+4 {
		t.Fatalf("len %d", len(got))
	}
}
