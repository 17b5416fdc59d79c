// Package xdr implements the XDR (RFC 4506) primitives that Shoal's
// generated protocol code is built on.
//
// # Why hand-written
//
// Off-the-shelf Go XDR runtimes either panic on malformed input or copy every
// opaque they decode. Shoal reads untrusted bytes from the network on every
// call and moves bulk data through READ and WRITE, so this package is small,
// allocation-aware and never panics:
//
//   - Decoding errors are sticky. Once a [Decoder] has failed, every further
//     read returns a zero value and does not advance, so generated code can
//     decode a whole structure and check [Decoder.Err] once at the end.
//   - Every length read from the wire is checked against what is left in the
//     buffer before anything is allocated, so a 4 GiB length prefix in a
//     100-byte message costs nothing.
//   - Variable-length opaques are returned as sub-slices of the input
//     (aliasing). The RPC layer gives every record its own buffer, which makes
//     that safe; code that keeps an opaque beyond the call must clone it.
//   - The [Encoder] can splice caller-owned byte slices into its output
//     without copying them ([Encoder.OpaqueRef]); [Encoder.Buffers] returns
//     the result as net.Buffers for a single writev.
package xdr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
)

// Errors reported by a Decoder. Callers map any of them to GARBAGE_ARGS or
// NFS4ERR_BADXDR.
var (
	ErrShort    = errors.New("xdr: short buffer")
	ErrTooLong  = errors.New("xdr: length exceeds bound")
	ErrBadValue = errors.New("xdr: invalid value")
)

// Marshaler is implemented by generated types.
type Marshaler interface {
	EncodeXDR(e *Encoder)
}

// Unmarshaler is implemented by generated types. Errors are recorded in the
// Decoder.
type Unmarshaler interface {
	DecodeXDR(d *Decoder)
}

// Decoder reads XDR from a byte slice. The zero value decodes nothing.
type Decoder struct {
	buf []byte
	off int
	err error
}

// NewDecoder returns a Decoder reading b. Opaques it returns alias b.
func NewDecoder(b []byte) *Decoder { return &Decoder{buf: b} }

// Reset makes d read b from the start, clearing any error.
func (d *Decoder) Reset(b []byte) { d.buf, d.off, d.err = b, 0, nil }

// Err returns the first error encountered, if any.
func (d *Decoder) Err() error { return d.err }

// SetErr records err unless an earlier error is already recorded.
func (d *Decoder) SetErr(err error) {
	if d.err == nil {
		d.err = err
	}
}

// Failf records a formatted ErrBadValue.
func (d *Decoder) Failf(format string, args ...any) {
	d.SetErr(fmt.Errorf("%w: "+format, append([]any{ErrBadValue}, args...)...))
}

// Offset returns the number of bytes consumed so far.
func (d *Decoder) Offset() int { return d.off }

// Remaining returns the number of unread bytes.
func (d *Decoder) Remaining() int { return len(d.buf) - d.off }

// Rest returns the unread bytes without consuming them.
func (d *Decoder) Rest() []byte { return d.buf[d.off:] }

func (d *Decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.buf)-d.off {
		d.err = ErrShort
		return nil
	}
	b := d.buf[d.off : d.off+n : d.off+n]
	d.off += n
	return b
}

