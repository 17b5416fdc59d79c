package server

import (
	"bytes"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

// encodeOps encodes operations as they follow SEQUENCE in a COMPOUND.
func encodeOps(ops ...nfs4.NfsArgop4) []byte {
	e := xdr.NewEncoder(256)
	for i := range ops {
		ops[i].EncodeXDR(e)
	}
	return e.Bytes()
}

// TestRequestHashExtents checks that the byte-level measurement of the
// data-path operations agrees with the generated decoder, and that the
// decoder fallback finds the end of the other operations: a wrong extent
// would hash the wrong span (or mistake payload bytes for operations).
func TestRequestHashExtents(t *testing.T) {
	sid := nfs4.Stateid4{Seqid: 7, Other: [12]byte{1, 2, 3}}
	samples := map[nfs4.NfsOpnum4]nfs4.NfsArgop4{
		nfs4.OP_PUTROOTFH: opPutRoot(),
		nfs4.OP_PUTPUBFH:  {Argop: nfs4.OP_PUTPUBFH},
		nfs4.OP_GETFH:     opGetFH(),
		nfs4.OP_SAVEFH:    opSaveFH(),
		nfs4.OP_RESTOREFH: opRestFH(),
		nfs4.OP_LOOKUPP:   opLookupP(),
		nfs4.OP_READLINK:  opReadlink(),
		nfs4.OP_PUTFH:     opPutFH(bytes.Repeat([]byte{0xfe}, 27)),
		nfs4.OP_LOOKUP:    opLookup("five5"),
		nfs4.OP_GETATTR:   opGetattr(nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE, nfs4.FATTR4_TIME_MODIFY),
		nfs4.OP_ACCESS:    {Argop: nfs4.OP_ACCESS, Opaccess: &nfs4.ACCESS4args{Access: 0x3f}},
		nfs4.OP_READ:      opRead(sid, 1<<40, 4096),
		nfs4.OP_COMMIT:    opCommit(),
		nfs4.OP_CLOSE:     opClose(sid),
	}
	for op := range measured {
		if _, ok := samples[op]; !ok {
			t.Errorf("no sample for measured operation %v", op)
		}
	}
	tests := []struct {
		name     string
		op       nfs4.NfsArgop4
		wantData int // payload offset for WRITE, else -1
	}{
		{"WRITE", opWrite(sid, 12345, nfs4.UNSTABLE4, []byte("odd-length payload")), 4 + writeHeadLen},
		{"WRITE empty", opWrite(sid, 0, nfs4.FILE_SYNC4, nil), 4 + writeHeadLen},
		{"OPEN (decoded)", opOpen(42, openArgs{name: "f", create: true, mode: nfs4.UNCHECKED4}), -1},
		{"RENAME (decoded)", opRename("a", "bcdef"), -1},
		{"SETATTR (decoded)", opSetattr(sid, nfs4.Fattr4{Attrmask: makeBitmap([]uint32{nfs4.FATTR4_SIZE}), AttrVals: make([]byte, 8)}), -1},
	}
	for op, a := range samples {
		tests = append(tests, struct {
			name     string
			op       nfs4.NfsArgop4
			wantData int
		}{op.String(), a, -1})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			one := encodeOps(tc.op)
			// A following operation must not change where this one ends.
			buf := append(bytes.Clone(one), encodeOps(opGetFH())...)
			end, data, ok := opExtent(buf, 0)
			if !ok || end != len(one) || data != tc.wantData {
				t.Errorf("opExtent = (%d, %d, %v), want (%d, %d, true)", end, data, ok, len(one), tc.wantData)
			}
			// Cut short, it is not measurable.
			if _, _, ok := opExtent(one[:len(one)-1], 0); ok && len(one) > 4 {
				t.Errorf("opExtent of a truncated operation succeeded")
			}
		})
	}
}

