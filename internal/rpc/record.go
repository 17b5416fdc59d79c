package rpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// lastFragment is the record-marking bit that ends a record (RFC 5531 §11).
const lastFragment = 1 << 31

// maxFragment is the largest length a record mark can express.
const maxFragment = lastFragment - 1

// ErrRecordTooLarge is returned (wrapped) when a peer announces a record
// larger than the configured limit. The connection is closed without the
// record being allocated.
var ErrRecordTooLarge = errors.New("rpc: record too large")

// recordReader splits a byte stream into records. Every record is returned
// in a slice that the reader never touches again, which is what allows
// decoded values to alias it: either freshly allocated, or, for large
// single-fragment records, a pooled buffer that the record's owner may
// release once nothing references it.
type recordReader struct {
	r   io.Reader
	max int
	hdr [4]byte
}

// next returns the next complete record. It returns io.EOF only when the
// stream ends cleanly between records; a stream that ends inside a record
// yields io.ErrUnexpectedEOF. If rb is not nil the record lives in that
// pooled buffer, and rb.release may be called once nothing references the
// record; dropping rb instead is always safe.
func (rr *recordReader) next() (rec []byte, rb *recBuf, err error) {
	first := true
	for {
		if _, err := io.ReadFull(rr.r, rr.hdr[:]); err != nil {
			if err == io.EOF && !first {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, err
		}
		first = false
		h := binary.BigEndian.Uint32(rr.hdr[:])
		n := int(h & maxFragment)
		total := len(rec)
		if n > rr.max-total {
			return nil, nil, fmt.Errorf("%w: fragment of %d bytes after %d, limit %d", ErrRecordTooLarge, n, total, rr.max)
		}
		if rec == nil && h&lastFragment != 0 {
			// Common case: a single-fragment record, allocated exactly
			// once, or taken from a pool if it is large. Multi-fragment
			// records are rare (Shoal never sends them) and not pooled.
			if rb = getRecord(n, rr.max); rb != nil {
				rec = rb.b[:n]
			} else {
				rec = make([]byte, n)
			}
			if _, err := io.ReadFull(rr.r, rec); err != nil {
				// Nothing references the buffer: the read failed.
				rb.release()
				return nil, nil, unexpected(err)
			}
			return rec, rb, nil
		}
		rec = slices.Grow(rec, n)[:total+n]
		if _, err := io.ReadFull(rr.r, rec[total:]); err != nil {
			return nil, nil, unexpected(err)
		}
		if h&lastFragment != 0 {
			return rec, nil, nil
		}
	}
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// putRecordMark writes a last-fragment mark for a body of n bytes at the
// start of b.
func putRecordMark(b []byte, n int) { binary.BigEndian.PutUint32(b, lastFragment|uint32(n)) }
