package state

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
)

func TestSequenceSlots(t *testing.T) {
	type step struct {
		slot, seq uint32
		hash      uint64
		// complete: reply to store ("" leaves the slot in progress).
		complete  string
		cacheThis bool
		wantErr   error
		wantNew   bool
		wantReply string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"new then retry", []step{
			{slot: 0, seq: 1, complete: "r1", cacheThis: true, wantNew: true},
			{slot: 0, seq: 1, wantReply: "r1"},
			{slot: 0, seq: 1, wantReply: "r1"},
			{slot: 0, seq: 2, complete: "r2", cacheThis: true, wantNew: true},
			{slot: 0, seq: 2, wantReply: "r2"},
		}},
		{"misordered", []step{
			{slot: 0, seq: 2, wantErr: ErrSeqMisordered},
			{slot: 0, seq: 0, wantErr: ErrSeqMisordered},
			{slot: 0, seq: 1, complete: "r1", cacheThis: true, wantNew: true},
			{slot: 0, seq: 3, wantErr: ErrSeqMisordered},
			{slot: 0, seq: 0, wantErr: ErrSeqMisordered},
		}},
		{"slots are independent", []step{
			{slot: 1, seq: 1, complete: "a", cacheThis: true, wantNew: true},
			{slot: 2, seq: 1, complete: "b", cacheThis: true, wantNew: true},
			{slot: 1, seq: 1, wantReply: "a"},
			{slot: 2, seq: 1, wantReply: "b"},
		}},
		{"uncached retry", []step{
			{slot: 0, seq: 1, complete: "r1", cacheThis: false, wantNew: true},
			{slot: 0, seq: 1, wantErr: ErrRetryUncachedRep},
			{slot: 0, seq: 2, complete: "r2", cacheThis: true, wantNew: true},
		}},
		{"in progress retry", []step{
			{slot: 0, seq: 1, wantNew: true},
			{slot: 0, seq: 1, wantErr: ErrDelay},
			{slot: 0, seq: 2, wantErr: ErrSeqMisordered},
		}},
		{"false retry", []step{
			{slot: 0, seq: 1, hash: 11, complete: "r1", cacheThis: true, wantNew: true},
			{slot: 0, seq: 1, hash: 12, wantErr: ErrSeqFalseRetry},
			{slot: 0, seq: 1, hash: 11, wantReply: "r1"},
			{slot: 0, seq: 1, wantReply: "r1"},
		}},
		{"bad slot", []step{
			{slot: 4, seq: 1, wantErr: ErrBadSlot},
			{slot: 1 << 31, seq: 1, wantErr: ErrBadSlot},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			_, s := h.client("a")
			for i, st := range tc.steps {
				r, err := h.m.Sequence(SequenceArgs{SessionID: s.ID(), SlotID: st.slot, SequenceID: st.seq, HighestSlotID: 3, RequestHash: st.hash})
				wantErr(t, fmt.Sprintf("step %d", i), err, st.wantErr)
				if err != nil {
					continue
				}
				if (r.Slot != nil) != st.wantNew {
					t.Fatalf("step %d: new = %v", i, r.Slot != nil)
				}
				if !st.wantNew && string(r.Replay) != st.wantReply {
					t.Fatalf("step %d: replay %q, want %q", i, r.Replay, st.wantReply)
				}
				if r.HighestSlotID != 3 || r.TargetHighestSlotID != 3 || !r.CBPathDown {
					t.Fatalf("step %d: result %+v", i, r)
				}
				if r.Slot != nil && st.complete != "" {
					wantErr(t, "complete", r.Slot.Complete([]byte(st.complete), st.cacheThis), nil)
				}
			}
		})
	}
}

func TestSequenceBadSession(t *testing.T) {
	h := newHarness(t)
	_, err := h.m.Sequence(SequenceArgs{SessionID: SessionID{1}, SequenceID: 1})
	wantErr(t, "unknown", err, ErrBadSession)
	_, s := h.client("a")
	r, err := h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 1})
	wantErr(t, "sequence", err, nil)
	wantErr(t, "destroy", h.m.DestroySession(s.ID()), nil)
	// Completing a slot of a destroyed session is harmless.
	wantErr(t, "complete after destroy", r.Slot.Complete([]byte("x"), true), nil)
	_, err = h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 2})
	wantErr(t, "destroyed", err, ErrBadSession)
}

