package gentest

import (
	"bytes"
	"errors"
	"reflect"
	"runtime"
	"testing"

	"github.com/shoalfs/shoal/internal/xdr"
)

func ptr[T any](v T) *T { return &v }

// sample returns a Holder that exercises every generated construct with
// non-empty values, so that a decode of its encoding is DeepEqual to it.
func sample() *Holder {
	arr := &Arrays{
		Fixed:     [5]byte{1, 2, 3, 4, 5},
		Var:       []byte("var"),
		Unbounded: bytes.Repeat([]byte{0xab}, 1000),
		S:         "str",
		Anys:      "any string at all",
		Fixedints: [3]int32{-1, 0, 1},
		Varints:   []int32{7, 8},
		Anyhypers: []uint64{1 << 63},
		Fh:        []byte("handle"),
		Verf:      VerifierT{9, 9, 9, 9, 9, 9, 9, 9},
		Name:      "name",
		Data:      []byte{0},
		Bitmap:    BitmapT{0xffffffff, 1},
		Path:      PathT{"a", "bc"},
		Fhs:       []FhT{{1}, {2, 3}},
		Verfs:     [2]VerifierT{{1}, {2}},
		Pairs:     []PairT{{1, 2}, {-3, -4}},
		Colors:    []Color{RED, BLUE, NEGATIVE},
		Calias:    GREEN,
		Sz:        LARGE,
	}
	return &Holder{
		R: Result{C: BLUE, Arr: arr},
		Rs: []Result{
			{C: GREEN, Count: ptr(uint32(42))},
			{C: NEGATIVE},
			{C: RED, Arr: arr},
		},
		M:    [2]Maybe{{Present: true, Value: &PairT{5, 6}}, {Present: false}},
		Opt:  &Intunion{Kind: 0x7, List: &Node{Value: 1, Next: &Node{Value: 2}}},
		W:    Wrapped{S: LARGE, Inner: &Result{C: GREEN, Count: ptr(uint32(1))}},
		B:    Bysize{Which: uint32(LARGE), Large: ptr(int64(-1 << 40))},
		Head: &Node{Value: 3},
		Root: &Tree{Value: 10, Left: &Tree{Value: 5}, Right: &Tree{Value: 20, Right: &Tree{Value: 30}}},
	}
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   interface {
			xdr.Marshaler
			xdr.Unmarshaler
		}
		out xdr.Unmarshaler
	}{
		{"holder", sample(), new(Holder)},
		{"prims", &Prims{I: -1, U: 2, Uu: 3, H: -4, Uh: 5, B: true, F: 1.5, Dd: -2.25, I32: 6, U64: 7, Cnt: 8}, new(Prims)},
		{"intunion default", &Intunion{Kind: 99, Other: ptr([]byte("xyz"))}, new(Intunion)},
		{"intunion string", &Intunion{Kind: HEXCONST, Name: ptr("n")}, new(Intunion)},
		{"intunion void", &Intunion{Kind: -1}, new(Intunion)},
		{"wrapped void", &Wrapped{S: SMALL}, new(Wrapped)},
		{"bysize small", &Bysize{Which: uint32(SMALL), Small: ptr(int32(-7))}, new(Bysize)},
		{"collide", &Collide_{Collide: 1, Collide_: 2}, new(Collide_)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := xdr.Marshal(tt.in)
			if err := xdr.Unmarshal(b, tt.out); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !reflect.DeepEqual(tt.in, tt.out) {
				t.Fatalf("round trip mismatch:\n in: %+v\nout: %+v", tt.in, tt.out)
			}
			if again := xdr.Marshal(tt.out.(xdr.Marshaler)); !bytes.Equal(b, again) {
				t.Fatal("re-encoding differs")
			}
		})
	}
}

func TestNilArmEncodesZeroValue(t *testing.T) {
	b := xdr.Marshal(&Result{C: GREEN}) // Count is nil
	var r Result
	if err := xdr.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Count == nil || *r.Count != 0 {
		t.Fatalf("got %+v, want zero Count", r)
	}
	if want := []byte{0, 0, 0, 1, 0, 0, 0, 0}; !bytes.Equal(b, want) {
		t.Fatalf("encoding %x, want %x", b, want)
	}
}

func TestTruncation(t *testing.T) {
	b := xdr.Marshal(sample())
	for n := range len(b) {
		var h Holder
		if err := xdr.Unmarshal(b[:n], &h); err == nil {
			t.Fatalf("decoding %d of %d bytes succeeded", n, len(b))
		}
	}
}

func TestUnknownDiscriminant(t *testing.T) {
	var r Result
	err := xdr.Unmarshal([]byte{0, 0, 0, 77}, &r)
	if !errors.Is(err, xdr.ErrBadValue) {
		t.Fatalf("err = %v, want ErrBadValue", err)
	}
}

func TestUnknownEnumDecodes(t *testing.T) {
	var c Color
	if err := xdr.Unmarshal([]byte{0, 0, 1, 0}, &c); err != nil {
		t.Fatal(err)
	}
	if c != 256 || c.String() != "Color(256)" {
		t.Fatalf("got %d %q", c, c.String())
	}
	if BLUE.String() != "BLUE" || CRIMSON.String() != "RED" {
		t.Fatalf("String: %q %q", BLUE.String(), CRIMSON.String())
	}
}