// Uint32 decodes an unsigned int.
func (d *Decoder) Uint32() uint32 {
	b := d.take(4)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

// Int32 decodes an int.
func (d *Decoder) Int32() int32 { return int32(d.Uint32()) }

// Uint64 decodes an unsigned hyper.
func (d *Decoder) Uint64() uint64 {
	b := d.take(8)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// Int64 decodes a hyper.
func (d *Decoder) Int64() int64 { return int64(d.Uint64()) }

// Bool decodes a bool; values other than 0 and 1 are an error.
func (d *Decoder) Bool() bool {
	v := d.Uint32()
	if v > 1 {
		d.Failf("bool %d", v)
		return false
	}
	return v == 1
}

// Float32 decodes a float.
func (d *Decoder) Float32() float32 { return math.Float32frombits(d.Uint32()) }

// Float64 decodes a double.
func (d *Decoder) Float64() float64 { return math.Float64frombits(d.Uint64()) }

func pad(n int) int { return (4 - n&3) & 3 }

// FixedOpaque decodes opaque[n]. The result aliases the input.
func (d *Decoder) FixedOpaque(n int) []byte {
	b := d.take(n)
	if d.take(pad(n)) == nil && pad(n) != 0 {
		return nil
	}
	return b
}

// Opaque decodes opaque<max>; max 0 means no declared bound. The result
// aliases the input.
func (d *Decoder) Opaque(max uint32) []byte {
	n := d.Uint32()
	if d.err != nil {
		return nil
	}
	if max != 0 && n > max {
		d.err = ErrTooLong
		return nil
	}
	if uint64(n) > uint64(d.Remaining()) {
		d.err = ErrShort
		return nil
	}
	b := d.FixedOpaque(int(n))
	if b == nil {
		return []byte{}
	}
	return b
}

// String decodes string<max>; max 0 means no declared bound.
func (d *Decoder) String(max uint32) string { return string(d.Opaque(max)) }

// ArrayLen decodes the count of a variable-length array with bound max (0 for
// none). minSize is the smallest encoded size of one element; the count is
// rejected if that many elements cannot fit in the remaining input, which
// bounds the allocation a caller makes for the array.
func (d *Decoder) ArrayLen(max uint32, minSize int) int {
	n := d.Uint32()
	if d.err != nil {
		return 0
	}
	if max != 0 && n > max {
		d.err = ErrTooLong
		return 0
	}
	if minSize < 1 {
		minSize = 1
	}
	if uint64(n)*uint64(minSize) > uint64(d.Remaining()) {
		d.err = ErrShort
		return 0
	}
	return int(n)
}

// Encoder appends XDR to an internal buffer, optionally splicing in
// caller-owned slices without copying them.
type Encoder struct {
	buf []byte
	ext []extRef
}

type extRef struct {
	at int // offset in buf before which b is spliced
	b  []byte
}

// NewEncoder returns an Encoder whose buffer starts with capacity n.
func NewEncoder(n int) *Encoder { return &Encoder{buf: make([]byte, 0, n)} }

// Reset empties e, keeping its buffer.
func (e *Encoder) Reset() { e.buf, e.ext = e.buf[:0], e.ext[:0] }

// Len returns the total encoded length, spliced slices included.
func (e *Encoder) Len() int {
	n := len(e.buf)
	for _, x := range e.ext {
		n += len(x.b)
	}
	return n
}

// Uint32 encodes an unsigned int.
func (e *Encoder) Uint32(v uint32) { e.buf = binary.BigEndian.AppendUint32(e.buf, v) }

// Int32 encodes an int.
func (e *Encoder) Int32(v int32) { e.Uint32(uint32(v)) }

// Uint64 encodes an unsigned hyper.
func (e *Encoder) Uint64(v uint64) { e.buf = binary.BigEndian.AppendUint64(e.buf, v) }

// Int64 encodes a hyper.
func (e *Encoder) Int64(v int64) { e.Uint64(uint64(v)) }

// Bool encodes a bool.
func (e *Encoder) Bool(v bool) {
	if v {
		e.Uint32(1)
	} else {
		e.Uint32(0)
	}
}

// Float32 encodes a float.
func (e *Encoder) Float32(v float32) { e.Uint32(math.Float32bits(v)) }

// Float64 encodes a double.
func (e *Encoder) Float64(v float64) { e.Uint64(math.Float64bits(v)) }

var zeros [4]byte

// FixedOpaque encodes opaque[len(b)], copying b.
func (e *Encoder) FixedOpaque(b []byte) {
	e.buf = append(e.buf, b...)
	e.buf = append(e.buf, zeros[:pad(len(b))]...)
}

// Opaque encodes opaque<>, copying b.
func (e *Encoder) Opaque(b []byte) {
	e.Uint32(uint32(len(b)))
	e.FixedOpaque(b)
}

// OpaqueRef encodes opaque<> without copying b: b is spliced into the output
// returned by Buffers and must stay unchanged until that output is written.
func (e *Encoder) OpaqueRef(b []byte) {
	e.Uint32(uint32(len(b)))
	if len(b) < 512 { // cheaper to copy than to add an iovec
		e.FixedOpaque(b)
		return
	}
	e.ext = append(e.ext, extRef{at: len(e.buf), b: b})
	e.buf = append(e.buf, zeros[:pad(len(b))]...)
}

// String encodes string<>.
func (e *Encoder) String(s string) {
	e.Uint32(uint32(len(s)))
	e.buf = append(e.buf, s...)
	e.buf = append(e.buf, zeros[:pad(len(s))]...)
}

// Reserve appends a placeholder uint32 and returns its position for PutUint32At.
func (e *Encoder) Reserve() int {
	p := len(e.buf)
	e.Uint32(0)
	return p
}

// PutUint32At overwrites the uint32 at position p returned by Reserve.
func (e *Encoder) PutUint32At(p int, v uint32) { binary.BigEndian.PutUint32(e.buf[p:], v) }

// Append appends raw bytes that are already XDR-encoded.
func (e *Encoder) Append(b []byte) { e.buf = append(e.buf, b...) }

// Buffers returns the encoded output as a list of slices, suitable for
// writev. The slices alias e's buffer and spliced inputs.
func (e *Encoder) Buffers() net.Buffers {
	if len(e.ext) == 0 {
		return net.Buffers{e.buf}
	}
	return e.AppendBuffers(make(net.Buffers, 0, 2*len(e.ext)+1))
}

// AppendBuffers appends the slices Buffers returns to dst and returns
// the extended list; a caller with room in dst (a small array of its
// own) gets them without an allocation.
func (e *Encoder) AppendBuffers(dst net.Buffers) net.Buffers {
	prev := 0
	for _, x := range e.ext {
		if x.at > prev {
			dst = append(dst, e.buf[prev:x.at])
		}
		dst = append(dst, x.b)
		prev = x.at
	}
	if prev < len(e.buf) || len(e.ext) == 0 {
		dst = append(dst, e.buf[prev:])
	}
	return dst
}

// Bytes returns the encoded output as one slice, copying only when slices
// were spliced in.
func (e *Encoder) Bytes() []byte {
	if len(e.ext) == 0 {
		return e.buf
	}
	out := make([]byte, 0, e.Len())
	for _, b := range e.Buffers() {
		out = append(out, b...)
	}
	return out
}

// Marshal encodes v into a new byte slice.
func Marshal(v Marshaler) []byte {
	e := NewEncoder(256)
	v.EncodeXDR(e)
	return e.Bytes()
}

// Unmarshal decodes v from b, requiring that all of b is consumed.
func Unmarshal(b []byte, v Unmarshaler) error {
	d := NewDecoder(b)
	v.DecodeXDR(d)
	if d.err == nil && d.Remaining() != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrBadValue, d.Remaining())
	}
	return d.err
}
