package server

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"

	"github.com/shoalfs/shoal/meta"
)

// Filehandle layout (28 bytes, opaque to clients):
//
//	[0]     format version (fhVersion)
//	[1]     kind: fhObject (an inode inside an export) or fhPseudo (a node of
//	        the pseudo-root)
//	[2:4]   export id, or pseudo node index
//	[4:12]  inode number (never reused, so no generation number is needed)
//	[12:28] HMAC-SHA256 over bytes [0:12] with the server's persistent secret,
//	        truncated to 16 bytes
//
// The MAC makes handles unforgeable: a client cannot take a handle of one
// export and edit it into a handle of another export or of an inode it was
// never given. The secret is stored in the metadata engine, so handles stay
// valid across restarts.
const (
	fhVersion = 1
	fhObject  = 1
	fhPseudo  = 2
	fhData    = 3 // a file's data on the data servers (pNFS)
	fhLen     = 28
	fhMACLen  = 16
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

type fhCodec struct {
	secret []byte
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

func (c *fhCodec) encode(h fhandle) []byte {
	b := make([]byte, fhLen)
	b[0] = fhVersion
	b[1] = h.kind
	binary.BigEndian.PutUint16(b[2:4], h.export)
	binary.BigEndian.PutUint64(b[4:12], uint64(h.ino))
	copy(b[12:], c.mac(b[:12]))
	return b
}

func (c *fhCodec) decode(b []byte) (fhandle, error) {
	if len(b) != fhLen || b[0] != fhVersion || b[1] < fhObject || b[1] > fhData {
		return fhandle{}, errBadHandle
	}
	if !hmac.Equal(b[12:], c.mac(b[:12])) {
		return fhandle{}, errBadHandle
	}
	return fhandle{
		kind:   b[1],
		export: binary.BigEndian.Uint16(b[2:4]),
		ino:    meta.Ino(binary.BigEndian.Uint64(b[4:12])),
	}, nil
}

func (c *fhCodec) mac(b []byte) []byte {
	m := hmac.New(sha256.New, c.secret)
	m.Write(b)
	return m.Sum(nil)[:fhMACLen]
}
