package rpc

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingConn counts the Write calls made on a net.Conn. It hides the
// TCP connection's writev, so net.Buffers.WriteTo makes one Write per
// buffer; the queue is written as one buffer.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// writePair returns a Conn whose writes go over loopback TCP (not
// started: nothing reads its side) and a record reader on the other end.
func writePair(t *testing.T) (*Conn, *countingConn, *recordReader) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	peer.SetDeadline(time.Now().Add(30 * time.Second))
	cc := &countingConn{Conn: nc}
	c := newConn(cc, nil, ConnConfig{})
	t.Cleanup(func() { c.Close() })
	return c, cc, &recordReader{r: bufio.NewReader(peer), max: 1 << 24}
}

// testRecord is a record of n bytes (n ≥ 12) that says who wrote it: the
// writer's number and its sequence number, then filler derived from both.
func testRecord(writer, seq uint32, n int) []byte {
	b := make([]byte, n)
	putRecordMark(b, n-4)
	binary.BigEndian.PutUint32(b[4:], writer)
	binary.BigEndian.PutUint32(b[8:], seq)
	for i := 12; i < n; i++ {
		b[i] = byte(writer*31 + seq + uint32(i))
	}
	return b
}

// checkRecord verifies rec (a record without its mark) as testRecord made
// it and returns its writer and sequence number.
func checkRecord(rec []byte) (writer, seq uint32, err error) {
	if len(rec) < 8 {
		return 0, 0, fmt.Errorf("record of %d bytes", len(rec))
	}
	writer, seq = binary.BigEndian.Uint32(rec), binary.BigEndian.Uint32(rec[4:])
	want := testRecord(writer, seq, len(rec)+4)[4:]
	if !bytes.Equal(rec, want) {
		return writer, seq, fmt.Errorf("record %d/%d of %d bytes is corrupt", writer, seq, len(rec))
	}
	return writer, seq, nil
}

// holdWriter makes the test the goroutine that is writing on c, as if it
// were inside write(2): records written meanwhile queue behind it.
func holdWriter(c *Conn) {
	c.qmu.Lock()
	c.writers++
	c.qmu.Unlock()
	c.wmu.Lock()
	c.qmu.Lock()
	c.accepting = true
	c.qmu.Unlock()
}

// releaseWriter ends holdWriter as write does: it writes the queue.
func releaseWriter(c *Conn) error {
	fins, err := c.drain(nil)
	c.wmu.Unlock()
	for _, f := range fins {
		c.finishCall(f)
	}
	return err
}

