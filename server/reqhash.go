package server

import (
	"encoding/binary"
	"hash/maphash"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Request fingerprints let SEQUENCE tell a retransmission from a false retry:
// a different request sent on a slot and sequence id whose reply is cached
// (RFC 8881 §2.10.6.1.3.1). Without them the server would answer the new
// request with the old request's reply; with them it answers
// NFS4ERR_SEQ_FALSE_RETRY (state.SequenceArgs.RequestHash).
//
// The fingerprint hashes the raw XDR of the COMPOUND arguments rather than the
// decoded arguments: the bytes are at hand (the record buffer, before it can
// be recycled by argsrelease.go), hashing them needs no per-op code, and a
// retransmission by a correct client carries the same bytes. Two parts are
// left out or cut down:
//
//   - the SEQUENCE operation. Its session, slot and sequence ids are what
//     brought the request to this slot, and sa_highest_slotid (and in
//     principle sa_cachethis) may differ in a retransmission that the client
//     re-encoded, as the Linux client does when it must rebuild an RPC;
//   - WRITE payloads, up to a MiB each on the data path. A WRITE contributes
//     its stateid, offset, stable_how and data length, and only the first and
//     last writeSample bytes of its data. A retry that differs from the
//     original only inside the payload is not detected; it is rare (the same
//     file range, the same length, the same first and last bytes) and
//     replaying the cached WRITE reply for it is what a server that keeps no
//     fingerprint would do anyway.
//
// Walking the operations to find WRITE payloads needs each operation's extent.
// The operations on the data path (PUTFH, WRITE, READ, COMMIT, GETATTR, ...)
// are measured straight from the bytes without allocating; the others are
// decoded into a scratch value just to learn where they end.

// reqHashSeed keys the fingerprints. One key per process is enough: a
// fingerprint is only compared with others in this process's reply caches,
// and a random key keeps clients from crafting colliding requests.
var reqHashSeed = maphash.MakeSeed()

const (
	// writeSample is how many bytes of each end of a WRITE payload are
	// hashed.
	writeSample = 64
	// rawRestLimit is the largest undecodable tail of a COMPOUND that is
	// hashed whole; longer tails are sampled like WRITE payloads.
	rawRestLimit = 4096
	// restMarker precedes an undecodable tail in the hash input. No
	// operation that is measured or decoded starts with it, so a tail
	// cannot pass for operations.
	restMarker = 0xffffffff
)

// writeHeadLen is the fixed part of WRITE4args after the opcode: stateid4
// (16 bytes), offset4 (8), stable_how4 (4), then the payload length (4).
const writeHeadLen = 16 + 8 + 4 + 4

// argShape is the encoding of an operation's arguments that can be measured
// without decoding: fixed bytes, then optionally one opaque or bitmap.
type argShape struct {
	fixed int
	tail  tailKind
}

type tailKind uint8

const (
	tailNone   tailKind = iota
	tailOpaque          // opaque<> or utf8 string: length, bytes, padding
	tailBitmap          // bitmap4: count, count words
)

// measured lists the operations whose argument extent is computed from the
// bytes. Others are decoded. A wrong entry would not break anything that
// executes (the dispatcher decodes every operation itself), it would only
// make the fingerprint cover a different span, consistently for the same
// bytes.
var measured = map[nfs4.NfsOpnum4]argShape{
	nfs4.OP_PUTROOTFH: {},
	nfs4.OP_PUTPUBFH:  {},
	nfs4.OP_GETFH:     {},
	nfs4.OP_SAVEFH:    {},
	nfs4.OP_RESTOREFH: {},
	nfs4.OP_LOOKUPP:   {},
	nfs4.OP_READLINK:  {},
	nfs4.OP_PUTFH:     {tail: tailOpaque},  // nfs_fh4
	nfs4.OP_LOOKUP:    {tail: tailOpaque},  // component4
	nfs4.OP_GETATTR:   {tail: tailBitmap},  // bitmap4
	nfs4.OP_ACCESS:    {fixed: 4},          // uint32
	nfs4.OP_READ:      {fixed: 16 + 8 + 4}, // stateid4, offset4, count4
	nfs4.OP_COMMIT:    {fixed: 8 + 4},      // offset4, count4
	nfs4.OP_CLOSE:     {fixed: 4 + 16},     // seqid4, stateid4
}

// requestHash fingerprints a COMPOUND: its tag, minor version, operation
// count and the nops operations encoded in ops, which are the argument bytes
// after the COMPOUND's SEQUENCE (nops excludes SEQUENCE). It never returns 0,
// which state.SequenceArgs reads as "no fingerprint". It keeps no reference
// to tag or ops.
func requestHash(tag []byte, minor uint32, nops int, ops []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(reqHashSeed)
	writeUint32(&h, uint32(len(tag)))
	h.Write(tag)
	writeUint32(&h, minor)
	writeUint32(&h, uint32(nops))
	off := 0
	for range nops {
		end, data, ok := opExtent(ops, off)
		if !ok {
			// The dispatcher stops with NFS4ERR_BADXDR (or OP_ILLEGAL) at
			// this operation; what follows never runs but still tells
			// requests apart.
			writeUint32(&h, restMarker)
			writeUint32(&h, uint32(len(ops)-off))
			if len(ops)-off <= rawRestLimit {
				h.Write(ops[off:])
			} else {
				writeSamples(&h, ops[off:])
			}
			break
		}
		if data < 0 {
			h.Write(ops[off:end])
		} else {
			// A WRITE: everything up to and including the payload length,
			// then samples of the payload. Its padding is not hashed.
			h.Write(ops[off:data])
			n := int(binary.BigEndian.Uint32(ops[data-4:]))
			writeSamples(&h, ops[data:data+n])
		}
		off = end
	}
	if s := h.Sum64(); s != 0 {
		return s
	}
	return 1
}

// opExtent returns the end of the operation that starts at ops[off:] and,
// for WRITE, the offset of its payload (else -1). ok is false if the
// operation cannot be measured or decoded.
func opExtent(ops []byte, off int) (end, data int, ok bool) {
	rest := ops[off:]
	if len(rest) < 4 {
		return 0, -1, false
	}
	op := nfs4.NfsOpnum4(binary.BigEndian.Uint32(rest))
	if op == nfs4.OP_WRITE {
		if len(rest) < 4+writeHeadLen {
			return 0, -1, false
		}
		n := uint64(binary.BigEndian.Uint32(rest[4+writeHeadLen-4:]))
		size := uint64(4+writeHeadLen) + n + uint64(xdrPad(n))
		if size > uint64(len(rest)) {
			return 0, -1, false
		}
		return off + int(size), off + 4 + writeHeadLen, true
	}
	if sh, found := measured[op]; found {
		size, ok := measure(rest[4:], sh)
		if !ok {
			return 0, -1, false
		}
		return off + 4 + size, -1, true
	}
	size, ok := decodedSize(rest)
	if !ok {
		return 0, -1, false
	}
	return off + size, -1, true
}

// measure returns the encoded size of arguments of shape sh at the start of
// b.
func measure(b []byte, sh argShape) (int, bool) {
	size := uint64(sh.fixed)
	if size > uint64(len(b)) {
		return 0, false
	}
	if sh.tail == tailNone {
		return int(size), true
	}
	if size+4 > uint64(len(b)) {
		return 0, false
	}
	n := uint64(binary.BigEndian.Uint32(b[size:]))
	switch sh.tail {
	case tailOpaque:
		size += 4 + n + uint64(xdrPad(n))
	case tailBitmap:
		size += 4 + 4*n
	default:
		return 0, false
	}
	if size > uint64(len(b)) {
		return 0, false
	}
	return int(size), true
}

// decodedSize decodes one operation (opcode and arguments) from b to learn
// its encoded size. Only operations off the data path get here.
func decodedSize(b []byte) (int, bool) {
	var d xdr.Decoder
	d.Reset(b)
	var a nfs4.NfsArgop4
	a.DecodeXDR(&d)
	if d.Err() != nil {
		return 0, false
	}
	return d.Offset(), true
}

// writeSamples hashes b whole if it is short, else its first and last
// writeSample bytes. Callers hash len(b) before, so the two cases cannot be
// confused.
func writeSamples(h *maphash.Hash, b []byte) {
	if len(b) <= 2*writeSample {
		h.Write(b)
		return
	}
	h.Write(b[:writeSample])
	h.Write(b[len(b)-writeSample:])
}

func writeUint32(h *maphash.Hash, v uint32) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	h.Write(b[:])
}

func xdrPad(n uint64) uint64 { return (4 - n&3) & 3 }
