package nfs4

import (
	"bytes"
	"errors"
	"reflect"
	"strconv"
	"testing"

	"github.com/shoalfs/shoal/internal/xdr"
)

func sampleCompound() *COMPOUND4args {
	var sid Sessionid4
	copy(sid[:], "0123456789abcdef")
	return &COMPOUND4args{
		Tag:          []byte("shoal-test"),
		Minorversion: 2,
		Argarray: []NfsArgop4{
			{Argop: OP_SEQUENCE, Opsequence: &SEQUENCE4args{
				SaSessionid:     sid,
				SaSequenceid:    7,
				SaSlotid:        1,
				SaHighestSlotid: 15,
				SaCachethis:     true,
			}},
			{Argop: OP_PUTFH, Opputfh: &PUTFH4args{Object: []byte{0xfe, 1, 2, 3, 4}}},
			{Argop: OP_WRITE, Opwrite: &WRITE4args{
				Stateid: Stateid4{Seqid: 1, Other: [NFS4_OTHER_SIZE]byte{1, 2, 3}},
				Offset:  1 << 40,
				Stable:  FILE_SYNC4,
				Data:    bytes.Repeat([]byte("shoal"), 2000),
			}},
			{Argop: OP_GETATTR, Opgetattr: &GETATTR4args{AttrRequest: Bitmap4{1<<FATTR4_TYPE | 1<<FATTR4_SIZE, 1 << (FATTR4_SPACE_USED - 32)}}},
		},
	}
}

func TestCompoundArgsRoundTrip(t *testing.T) {
	in := sampleCompound()
	e := xdr.NewEncoder(0)
	in.EncodeXDR(e)
	if len(e.Buffers()) < 2 {
		t.Error("WRITE data was copied into the encoder buffer instead of spliced")
	}
	wire := e.Bytes()

	var out COMPOUND4args
	if err := xdr.Unmarshal(wire, &out); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	if !reflect.DeepEqual(in, &out) {
		t.Fatalf("round trip mismatch:\n in: %+v\nout: %+v", in, &out)
	}
	w := out.Argarray[2].Opwrite
	if w == nil || len(w.Data) == 0 {
		t.Fatal("WRITE arm missing")
	}
	// The decoded WRITE data must be a window into wire, not a copy.
	start := len(wire) - len(w.Data)
	found := false
	for i := 0; i <= start; i++ {
		if &wire[i] == &w.Data[0] {
			found = true
			break
		}
	}
	if !found {
		t.Fatal("decoded WRITE data does not alias the input buffer")
	}
	if got := out.Argarray[0].Argop.String(); got != "OP_SEQUENCE" {
		t.Errorf("Argop.String() = %q", got)
	}
}

func TestCompoundArgsTruncated(t *testing.T) {
	wire := xdr.Marshal(sampleCompound())
	for n := range len(wire) {
		var out COMPOUND4args
		if err := xdr.Unmarshal(wire[:n], &out); err == nil {
			t.Fatalf("decoding %d of %d bytes succeeded", n, len(wire))
		}
	}
}

func TestCompoundArgsBadOp(t *testing.T) {
	c := &COMPOUND4args{Argarray: []NfsArgop4{{Argop: 9999}}}
	var out COMPOUND4args
	if err := xdr.Unmarshal(xdr.Marshal(c), &out); !errors.Is(err, xdr.ErrBadValue) {
		t.Fatalf("err = %v, want ErrBadValue", err)
	}
}

func TestFileHandleBound(t *testing.T) {
	c := &COMPOUND4args{Argarray: []NfsArgop4{{Argop: OP_PUTFH, Opputfh: &PUTFH4args{Object: make([]byte, NFS4_FHSIZE+1)}}}}
	var out COMPOUND4args
	if err := xdr.Unmarshal(xdr.Marshal(c), &out); !errors.Is(err, xdr.ErrTooLong) {
		t.Fatalf("err = %v, want ErrTooLong", err)
	}
}

func FuzzCompoundArgs(f *testing.F) {
	small := sampleCompound()
	small.Argarray[2].Opwrite.Data = []byte("data")
	f.Add(xdr.Marshal(small))
	f.Add(xdr.Marshal(&COMPOUND4args{}))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var c COMPOUND4args
		if xdr.Unmarshal(b, &c) != nil {
			return
		}
		enc := xdr.Marshal(&c)
		var c2 COMPOUND4args
		if err := xdr.Unmarshal(enc, &c2); err != nil {
			t.Fatalf("re-decoding own encoding: %v", err)
		}
	})
}

// TestLargeReaddirReply checks that a ~1 MB READDIR reply with 10,000 entries
// (a linked list in XDR) encodes and decodes without deep recursion.
func TestLargeReaddirReply(t *testing.T) {
	const n = 10000
	attrs := make([]byte, 80)
	var head *Entry4
	for i := n - 1; i >= 0; i-- {
		head = &Entry4{
			Cookie:    NfsCookie4(i + 3),
			Name:      []byte("entry-name-" + strconv.Itoa(i)),
			Attrs:     Fattr4{Attrmask: Bitmap4{1 << FATTR4_SIZE}, AttrVals: attrs},
			Nextentry: head,
		}
	}
	in := &READDIR4res{Status: NFS4_OK, Resok4: &READDIR4resok{Reply: Dirlist4{Entries: head, Eof: true}}}
	wire := xdr.Marshal(in)
	if len(wire) < 1<<20 {
		t.Fatalf("reply is only %d bytes", len(wire))
	}
	var out READDIR4res
	if err := xdr.Unmarshal(wire, &out); err != nil {
		t.Fatal(err)
	}
	count := 0
	for e := out.Resok4.Reply.Entries; e != nil && count <= n; e = e.Nextentry {
		if want := "entry-name-" + strconv.Itoa(count); string(e.Name) != want {
			t.Fatalf("entry %d is %q, want %q", count, e.Name, want)
		}
		count++
	}
	if count != n || !out.Resok4.Reply.Eof {
		t.Fatalf("decoded %d entries (eof %v), want %d", count, out.Resok4.Reply.Eof, n)
	}
}