func TestSlotCacheBounds(t *testing.T) {
	h := newHarness(t)
	_, s := h.client("a") // 4 slots, 4096 bytes cached each
	if s.ForeAttrs().MaxRequests != 4 || s.ForeAttrs().MaxResponseSizeCached != 4096 {
		t.Fatalf("attrs %+v", s.ForeAttrs())
	}
	r, err := h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 1})
	wantErr(t, "seq", err, nil)
	if r.Slot.MaxCached() != 4096 {
		t.Fatalf("MaxCached %d", r.Slot.MaxCached())
	}
	wantErr(t, "too big", r.Slot.Complete(make([]byte, 4097), true), ErrRepTooBigToCache)
	_, err = h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 1})
	wantErr(t, "retry of too big", err, ErrRetryUncachedRep)

	// Each new request on a slot replaces the previous reply; the caller's
	// buffer is copied.
	buf := bytes.Repeat([]byte{'a'}, 4096)
	r, err = h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 2})
	wantErr(t, "seq 2", err, nil)
	wantErr(t, "complete max", r.Slot.Complete(buf, true), nil)
	buf[0] = 'b'
	r, err = h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 2})
	wantErr(t, "retry 2", err, nil)
	if len(r.Replay) != 4096 || r.Replay[0] != 'a' {
		t.Fatal("cached reply aliases caller buffer")
	}
	r, err = h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 3})
	wantErr(t, "seq 3", err, nil)
	wantErr(t, "complete 3", r.Slot.Complete([]byte("x"), true), nil)
	wantErr(t, "double complete", r.Slot.Complete([]byte("y"), true), nil)
	s.mu.Lock()
	total := 0
	for _, sl := range s.slots {
		total += len(sl.reply)
	}
	s.mu.Unlock()
	if total != 1 {
		t.Fatalf("cache holds %d bytes, want 1", total)
	}

	s.SetTargetHighestSlot(1)
	r, err = h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 1, SlotID: 1})
	wantErr(t, "slot 1", err, nil)
	if r.TargetHighestSlotID != 1 || r.HighestSlotID != 3 {
		t.Fatalf("target %d highest %d", r.TargetHighestSlotID, r.HighestSlotID)
	}
}

type fakeConn struct{ name string }

func TestBackChannel(t *testing.T) {
	h := newHarness(t)
	c, _ := h.client("a")
	r, err := h.m.ExchangeID(t.Context(), ExchangeIDArgs{OwnerID: []byte("a"), Verifier: [8]byte{1}, Principal: "p"})
	wantErr(t, "exchange", err, nil)
	c1, c2, c3 := &fakeConn{"1"}, &fakeConn{"2"}, &fakeConn{"3"}
	cs, err := h.m.CreateSession(t.Context(), CreateSessionArgs{ClientID: c, Sequence: r.SequenceID, Principal: "p", CBProgram: 0x40000000, Conn: c1, ConnBackChan: true, Back: ChannelAttrs{MaxRequests: 8}})
	wantErr(t, "create", err, nil)
	if !cs.ConnBackChan || cs.Back.MaxRequests != 1 {
		t.Fatalf("result %+v", cs)
	}
	s, err := h.m.Session(cs.SessionID)
	wantErr(t, "session", err, nil)
	if s.BackChannel() != c1 || s.CBProgram() != 0x40000000 {
		t.Fatal("back channel not bound at create")
	}
	dir, err := h.m.BindConnToSession(s.ID(), c2, ChannelFore)
	wantErr(t, "bind fore", err, nil)
	if dir != ChannelFore {
		t.Fatal(dir)
	}
	_, err = h.m.BindConnToSession(s.ID(), c3, ChannelBoth)
	wantErr(t, "bind both", err, nil)
	_, err = h.m.BindConnToSession(SessionID{}, c3, ChannelBoth)
	wantErr(t, "bind unknown", err, ErrBadSession)
	h.m.ConnClosed(c1)
	if s.BackChannel() != c3 {
		t.Fatal("back channel did not move to c3")
	}
	h.m.ConnClosed(c3)
	if s.BackChannel() != nil {
		t.Fatal("back channel without bound conns")
	}
	sr, err := h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 1})
	wantErr(t, "sequence", err, nil)
	if !sr.CBPathDown {
		t.Fatal("CB path should be down")
	}
	if len(s.Conns()) != 1 {
		t.Fatalf("conns %v", s.Conns())
	}
	c4 := &fakeConn{"4"}
	wantErr(t, "complete", sr.Slot.Complete(nil, false), nil)
	_, err = h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: 2, Conn: c4})
	wantErr(t, "sequence on new conn", err, nil)
	if s.Conns()[c4] != ChannelFore {
		t.Fatalf("SEQUENCE did not bind its connection: %v", s.Conns())
	}

	slot, seq, err := s.BeginCallback()
	wantErr(t, "begin cb", err, nil)
	if slot != 0 || seq != 1 {
		t.Fatalf("cb slot %d seq %d", slot, seq)
	}
	_, _, err = s.BeginCallback()
	wantErr(t, "cb busy", err, ErrDelay)
	s.EndCallback(slot)
	_, seq, err = s.BeginCallback()
	wantErr(t, "begin cb 2", err, nil)
	if seq != 2 {
		t.Fatalf("cb seq %d", seq)
	}
}

// TestConcurrentSlots drives several slots and the I/O check in parallel;
// it is meant for -race.
func TestConcurrentSlots(t *testing.T) {
	h := newHarness(t)
	c, s := h.client("a")
	sid := h.open(c, "o", 1, AccessBoth, DenyNone)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for slot := range uint32(4) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint32(1); seq <= 200; seq++ {
				r, err := h.m.Sequence(SequenceArgs{SessionID: s.ID(), SlotID: slot, SequenceID: seq})
				if err != nil {
					errs <- err
					return
				}
				if err := h.m.CheckIO(c, sid, 1, seq%2 == 0); err != nil {
					errs <- err
					return
				}
				if err := r.Slot.Complete([]byte{byte(seq)}, true); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 200 {
			h.m.Sweep(t.Context())
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