func encode(v xdr.Marshaler) []byte { return xdr.Marshal(v) }

func TestBounds(t *testing.T) {
	base := func() *Arrays { return sample().R.Arr }
	tests := []struct {
		name string
		mod  func(a *Arrays)
	}{
		{"opaque<MAXNAME>", func(a *Arrays) { a.Var = make([]byte, MAXNAME+1) }},
		{"string<8>", func(a *Arrays) { a.S = "123456789" }},
		{"int<4>", func(a *Arrays) { a.Varints = make([]int32, 5) }},
		{"typedef opaque bound", func(a *Arrays) { a.Fh = make([]byte, MAXNAME+1) }},
		{"typedef string bound", func(a *Arrays) { a.Name = string(make([]byte, MAXNAME+1)) }},
		{"typedef array bound", func(a *Arrays) { a.Path = make(PathT, 5) }},
		{"bound inside array element", func(a *Arrays) { a.Path = PathT{string(make([]byte, MAXNAME+1))} }},
		{"element typedef bound", func(a *Arrays) { a.Fhs = []FhT{make([]byte, MAXNAME+1)} }},
		{"colors<3>", func(a *Arrays) { a.Colors = make([]Color, 4) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := base()
			if err := xdr.Unmarshal(encode(a), new(Arrays)); err != nil {
				t.Fatalf("valid value rejected: %v", err)
			}
			tt.mod(a)
			err := xdr.Unmarshal(encode(a), new(Arrays))
			if !errors.Is(err, xdr.ErrTooLong) {
				t.Fatalf("err = %v, want ErrTooLong", err)
			}
		})
	}
}

func TestHugeLengthPrefix(t *testing.T) {
	// Holder.Rs is an unbounded array of unions; Arrays.Unbounded an unbounded
	// opaque. Claim 2^32-1 elements/bytes in a tiny message.
	msgs := map[string]struct {
		b []byte
		v xdr.Unmarshaler
	}{
		"array count":             {append(xdr.Marshal(&Result{C: NEGATIVE}), 0xff, 0xff, 0xff, 0xff), new(Holder)},
		"opaque length":           {append(append([]byte{1, 2, 3, 4, 5, 0, 0, 0}, 0, 0, 0, 0), 0xff, 0xff, 0xff, 0xff), new(Arrays)},
		"union arm opaque length": {[]byte{0, 0, 0, 99, 0x7f, 0xff, 0xff, 0xff}, new(Intunion)},
	}
	for name, m := range msgs {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := xdr.Unmarshal(m.b, m.v)
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatal("decode succeeded")
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
				t.Fatalf("allocated %d bytes decoding a %d-byte message", got, len(m.b))
			}
		})
	}
}

func TestLongListIsIterative(t *testing.T) {
	const n = 10000
	head := &Node{}
	cur := head
	for i := 1; i < n; i++ {
		cur.Next = &Node{Value: int32(i)}
		cur = cur.Next
	}
	b := xdr.Marshal(head)
	var got Node
	if err := xdr.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	i := 0
	for p := &got; p != nil; p = p.Next {
		if p.Value != int32(i) {
			t.Fatalf("node %d has value %d", i, p.Value)
		}
		i++
	}
	if i != n {
		t.Fatalf("decoded %d nodes, want %d", i, n)
	}
}

func TestZeroCopy(t *testing.T) {
	a := sample().R.Arr
	e := xdr.NewEncoder(0)
	a.EncodeXDR(e)
	bufs := e.Buffers()
	spliced := false
	for _, b := range bufs {
		if len(b) > 0 && &b[0] == &a.Unbounded[0] {
			spliced = true
		}
	}
	if !spliced {
		t.Fatal("unbounded opaque was copied into the encoder buffer")
	}
	in := e.Bytes()
	var out Arrays
	if err := xdr.Unmarshal(in, &out); err != nil {
		t.Fatal(err)
	}
	if !aliases(in, out.Unbounded) || !aliases(in, out.Var) || !aliases(in, out.Fh) {
		t.Fatal("decoded opaques do not alias the input")
	}
}

func aliases(buf, sub []byte) bool {
	if len(sub) == 0 {
		return false
	}
	for i := range buf {
		if &buf[i] == &sub[0] {
			return true
		}
	}
	return false
}

func FuzzDecodeHolder(f *testing.F) {
	f.Add(xdr.Marshal(sample()))
	f.Add(xdr.Marshal(&Holder{}))
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Holder
		if err := xdr.Unmarshal(b, &h); err != nil {
			return
		}
		// Whatever decodes must re-encode to bytes that decode to the same
		// value (the input itself may differ in padding bytes).
		enc := xdr.Marshal(&h)
		var h2 Holder
		if err := xdr.Unmarshal(enc, &h2); err != nil {
			t.Fatalf("re-decoding: %v", err)
		}
		if again := xdr.Marshal(&h2); !bytes.Equal(again, enc) {
			t.Fatalf("re-encoding differs:\n in: %x\nout: %x", enc, again)
		}
	})
}