// TestWriteQueue checks that small records written while another goroutine
// writes are queued and go out together, in order, with one write, and
// that what must not be queued is not.
func TestWriteQueue(t *testing.T) {
	tests := []struct {
		name  string
		sizes []int // records written, in order, while the test holds the writer
		// writes is how many Write calls releasing the writer makes.
		writes int64
	}{
		{"one small", []int{100}, 1},
		{"several small", []int{100, 300, 12, 4096}, 1},
		{"largest queued", []int{maxCoalesce, 64}, 1},
		{"queue full", nil, 0}, // filled below
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, cc, rr := writePair(t)
			sizes := tc.sizes
			if tc.name == "queue full" {
				// maxQueued/maxCoalesce records fill the queue exactly;
				// one more does not fit and waits for its turn.
				for range maxQueued / maxCoalesce {
					sizes = append(sizes, maxCoalesce)
				}
			}
			holdWriter(c)
			for i, n := range sizes {
				// Queued records return at once, though the writer is
				// held: this would hang if they waited.
				if err := writeNoFin(c, [][]byte{testRecord(1, uint32(i), n)}); err != nil {
					t.Fatal(err)
				}
			}
			if got := cc.writes.Load(); got != 0 {
				t.Fatalf("%d writes while the writer was held", got)
			}
			extra := make(chan error, 1)
			if tc.name == "queue full" {
				go func() { extra <- writeNoFin(c, [][]byte{testRecord(1, uint32(len(sizes)), 64)}) }()
				waitFor(t, "the extra record's goroutine to wait for the writer", func() bool {
					c.qmu.Lock()
					defer c.qmu.Unlock()
					return c.writers == 2 && !c.accepting
				})
				sizes = append(sizes, 64)
			} else {
				extra <- nil
			}
			if err := releaseWriter(c); err != nil {
				t.Fatal(err)
			}
			if err := <-extra; err != nil {
				t.Fatal(err)
			}
			if got, want := cc.writes.Load(), tc.writes; tc.name != "queue full" && got != want {
				t.Errorf("releasing the writer made %d writes, want %d", got, want)
			}
			for i, n := range sizes {
				rec, _, err := rr.next()
				if err != nil {
					t.Fatal(err)
				}
				w, seq, err := checkRecord(rec)
				if err != nil {
					t.Fatal(err)
				}
				if w != 1 || seq != uint32(i) || len(rec) != n-4 {
					t.Fatalf("record %d is %d/%d of %d bytes, want 1/%d of %d", i, w, seq, len(rec)+4, i, n)
				}
			}
			c.qmu.Lock()
			defer c.qmu.Unlock()
			if c.writers != 0 || len(c.wq) != 0 {
				t.Errorf("after the writes: %d writers, %d bytes queued", c.writers, len(c.wq))
			}
		})
	}
}

// TestWriteLargeNotQueued checks that a record larger than maxCoalesce is
// not copied: its goroutine waits until the writer lets go, and meanwhile
// nobody queues in front of it.
func TestWriteLargeNotQueued(t *testing.T) {
	c, _, rr := writePair(t)
	holdWriter(c)
	if err := writeNoFin(c, [][]byte{testRecord(1, 0, 100)}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- writeNoFin(c, [][]byte{testRecord(2, 0, maxCoalesce+1)}) }()
	waitFor(t, "the large record's goroutine to wait for the writer", func() bool {
		c.qmu.Lock()
		defer c.qmu.Unlock()
		return c.writers == 2 && !c.accepting
	})
	small := make(chan error, 1)
	go func() { small <- writeNoFin(c, [][]byte{testRecord(3, 0, 100)}) }()
	waitFor(t, "the small record's goroutine to wait for the writer", func() bool {
		c.qmu.Lock()
		defer c.qmu.Unlock()
		return c.writers == 3
	})
	if err := releaseWriter(c); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{done, small} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	// The queued record first; then the large one and the last small one,
	// in whichever order their goroutines got the connection.
	seen := map[uint32]int{}
	for i := range 3 {
		rec, _, err := rr.next()
		if err != nil {
			t.Fatal(err)
		}
		w, _, err := checkRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 && w != 1 {
			t.Fatalf("first record is writer %d's, want the queued one (1)", w)
		}
		seen[w] = len(rec) + 4
	}
	if seen[2] != maxCoalesce+1 || seen[3] != 100 {
		t.Fatalf("records seen: %v", seen)
	}
}

// TestWriteQueueFailure checks that when the writer's write fails, the
// connection closes with the write error and the queue is dropped, and
// that later writes fail rather than queue on a dead connection.
func TestWriteQueueFailure(t *testing.T) {
	c, cc, _ := writePair(t)
	holdWriter(c)
	if err := writeNoFin(c, [][]byte{testRecord(1, 0, 100)}); err != nil {
		t.Fatal(err)
	}
	cc.Conn.Close() // the queue's write fails
	err := releaseWriter(c)
	if !errors.Is(err, ErrConnClosed) {
		t.Fatalf("releasing the writer: %v, want ErrConnClosed", err)
	}
	if err := writeNoFin(c, [][]byte{testRecord(1, 1, 100)}); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("write after the failure: %v, want ErrConnClosed", err)
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if c.writers != 0 || len(c.wq) != 0 {
		t.Errorf("after the failure: %d writers, %d bytes queued", c.writers, len(c.wq))
	}
}