func TestRequestHash(t *testing.T) {
	sid := nfs4.Stateid4{Seqid: 1, Other: [12]byte{9}}
	fh := bytes.Repeat([]byte{0xab}, 28)
	mib := make([]byte, 1<<20)
	for i := range mib {
		mib[i] = byte(i * 7)
	}
	flip := func(b []byte, i int) []byte {
		c := bytes.Clone(b)
		c[i] ^= 0xff
		return c
	}
	type req struct {
		tag   string
		minor uint32
		ops   []nfs4.NfsArgop4
		tail  []byte // raw bytes after the operations (garbage)
		extra int    // operations claimed beyond ops
	}
	base := func(ops ...nfs4.NfsArgop4) req { return req{minor: 1, ops: ops} }
	lookup := base(opPutFH(fh), opLookup("alpha"), opGetFH())
	write := base(opPutFH(fh), opWrite(sid, 0, nfs4.UNSTABLE4, mib), opGetattr(nfs4.FATTR4_SIZE))
	withWrite := func(off uint64, stable nfs4.StableHow4, data []byte) req {
		return base(opPutFH(fh), opWrite(sid, off, stable, data), opGetattr(nfs4.FATTR4_SIZE))
	}
	tests := []struct {
		name string
		a, b req
		same bool
	}{
		{"identical lookup", lookup, lookup, true},
		{"identical 1 MiB write", write, withWrite(0, nfs4.UNSTABLE4, bytes.Clone(mib)), true},
		{"lookup name", lookup, base(opPutFH(fh), opLookup("alphb"), opGetFH()), false},
		{"filehandle", lookup, base(opPutFH(flip(fh, 27)), opLookup("alpha"), opGetFH()), false},
		{"op list", lookup, base(opPutFH(fh), opLookup("alpha"), opGetFH(), opGetattr(nfs4.FATTR4_SIZE)), false},
		{"op order", base(opPutRoot(), opGetFH(), opSaveFH()), base(opPutRoot(), opSaveFH(), opGetFH()), false},
		{"getattr bitmap", base(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE)), base(opPutFH(fh), opGetattr(nfs4.FATTR4_MODE)), false},
		{"tag", lookup, req{tag: "t", minor: 1, ops: lookup.ops}, false},
		{"minor version", lookup, req{minor: 2, ops: lookup.ops}, false},
		{"write offset", write, withWrite(4096, nfs4.UNSTABLE4, mib), false},
		{"write stable", write, withWrite(0, nfs4.FILE_SYNC4, mib), false},
		{"write stateid", write, base(opPutFH(fh), opWrite(nfs4.Stateid4{Seqid: 2, Other: sid.Other}, 0, nfs4.UNSTABLE4, mib), opGetattr(nfs4.FATTR4_SIZE)), false},
		{"write length", write, withWrite(0, nfs4.UNSTABLE4, mib[:len(mib)-4]), false},
		{"write first byte", write, withWrite(0, nfs4.UNSTABLE4, flip(mib, 0)), false},
		{"write last byte", write, withWrite(0, nfs4.UNSTABLE4, flip(mib, len(mib)-1)), false},
		{"small write any byte", withWrite(0, nfs4.UNSTABLE4, mib[:100]), withWrite(0, nfs4.UNSTABLE4, flip(mib[:100], 50)), false},
		// Documented blind spot: the middle of a large payload is not hashed.
		{"write middle byte (not sampled)", write, withWrite(0, nfs4.UNSTABLE4, flip(mib, len(mib)/2)), true},
		{"op after write", write, base(opPutFH(fh), opWrite(sid, 0, nfs4.UNSTABLE4, mib), opGetattr(nfs4.FATTR4_MODE)), false},
		{"identical garbage tail", req{minor: 1, ops: lookup.ops, tail: []byte{0, 0, 0, 99, 1}, extra: 1},
			req{minor: 1, ops: lookup.ops, tail: []byte{0, 0, 0, 99, 1}, extra: 1}, true},
		{"garbage tail", req{minor: 1, ops: lookup.ops, tail: []byte{0, 0, 0, 99, 1}, extra: 1},
			req{minor: 1, ops: lookup.ops, tail: []byte{0, 0, 0, 99, 2}, extra: 1}, false},
	}
	hash := func(r req) uint64 {
		args := append(encodeOps(r.ops...), r.tail...)
		h := requestHash([]byte(r.tag), r.minor, len(r.ops)+r.extra, args)
		if h == 0 {
			t.Fatal("requestHash returned 0")
		}
		if h2 := requestHash([]byte(r.tag), r.minor, len(r.ops)+r.extra, args); h2 != h {
			t.Fatalf("requestHash not deterministic: %#x then %#x", h, h2)
		}
		return h
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ha, hb := hash(tc.a), hash(tc.b)
			if (ha == hb) != tc.same {
				t.Errorf("hashes %#x and %#x: same = %v, want %v", ha, hb, ha == hb, tc.same)
			}
		})
	}
}

// BenchmarkRequestHash measures the fingerprint on the data path: a
// COMPOUND carrying a 1 MiB WRITE (whose payload is sampled, not hashed) and
// a small GETATTR COMPOUND, plus an OPEN COMPOUND that takes the decoder
// fallback.
func BenchmarkRequestHash(b *testing.B) {
	sid := nfs4.Stateid4{Seqid: 1, Other: [12]byte{9}}
	fh := bytes.Repeat([]byte{0xab}, 28)
	cases := []struct {
		name string
		ops  []nfs4.NfsArgop4
	}{
		{"write-1MiB", []nfs4.NfsArgop4{opPutFH(fh), opWrite(sid, 1<<30, nfs4.UNSTABLE4, make([]byte, 1<<20)), opGetattr(nfs4.FATTR4_SIZE, nfs4.FATTR4_CHANGE)}},
		{"getattr", []nfs4.NfsArgop4{opPutFH(fh), opGetattr(nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE, nfs4.FATTR4_TIME_MODIFY)}},
		{"open", []nfs4.NfsArgop4{opPutFH(fh), opOpen(42, openArgs{name: "file", create: true, mode: nfs4.UNCHECKED4}), opGetFH()}},
	}
	for _, bc := range cases {
		args := encodeOps(bc.ops...)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				requestHash(nil, 1, len(bc.ops), args)
			}
		})
	}
}

// FuzzRequestHash feeds arbitrary bytes as the operations after SEQUENCE:
// they come straight from the network, and measuring them must never read
// out of bounds or panic, whatever lengths they claim.
func FuzzRequestHash(f *testing.F) {
	f.Add([]byte{}, uint32(1), 1)
	f.Add([]byte{0, 0, 0, 38, 0, 0, 0, 1}, uint32(1), 2)                         // WRITE cut short
	f.Add([]byte{0, 0, 0, 22, 0, 0, 0, 4, 1, 2, 3, 4, 0, 0, 0, 9}, uint32(2), 2) // PUTFH, GETATTR
	f.Fuzz(func(t *testing.T, ops []byte, minor uint32, nops int) {
		nops %= 64
		if nops < 0 {
			nops = -nops
		}
		if h := requestHash([]byte("tag"), minor, nops, ops); h == 0 {
			t.Fatal("requestHash returned 0, which means no fingerprint")
		}
	})
}
