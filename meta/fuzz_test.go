package meta

import (
	"bytes"
	"slices"
	"testing"
)

// FuzzDecodeStripeMap feeds arbitrary records to decodeStripeMap. It must
// never panic, and whatever it accepts must be a valid map that encodes
// back to the same bytes, except a version-2 record with neither
// replicas nor stale ids, which is written as version 1.
func FuzzDecodeStripeMap(f *testing.F) {
	f.Add(stripeV1Golden)
	f.Add(stripeV2Golden)
	for _, m := range []StripeMap{
		{Unit: 1, DataServers: []string{"a"}},
		{Unit: 1 << 20, First: 2, Gen: 9, DataServers: []string{"a", "b", "a"}, Stale: []string{"a"}},
		{Unit: 4096, DataServers: []string{"a", "b"}, Replicas: [][]string{{"b", "c"}, {"c", "a"}}},
	} {
		b := m.encode()
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := slices.Clone(b)
		m, err := decodeStripeMap(b)
		if !bytes.Equal(b, in) {
			t.Fatal("decodeStripeMap modified its input")
		}
		if err != nil {
			return
		}
		if err := m.validate(); err != nil {
			t.Fatalf("decoded an invalid map %+v: %v", m, err)
		}
		enc := m.encode()
		if b[0] == stripeMapVersion || m.Replicas != nil || len(m.Stale) > 0 {
			if !bytes.Equal(enc, b) {
				t.Fatalf("%x decodes to %+v, which encodes to %x", b, m, enc)
			}
		} else if enc[0] != stripeMapVersion {
			t.Fatalf("single-copy map %+v encoded as version %d", m, enc[0])
		}
		again, err := decodeStripeMap(enc)
		if err != nil || !again.Equal(m) || again.Gen != m.Gen || !slices.Equal(again.Stale, m.Stale) {
			t.Fatalf("re-decoding %+v: %+v, %v", m, again, err)
		}
		// The accessors must hold up on anything the decoder accepts.
		for p := range m.DataServers {
			if got := len(m.Members(p)); got != m.Mirrors() {
				t.Fatalf("position %d has %d members, map has %d copies", p, got, m.Mirrors())
			}
			m.Good(p)
		}
		m.Position(^uint64(0))
		m.All()
	})
}

// FuzzDecodePolicy feeds arbitrary records to decodePolicy: it must never
// panic, and what it accepts is a set policy whose encoding is a prefix
// of the record (the mirrors, and the layout bytes if any is set).
func FuzzDecodePolicy(f *testing.F) {
	for m := 1; m <= MaxMirrors; m++ {
		f.Add(Policy{Mirrors: m}.encode())
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0})
	f.Add([]byte{1, 2, 0xff})
	f.Add(Policy{Layout: LayoutFlexFiles, LayoutsBelow: layoutSetAll}.encode())
	f.Add([]byte{1, 2, 0, 0, 7})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodePolicy(b)
		if err != nil {
			return
		}
		if p == (Policy{}) || p.validate() != nil {
			t.Fatalf("%x decodes to %+v, which is not a set policy", b, p)
		}
		if enc := p.encode(); !bytes.Equal(enc, b[:len(enc)]) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", b, p, enc)
		}
	})
}

// FuzzDecodeXattrs feeds arbitrary records to decodeXattrs: it must never
// panic or modify its input, and what it accepts is a valid, sorted set
// of attributes within the limits that encodes back to the same bytes.
func FuzzDecodeXattrs(f *testing.F) {
	for _, xs := range [][]xattr{
		{{name: "a", value: []byte("1")}},
		{{name: "a", value: nil}, {name: "b", value: []byte{0, 0xff}}, {name: "mime_type", value: []byte("text/plain")}},
		{{name: string(bytes.Repeat([]byte{'n'}, MaxXattrNameLen)), value: bytes.Repeat([]byte{'v'}, 300)}},
	} {
		b := encodeXattrs(xs)
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Add([]byte{xattrV1})
	f.Add([]byte{xattrV1, 1, 'b', 0, 0, 0, 0, 1, 'a', 0, 0, 0, 0})
	f.Add([]byte{xattrV1, 1, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := slices.Clone(b)
		xs, err := decodeXattrs(b)
		if !bytes.Equal(b, in) {
			t.Fatal("decodeXattrs modified its input")
		}
		if err != nil {
			return
		}
		if len(xs) == 0 {
			t.Fatalf("%x decodes to no attributes", b)
		}
		for i, x := range xs {
			if validXattrName(x.name) != nil || len(x.value) > MaxXattrValueLen || i > 0 && x.name <= xs[i-1].name {
				t.Fatalf("%x decodes to invalid or unsorted attribute %d: %q", b, i, x.name)
			}
		}
		if enc := encodeXattrs(xs); !bytes.Equal(enc, b) {
			t.Fatalf("%x decodes to %d attributes, which encode to %x", b, len(xs), enc)
		}
	})
}
