package rpc

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
)

// Record buffers of large records are recycled; see "Buffer reuse" in the
// package documentation for the contract.
//
// Size classes are 2^k + recordSlack bytes for k from minPooledShift up: a
// 1 MiB NFS WRITE or OBJ_WRITE arrives as 1 MiB of data plus a few hundred
// bytes of headers, and plain powers of two would put it in the 2 MiB class
// and waste half of every buffer. Records below 64 KiB keep plain make():
// they are cheap to allocate, come from the size-class spans of the Go
// allocator rather than fresh pages, and are the bulk of metadata traffic.
//
// The classes are sync.Pools. A pool hands out only buffers that were put
// back, and a buffer is put back only once nothing references it, so a
// buffer is never in two places at once. sync.Pool is emptied by garbage
// collection (a buffer survives at most two cycles unused, and the runtime
// forces a cycle at least every two minutes), so an idle server does not
// keep hundreds of MiB of buffers, while under load, where records are
// recycled much faster than collections happen, nearly every large record
// reuses a buffer whose pages are already faulted in. A fixed-size free
// list would need a cap per class and would pin that memory forever; the
// number of buffers in use is already bounded by MaxInFlight per
// connection.
const (
	minPooledShift = 16      // smallest pooled class: 64 KiB + slack
	maxPooledShift = 30      // largest: 1 GiB + slack, beyond any sane MaxRecord
	recordSlack    = 4 << 10 // room for RPC and COMPOUND headers around a 2^k payload
	minPooled      = 1 << minPooledShift
)

var recordPools [maxPooledShift - minPooledShift + 1]sync.Pool

// recordPoolStats counts pooled record buffers, for tests and benchmarks.
var recordPoolStats struct {
	reused, allocated, released atomic.Int64
}

// recBuf is a pooled record buffer. The pools hold *recBuf so that putting
// one back does not allocate.
type recBuf struct {
	b     []byte // full capacity of the class
	class int
}

// recordClass returns the pool index and buffer size for a record of n
// bytes, or ok false if n is not pooled.
func recordClass(n int) (class, size int, ok bool) {
	if n < minPooled {
		return 0, 0, false
	}
	for k := minPooledShift; k <= maxPooledShift; k++ {
		if size := 1<<k + recordSlack; n <= size {
			return k - minPooledShift, size, true
		}
	}
	return 0, 0, false
}

// getRecord returns a pooled buffer for a record of n bytes whose length is
// at most limit, or nil if such a record is not pooled (too small, or its
// class would exceed limit by more than the slack, which would loosen the
// memory bound MaxRecord gives).
func getRecord(n, limit int) *recBuf {
	class, size, ok := recordClass(n)
	if !ok || size > limit+recordSlack {
		return nil
	}
	if rb, _ := recordPools[class].Get().(*recBuf); rb != nil {
		if poisonReleased {
			checkPoison(rb.b)
		}
		recordPoolStats.reused.Add(1)
		return rb
	}
	recordPoolStats.allocated.Add(1)
	return &recBuf{b: make([]byte, size), class: class}
}

// release returns rb to its pool. The caller guarantees that nothing
// references any part of rb.b any more. A nil rb is ignored.
func (rb *recBuf) release() {
	if rb == nil {
		return
	}
	if poisonReleased {
		poison(rb.b)
	}
	recordPoolStats.released.Add(1)
	recordPools[rb.class].Put(rb)
}

// poisonByte fills released buffers when poisoning is on, so a reader that
// still holds a sub-slice sees 0xdbdbdb... instead of plausible data.
const poisonByte = 0xdb

var poisonBlock = bytes.Repeat([]byte{poisonByte}, 4<<10)

// poison fills b with poisonByte.
func poison(b []byte) {
	for len(b) > 0 {
		b = b[copy(b, poisonBlock):]
	}
}

// checkPoison verifies that a buffer coming out of a pool was not written
// after it was released.
func checkPoison(b []byte) {
	for off := 0; off < len(b); off += len(poisonBlock) {
		chunk := b[off:min(off+len(poisonBlock), len(b))]
		if !bytes.Equal(chunk, poisonBlock[:len(chunk)]) {
			i := off
			for chunk[i-off] == poisonByte {
				i++
			}
			panic(fmt.Sprintf("rpc: record buffer written after release (byte %d of %d is %#x)", i, len(b), b[i]))
		}
	}
}
