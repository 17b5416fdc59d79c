package server

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"sync"

	"github.com/shoalfs/shoal/meta"
)

// Filehandle layout (28 bytes, opaque to clients):
//
//	[0]     format version (fhVersion)
//	[1]     kind: fhObject (an inode inside an export), fhPseudo (a node of
//	        the pseudo-root), fhData (a file's data on the data servers)
//	        or fhFlex (one copy of it, in a flexfiles layout)
//	[2:4]   export id, or pseudo node index
//	[4:12]  inode number (never reused, so no generation number is needed)
//	[12:28] HMAC-SHA256 over bytes [0:12], truncated to 16 bytes
//
// The MAC makes handles unforgeable: a client cannot take a handle of one
// export and edit it into a handle of another export or of an inode it was
// never given. The secret is stored in the metadata engine, so handles stay
// valid across restarts.
//
// Two keys: fhObject and fhPseudo handles are MAC'd with the MDS's master
// secret, fhData and fhFlex handles with a key derived from it (dataFHKey). Data
// servers get only the derived key, so they can check and mint data
// handles but not MDS handles. The kind byte is under the MAC, so a data
// handle cannot be relabelled as another kind.
const (
	fhVersion = 1
	fhObject  = 1
	fhPseudo  = 2
	fhData    = 3 // a file's data on the data servers (pNFS)
	// fhFlex is a file's data on one data server, in a flexfiles
	// layout: the client writes every copy itself, so the data server
	// writes this copy only and forwards nothing (flexfiles.go).
	fhFlex   = 4
	fhLen    = 28
	fhMACLen = 16
)

var (
	errBadHandle = errors.New("malformed or forged filehandle")
)

// fhandle is a decoded filehandle.
type fhandle struct {
	kind   byte
	export uint16 // export id, or pseudo node index for fhPseudo
	ino    meta.Ino
}

// fhCodec encodes and checks filehandles. A key that is nil means the codec
// cannot handle that kind: a data server's codec (newDataFHCodec) has only
// dataKey.
type fhCodec struct {
	secret  []byte // master secret: fhObject and fhPseudo handles
	dataKey []byte // fhData handles: dataFHKey(secret) on the MDS
	// The MACs keyed with each (nil without the key).
	secretMAC, dataMAC *fhMACer
}

// fhMACer computes handle MACs under one key. Every request decodes a
// handle (PUTFH) and most encode one, and hmac.New costs seven
// allocations and two SHA-256 blocks to key itself; keyed hashes are kept
// in a pool and Reset, which restores the keyed state.
type fhMACer struct {
	pool sync.Pool // of hash.Hash, HMAC-SHA256 under the key
}

func newFHMACer(key []byte) *fhMACer {
	if len(key) == 0 {
		return nil
	}
	key = bytes.Clone(key)
	return &fhMACer{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// sum appends the MAC of b, truncated to fhMACLen bytes, to dst.
func (m *fhMACer) sum(dst, b []byte) []byte {
	h := m.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(b)
	var full [sha256.Size]byte
	out := h.Sum(full[:0])
	m.pool.Put(h)
	return append(dst, out[:fhMACLen]...)
}

// dataFHKeyLabel is the HMAC message that derives the data filehandle key
// from the master secret. Changing it invalidates every data filehandle.
const dataFHKeyLabel = "shoal data filehandle key v1"

// dataFHKey derives the data filehandle key from the master secret:
// HMAC-SHA256(master, dataFHKeyLabel), all 32 bytes. It does not reveal the
// master secret.
func dataFHKey(master []byte) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte(dataFHKeyLabel))
	return m.Sum(nil)
}

// newFHCodec is the MDS's codec: every kind, with the master secret and the
// data key derived from it.
func newFHCodec(master []byte) fhCodec {
	dk := dataFHKey(master)
	return fhCodec{secret: master, dataKey: dk, secretMAC: newFHMACer(master), dataMAC: newFHMACer(dk)}
}

// newDataFHCodec is a data server's codec: it encodes and decodes fhData
// handles only.
func newDataFHCodec(dataKey []byte) fhCodec {
	return fhCodec{dataKey: dataKey, dataMAC: newFHMACer(dataKey)}
}

// mac returns the MAC for handles of kind, or nil if this codec has no
// key for it (or the kind is unknown).
func (c *fhCodec) mac(kind byte) *fhMACer {
	switch kind {
	case fhObject, fhPseudo:
		return c.secretMAC
	case fhData, fhFlex:
		return c.dataMAC
	}
	return nil
}

// loadFHSecret returns the persistent filehandle secret, creating it on first
// start.
func loadFHSecret(get func() ([]byte, error), put func([]byte) error) ([]byte, error) {
	s, err := get()
	if err == nil && len(s) == 32 {
		return s, nil
	}
	if err != nil && !errors.Is(err, meta.ErrNotFound) {
		return nil, err
	}
	s = make([]byte, 32)
	if _, err := rand.Read(s); err != nil {
		return nil, err
	}
	return s, put(s)
}

// encode returns the handle for h, or nil if the codec has no key for
// h.kind (a data server's codec asked for a non-data handle), which every
// decoder rejects.
func (c *fhCodec) encode(h fhandle) []byte {
	m := c.mac(h.kind)
	if m == nil {
		return nil
	}
	b := make([]byte, 12, fhLen)
	b[0] = fhVersion
	b[1] = h.kind
	binary.BigEndian.PutUint16(b[2:4], h.export)
	binary.BigEndian.PutUint64(b[4:12], uint64(h.ino))
	return m.sum(b, b[:12])
}

func (c *fhCodec) decode(b []byte) (fhandle, error) {
	if len(b) != fhLen || b[0] != fhVersion || b[1] < fhObject || b[1] > fhFlex {
		return fhandle{}, errBadHandle
	}
	m := c.mac(b[1])
	var buf [fhMACLen]byte
	if m == nil || !hmac.Equal(b[12:], m.sum(buf[:0], b[:12])) {
		return fhandle{}, errBadHandle
	}
	return fhandle{
		kind:   b[1],
		export: binary.BigEndian.Uint16(b[2:4]),
		ino:    meta.Ino(binary.BigEndian.Uint64(b[4:12])),
	}, nil
}
