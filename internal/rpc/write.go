package rpc

import (
	"fmt"
	"net"
	"runtime"
	"time"
)

// Writing records: one writer at a time, and the records of the others
// that come meanwhile go out with its next write.
//
// On loopback a write(2) of a small record costs several microseconds of
// system time, most of it the receiving side's TCP processing, which the
// kernel runs in the writer's context, and the wakeup of the reader; the
// bytes themselves hardly count. With several calls in flight on one
// connection (a client with several streams of operations, a server
// answering them) replies and calls become ready while another goroutine
// is inside write(2). Such a record, if it is small, is copied into a queue
// and its goroutine goes on at once; the writer, before it lets go of the
// connection, writes the whole queue with one write(2). The copy of a few
// hundred bytes is cheap next to a system call, and nothing waits for
// anything it would not have waited for anyway: a goroutine only queues
// when it would otherwise block on the writer.
//
// Records larger than maxCoalesce (READ and WRITE data) are never copied:
// their goroutine waits for its turn and writes them with writev from the
// caller's buffers, as the buffer-release contract requires. So that such
// a goroutine is not kept waiting while others keep queueing in front of
// it, a goroutine that waits for its turn stops the queueing until it has
// the connection; and a writer drains the queue at most maxDrainRounds
// times before it stops accepting more.
//
// A goroutine that takes the connection to write while other calls are in
// flight on it yields the processor once first (runtime.Gosched): the
// goroutines ready to run then, which on a busy machine are often other
// calls' callers or handlers about to write, put their records in the
// queue, and one write(2) carries them all. On loopback with four streams
// of small COMPOUNDs (shoal bench --streams 4) the queue alone took the
// writev calls per COMPOUND, client and server together, from 2 to about
// 1.8; with the yield they fell to about 0.8, and the CPU per COMPOUND by
// a fifth. With one call at a time nothing yields and nothing is queued.
//
// The order of one goroutine's records is kept: the queue is in order, and
// a goroutine that gets the connection writes what is queued before its
// own record, so a record queued earlier goes out before one its
// goroutine writes later without queueing.
//
// A reply that was queued is finished (its AfterReply callbacks run, its
// call's accounting ends) by the goroutine that wrote it, once it is
// written, so AfterReply still means that the reply is in the kernel's
// hands, as Quiesce-style waits for outstanding replies rely on. A record
// that was queued, and that the writer then fails to write, fails
// silently for its goroutine; the failure closes the connection, which
// fails every pending call, so a caller learns of it from Pending.Wait
// instead of from Send, and a reply's call is finished as one whose reply
// failed to be written.
const (
	// maxCoalesce is the largest record copied into the queue.
	maxCoalesce = 16 << 10
	// maxQueued bounds the queue in bytes; a record that does not fit
	// waits for its turn.
	maxQueued = 128 << 10
	// firstQueue is the capacity of a connection's first queue buffer:
	// room for a handful of small COMPOUNDs.
	firstQueue = 4 << 10
	// keepQueue is the largest queue buffer kept between writes; the
	// queue buffers of a connection that once saw a burst are dropped.
	keepQueue = 16 << 10
	// maxDrainRounds bounds the queue writes of one writer before it
	// stops accepting more.
	maxDrainRounds = 16
)

// write writes bufs as one record: at once (writev), or queued behind the
// goroutine that is writing. A failed or partial write leaves the stream
// unusable, so it closes the connection. If fin is not nil (a reply) and
// the record is queued, queued is true and the goroutine that writes the
// queue finishes fin once the record is written or dropped; otherwise the
// caller finishes it.
func (c *Conn) write(bufs net.Buffers, fin *served) (queued bool, err error) {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	c.qmu.Lock()
	if c.writers > 0 {
		if c.accepting && n <= maxCoalesce && len(c.wq)+n <= maxQueued {
			if c.wq == nil {
				c.wq = make([]byte, 0, firstQueue)
			}
			for _, b := range bufs {
				c.wq = append(c.wq, b...)
			}
			if fin != nil {
				c.wfin = append(c.wfin, *fin)
			}
			c.qmu.Unlock()
			return true, nil
		}
		// Waiting for the writer: nobody queues in front of us meanwhile.
		c.accepting = false
	}
	c.writers++
	c.qmu.Unlock()

	c.wmu.Lock()
	c.qmu.Lock()
	c.accepting = true
	c.qmu.Unlock()
	if c.busy.Load() > 1 {
		// Other calls are in flight on this connection: let the
		// goroutines that are ready to run go first, so that records
		// they produce meanwhile join this write (see above).
		runtime.Gosched()
	}
	fins, err := c.drain(bufs)
	c.wmu.Unlock()
	// The queued replies' calls are finished outside the lock: their
	// AfterReply callbacks may write on this connection themselves.
	for _, f := range fins {
		c.finishCall(f)
	}
	return false, err
}

// drain writes what was queued and then own (which may be nil) in one
// writev, then the queue until it is empty, and gives up the role of
// writer. c.wmu is held. The queue goes first: records queued before this
// goroutine had the connection may be ones that their goroutine wrote
// before one it now waits to write itself. If a write fails, the rest of
// the queue is dropped (the connection is closed by then). It returns the
// calls whose replies were written or dropped, for the caller to finish
// once it has let go of c.wmu (nil, and nothing allocated, if no reply
// was queued).
func (c *Conn) drain(own net.Buffers) (fins []served, err error) {
	for round := 0; ; round++ {
		c.qmu.Lock()
		if err != nil || len(c.wq) == 0 && own == nil {
			fins = append(fins, c.wfin...) // none unless dropped
			clear(c.wfin)
			c.wq, c.wfin = c.wq[:0], c.wfin[:0]
			c.writers--
			c.qmu.Unlock()
			return fins, err
		}
		if round >= maxDrainRounds {
			c.accepting = false
		}
		q, qfin := c.wq, c.wfin
		c.wq, c.wfin = c.wspare[:0], c.wfinSpare[:0]
		c.qmu.Unlock()
		err = c.writev(q, own)
		own = nil
		fins = append(fins, qfin...)
		clear(qfin)
		c.wfinSpare = qfin[:0]
		if cap(q) <= keepQueue {
			c.wspare = q[:0]
		} else {
			c.wspare = nil
		}
	}
}

// writev writes q (queued records, may be empty) and then bufs with a
// single writev. c.wmu is held.
func (c *Conn) writev(q []byte, bufs net.Buffers) error {
	select {
	case <-c.done:
		return c.Err()
	default:
	}
	if c.cfg.WriteTimeout > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	}
	// WriteTo consumes the slice it is called on, through a pointer that
	// escapes: written from c's own fields, a record costs no allocation
	// of a slice header. The references are cleared after, so that the
	// connection keeps no record's buffers alive.
	c.wbase = c.wbase[:0]
	if len(q) > 0 {
		c.wbase = append(c.wbase, q)
	}
	c.wbase = append(c.wbase, bufs...)
	c.wbufs = c.wbase
	_, err := c.wbufs.WriteTo(c.nc)
	clear(c.wbase)
	if err != nil {
		c.closeWith(fmt.Errorf("write: %w", err))
		return c.Err()
	}
	c.touch()
	return nil
}
