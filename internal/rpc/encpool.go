package rpc

import (
	"sync"

	"github.com/shoalfs/shoal/internal/xdr"
)

// Encoders of calls and replies are reused: every round trip encodes one
// call and one reply, and a fresh Encoder is two allocations (the Encoder
// and its buffer) on each side. An Encoder goes back once the record is
// written or copied into the write queue (write), which is when nothing
// references its buffer any more: a Handler must not use res after
// ServeRPC returns, and AfterReply callbacks do not get it.
var encoders = sync.Pool{New: func() any { return xdr.NewEncoder(512) }}

// maxPooledEncoder is the largest encoder buffer kept for reuse; the
// buffers of large replies (READDIR of a big directory) go to the garbage
// collector instead of staying in the pool.
const maxPooledEncoder = 64 << 10

// getEncoder returns an empty Encoder.
func getEncoder() *xdr.Encoder { return encoders.Get().(*xdr.Encoder) }

// putEncoder gives e back for reuse. Nothing may use e or anything it
// returned (Bytes, Buffers) afterwards.
func putEncoder(e *xdr.Encoder) {
	if e.Cap() > maxPooledEncoder {
		return
	}
	e.Reset()
	encoders.Put(e)
}
