package client

import (
	"context"
	"sync"
)

// slotTable is the client half of an NFSv4.1 session's fore-channel slot
// table. Each slot carries one request at a time; its sequence id advances
// only when the server has processed a request on it, which is what makes
// retransmissions after a reconnect safe: a request replayed with the same
// slot and sequence id is answered from the server's reply cache.
type slotTable struct {
	mu    sync.Mutex
	seq   []uint32 // next sequence id per slot
	busy  []bool
	limit int // slots usable now: target_highest_slotid+1, at most len(seq)
	// wake is closed and replaced when a slot frees up while waiters (a
	// count) wait for one; with nobody waiting, a release costs no new
	// channel.
	wake    chan struct{}
	waiters int
	dead    bool // the session is gone; waiters give up
}

func newSlotTable(n int) *slotTable {
	if n < 1 {
		n = 1
	}
	t := &slotTable{seq: make([]uint32, n), busy: make([]bool, n), limit: n, wake: make(chan struct{})}
	for i := range t.seq {
		t.seq[i] = 1
	}
	return t
}

// acquire returns a free slot and its sequence id, waiting while all usable
// slots are busy.
func (t *slotTable) acquire(ctx context.Context) (slot int, seq uint32, highest int, err error) {
	for {
		t.mu.Lock()
		if t.dead {
			t.mu.Unlock()
			return 0, 0, 0, errSessionGone
		}
		for i := 0; i < t.limit; i++ {
			if !t.busy[i] {
				t.busy[i] = true
				seq, highest := t.seq[i], t.limit-1
				t.mu.Unlock()
				return i, seq, highest, nil
			}
		}
		ch := t.wake
		t.waiters++
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.mu.Lock()
			if t.wake == ch {
				t.waiters-- // still counted: no wake-up reset the count
			}
			t.mu.Unlock()
			return 0, 0, 0, ctx.Err()
		}
	}
}

// release frees a slot. advance says the server processed the request, so
// the slot's sequence id moves on. target is the server's
// sr_target_highest_slotid (negative when unknown).
func (t *slotTable) release(slot int, advance bool, target int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if advance {
		t.seq[slot]++
	}
	t.busy[slot] = false
	if target >= 0 {
		l := target + 1
		if l > len(t.seq) {
			l = len(t.seq)
		}
		if l < 1 {
			l = 1
		}
		t.limit = l
	}
	t.wakeWaiters()
}

// wakeWaiters wakes every acquire waiting for a slot. t.mu is held.
func (t *slotTable) wakeWaiters() {
	if t.waiters == 0 {
		return
	}
	close(t.wake)
	t.wake = make(chan struct{})
	t.waiters = 0
}

// kill marks the table dead and wakes all waiters.
func (t *slotTable) kill() {
	t.mu.Lock()
	t.dead = true
	t.wakeWaiters()
	t.mu.Unlock()
}
