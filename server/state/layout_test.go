package state

import (
	"errors"
	"testing"
	"time"
)

func TestLayoutLifecycle(t *testing.T) {
	h := newHarness(t)
	m := h.m
	c, _ := h.client("c1")
	o := h.open(c, "o1", 7, AccessBoth, DenyNone)
	ls, err := m.LayoutGet(c, o, 7, IOModeRW)
	if err != nil || ls.Seqid != 1 || ls.Type() != TypeLayout {
		t.Fatalf("first LayoutGet = %v, %v", ls, err)
	}
	ls2, err := m.LayoutGet(c, ls, 7, IOModeRW)
	if err != nil || ls2.Seqid != 2 || ls2.Other != ls.Other {
		t.Fatalf("second LayoutGet = %v, %v", ls2, err)
	}
	if _, err := m.LayoutGet(c, ls, 7, IOModeRW); !errors.Is(err, ErrOldStateid) {
		t.Fatalf("old layout seqid: %v", err)
	}
	if errs := m.TestStateid(c, []Stateid{ls2}); errs[0] != nil {
		t.Fatalf("TestStateid(layout) = %v", errs[0])
	}
	holders := m.BeginRecall(7)
	if len(holders) != 1 || holders[0].ClientID != c || holders[0].Stateid.Seqid != 3 {
		t.Fatalf("BeginRecall = %+v", holders)
	}
	if _, err := m.LayoutGet(c, o, 7, IOModeRW); !errors.Is(err, ErrRecallConflict) {
		t.Fatalf("LayoutGet during own recall: %v", err)
	}
	c2, _ := h.client("c2")
	o2 := h.open(c2, "o2", 7, AccessRead, DenyNone)
	if _, err := m.LayoutGet(c2, o2, 7, IOModeRead); !errors.Is(err, ErrLayoutTryLater) {
		t.Fatalf("LayoutGet during other's recall: %v", err)
	}
	if m.Recalled(7) {
		t.Fatal("recalled before return")
	}
	if _, present, err := m.LayoutReturnFile(c, holders[0].Stateid, 7); err != nil || present {
		t.Fatalf("LayoutReturnFile = %v, %v", present, err)
	}
	if !m.Recalled(7) {
		t.Fatal("layout still outstanding after return")
	}
	if _, err := m.LayoutGet(c2, o2, 7, IOModeRead); err != nil {
		t.Fatalf("LayoutGet after recall: %v", err)
	}
}

func TestLayoutRecallTimeoutRevokes(t *testing.T) {
	h := newHarness(t)
	m := h.m
	c, _ := h.client("c1")
	o := h.open(c, "o1", 9, AccessRead, DenyNone)
	if _, err := m.LayoutGet(c, o, 9, IOModeRead); err != nil {
		t.Fatal(err)
	}
	m.BeginRecall(9)
	h.clock.Advance(m.LeaseTime() / 2)
	m.Renew(c)
	m.Sweep(t.Context())
	if m.Recalled(9) || len(h.revoked) != 0 {
		t.Fatal("revoked before the deadline")
	}
	h.clock.Advance(m.LeaseTime()/2 + time.Second)
	m.Renew(c)
	m.Sweep(t.Context())
	if !m.Recalled(9) || len(h.revoked) != 1 || h.revoked[0] != c {
		t.Fatalf("after deadline: recalled=%v revoked=%v", m.Recalled(9), h.revoked)
	}
}

func TestCheckIOAny(t *testing.T) {
	h := newHarness(t)
	c, _ := h.client("c1")
	o := h.open(c, "o1", 5, AccessRead, DenyNone)
	if id, err := h.m.CheckIOAny(o, 5, false); err != nil || id != c {
		t.Fatalf("CheckIOAny read = %v, %v", id, err)
	}
	if _, err := h.m.CheckIOAny(o, 5, true); !errors.Is(err, ErrOpenMode) {
		t.Fatalf("CheckIOAny write on read open: %v", err)
	}
	if _, err := h.m.CheckIOAny(AnonymousStateid, 5, false); !errors.Is(err, ErrBadStateid) {
		t.Fatalf("anonymous: %v", err)
	}
}