// TestWriteConcurrent has many goroutines write records of mixed sizes at
// once, with other calls in flight (so writers yield and the queue fills):
// every record must arrive whole, and each goroutine's in the order it
// wrote them.
func TestWriteConcurrent(t *testing.T) {
	c, cc, rr := writePair(t)
	c.busy.Add(2) // as if calls were in flight: writers yield first
	defer c.busy.Add(-2)
	const writers, each = 8, 200
	sizes := []int{12, 100, 700, 5000, maxCoalesce, maxCoalesce + 1, 100 << 10}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				n := sizes[(w+i)%len(sizes)]
				if err := writeNoFin(c, [][]byte{testRecord(uint32(w), uint32(i), n)}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	next := make([]uint32, writers)
	for range writers * each {
		rec, _, err := rr.next()
		if err != nil {
			t.Fatal(err)
		}
		w, seq, err := checkRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		if w >= writers || seq != next[w] {
			t.Fatalf("record %d/%d, want %d/%d", w, seq, w, next[min(w, writers-1)])
		}
		next[w]++
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d records in %d writes", writers*each, cc.writes.Load())
}

// writeNoFin writes a record that is not a reply.
func writeNoFin(c *Conn, bufs net.Buffers) error {
	_, err := c.write(bufs, nil)
	return err
}

// TestWriteQueuedReplyFinish checks that a reply that goes into the write
// queue has its AfterReply callbacks run, and its call's accounting ended,
// only once the writer has written it: AfterReply means the reply is
// written, queued or not.
func TestWriteQueuedReplyFinish(t *testing.T) {
	c, _, rr := writePair(t)
	// What readLoop does before it hands a call to serve.
	c.sem <- struct{}{}
	c.busy.Add(1)
	c.handlers.Add(1)
	var ran atomic.Bool
	call := &Call{XID: 7}
	call.AfterReply(func() { ran.Store(true) })
	holdWriter(c)
	queued, err := c.write([][]byte{testRecord(1, 0, 100)}, &served{call: call})
	if err != nil || !queued {
		t.Fatalf("write: queued %v, err %v; want a queued reply", queued, err)
	}
	if ran.Load() {
		t.Fatal("AfterReply ran before the queued reply was written")
	}
	if got := c.busy.Load(); got != 1 {
		t.Fatalf("busy %d before the queued reply was written, want 1", got)
	}
	if err := releaseWriter(c); err != nil {
		t.Fatal(err)
	}
	if !ran.Load() {
		t.Fatal("AfterReply did not run after the queued reply was written")
	}
	if got := c.busy.Load(); got != 0 {
		t.Fatalf("busy %d after the reply was written, want 0", got)
	}
	c.handlers.Wait() // the call's accounting ended: this returns
	rec, _, err := rr.next()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := checkRecord(rec); err != nil {
		t.Fatal(err)
	}
}

// TestWriteDroppedReplyFinish checks that a queued reply that is never
// written, because the write before it failed, is still finished.
func TestWriteDroppedReplyFinish(t *testing.T) {
	c, cc, _ := writePair(t)
	c.sem <- struct{}{}
	c.busy.Add(1)
	c.handlers.Add(1)
	var ran atomic.Bool
	call := &Call{XID: 8}
	call.AfterReply(func() { ran.Store(true) })
	holdWriter(c)
	if queued, err := c.write([][]byte{testRecord(1, 0, 100)}, &served{call: call}); err != nil || !queued {
		t.Fatalf("write: queued %v, err %v; want a queued reply", queued, err)
	}
	cc.Conn.Close()
	if err := releaseWriter(c); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("releasing the writer: %v, want ErrConnClosed", err)
	}
	if !ran.Load() {
		t.Fatal("AfterReply did not run for the dropped reply")
	}
	c.handlers.Wait()
}
