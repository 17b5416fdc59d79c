package state

import (
	"fmt"
	"testing"

	"github.com/shoalfs/shoal/pnfs"
)

func TestStateidSeqidRules(t *testing.T) {
	h := newHarness(t)
	c, _ := h.client("a")
	other, _ := h.client("b")
	s1 := h.open(c, "o", 1, AccessRead, DenyNone)
	s2 := h.open(c, "o", 1, AccessWrite, DenyNone) // upgrade: same other, seqid 2
	if s1.Other != s2.Other || s2.Seqid != s1.Seqid+1 {
		t.Fatalf("upgrade: %v -> %v", s1, s2)
	}
	if s1.Type() != TypeOpen || s1.Epoch() != 1 {
		t.Fatalf("stateid layout: type %v epoch %d", s1.Type(), s1.Epoch())
	}
	with := func(s Stateid, seq uint32) Stateid { s.Seqid = seq; return s }
	stale := s2
	stale.Other[3]-- // an earlier boot's epoch
	unknown := s2
	unknown.Other[11]++
	tests := []struct {
		name   string
		client ClientID
		sid    Stateid
		want   error
		ioOK   bool // a special stateid CheckIO accepts
	}{
		{"current seqid", c, s2, nil, false},
		{"seqid 0 means current", c, with(s2, 0), nil, false},
		{"old seqid", c, s1, pnfs.ErrOldStateid, false},
		{"future seqid", c, with(s2, 3), pnfs.ErrBadStateid, false},
		{"stale epoch", c, stale, pnfs.ErrStaleStateid, false},
		{"unknown", c, unknown, pnfs.ErrBadStateid, false},
		{"other client", other, s2, pnfs.ErrBadStateid, false},
		{"anonymous", c, AnonymousStateid, pnfs.ErrBadStateid, true},
		{"bypass", c, ReadBypassStateid, pnfs.ErrBadStateid, true},
		{"current marker", c, CurrentStateid, pnfs.ErrBadStateid, false},
		{"invalid", c, InvalidStateid, pnfs.ErrBadStateid, false},
	}
	sids := make([]Stateid, len(tests))
	for i, tc := range tests {
		sids[i] = tc.sid
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if tc.ioOK {
				want = nil
			}
			wantErr(t, "CheckIO", h.m.CheckIO(tc.client, tc.sid, 1, false), want)
		})
	}
	// TEST_STATEID agrees for the calling client.
	res := h.m.TestStateid(c, sids)
	for i, tc := range tests {
		if tc.client != c {
			continue
		}
		wantErr(t, "TestStateid "+tc.name, res[i], tc.want)
	}
	for _, s := range []Stateid{AnonymousStateid, ReadBypassStateid, CurrentStateid, InvalidStateid} {
		if !s.IsSpecial() {
			t.Fatalf("%v not special", s)
		}
	}
	if s1.IsSpecial() || !CurrentStateid.IsCurrent() || !AnonymousStateid.IsAnonymous() || !ReadBypassStateid.IsReadBypass() {
		t.Fatal("special stateid helpers")
	}
}

func TestSeqidWrap(t *testing.T) {
	if nextSeqid(0xffffffff) != 1 {
		t.Fatal("wrap must skip 0")
	}
	wantErr(t, "after wrap", checkSeqid(0xffffffff, 1), pnfs.ErrOldStateid)
	wantErr(t, "ahead over wrap", checkSeqid(1, 0xffffffff), pnfs.ErrBadStateid)
}

func TestShareReservationMatrix(t *testing.T) {
	for a1 := uint32(1); a1 <= 3; a1++ {
		for d1 := uint32(0); d1 <= 3; d1++ {
			for a2 := uint32(1); a2 <= 3; a2++ {
				for d2 := uint32(0); d2 <= 3; d2++ {
					conflict := a1&d2 != 0 || a2&d1 != 0
					name := fmt.Sprintf("A%d.D%d-A%d.D%d", a1, d1, a2, d2)
					t.Run(name, func(t *testing.T) {
						h := newHarness(t)
						c1, _ := h.client("one")
						c2, _ := h.client("two")
						h.open(c1, "o", 9, a1, d1)
						var want error
						if conflict {
							want = ErrShareDenied
						}
						// Another client and another owner of the same
						// client are both subject to the reservation.
						r, err := h.m.Open(OpenArgs{ClientID: c2, Owner: []byte("o"), File: 9, Access: a2, Deny: d2})
						wantErr(t, "other client", err, want)
						if err == nil {
							if _, err := h.m.Close(c2, r.Stateid); err != nil {
								t.Fatal(err)
							}
						}
						_, err = h.m.Open(OpenArgs{ClientID: c1, Owner: []byte("o2"), File: 9, Access: a2, Deny: d2})
						wantErr(t, "other owner", err, want)
						// Another file is unaffected.
						_, err = h.m.Open(OpenArgs{ClientID: c2, Owner: []byte("o"), File: 10, Access: a2, Deny: d2})
						wantErr(t, "other file", err, nil)
					})
				}
			}
		}
	}
}

func TestOpenUpgradeDowngradeClose(t *testing.T) {
	h := newHarness(t)
	c, _ := h.client("a")
	d, _ := h.client("b")
	s := h.open(c, "o", 1, AccessRead, DenyWrite)
	// Upgrading our own open is not blocked by our own deny.
	r, err := h.m.Open(OpenArgs{ClientID: c, Owner: []byte("o"), File: 1, Access: AccessWrite})
	wantErr(t, "upgrade", err, nil)
	if r.Access != AccessBoth || r.Deny != DenyWrite {
		t.Fatalf("upgrade modes %+v", r)
	}
	_, err = h.m.OpenDowngrade(c, r.Stateid, AccessBoth, DenyBoth)
	wantErr(t, "downgrade adds deny", err, ErrInval)
	_, err = h.m.OpenDowngrade(c, s, AccessRead, DenyNone)
	wantErr(t, "downgrade with old seqid", err, pnfs.ErrOldStateid)
	ds, err := h.m.OpenDowngrade(c, r.Stateid, AccessRead, DenyNone)
	wantErr(t, "downgrade", err, nil)
	wantErr(t, "write after downgrade", h.m.CheckIO(c, ds, 1, true), pnfs.ErrOpenMode)
	wantErr(t, "read after downgrade", h.m.CheckIO(c, ds, 1, false), nil)
	wantErr(t, "wrong file", h.m.CheckIO(c, ds, 2, false), pnfs.ErrBadStateid)
	// The deny is gone, so another client may write now.
	h.open(d, "o", 1, AccessWrite, DenyNone)
	_, err = h.m.Open(OpenArgs{ClientID: c, Owner: []byte("o"), File: 1, Access: AccessRead, Deny: 4})
	wantErr(t, "bad deny bits", err, ErrInval)
	_, err = h.m.Open(OpenArgs{ClientID: c, Owner: []byte("o"), File: 1, Access: 0})
	wantErr(t, "no access", err, ErrInval)
	cs, err := h.m.Close(c, ds)
	wantErr(t, "close", err, nil)
	_, err = h.m.Close(c, cs)
	wantErr(t, "close twice", err, pnfs.ErrBadStateid)
}

func TestSpecialStateidIO(t *testing.T) {
	tests := []struct {
		deny                 uint32
		anonRead, anonWrite  error
		bypassRead, bypassWr error
	}{
		{DenyNone, nil, nil, nil, nil},
		{DenyRead, ErrLocked, nil, nil, nil},
		{DenyWrite, nil, ErrLocked, nil, ErrLocked},
		{DenyBoth, ErrLocked, ErrLocked, nil, ErrLocked},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("deny%d", tc.deny), func(t *testing.T) {
			h := newHarness(t)
			c, _ := h.client("a")
			h.open(c, "o", 1, AccessBoth, tc.deny)
			wantErr(t, "anon read", h.m.CheckIO(c, AnonymousStateid, 1, false), tc.anonRead)
			wantErr(t, "anon write", h.m.CheckIO(c, AnonymousStateid, 1, true), tc.anonWrite)
			wantErr(t, "bypass read", h.m.CheckIO(c, ReadBypassStateid, 1, false), tc.bypassRead)
			wantErr(t, "bypass write", h.m.CheckIO(c, ReadBypassStateid, 1, true), tc.bypassWr)
			wantErr(t, "other file", h.m.CheckIO(c, AnonymousStateid, 2, true), nil)
		})
	}
}

func TestFreeStateid(t *testing.T) {
	h := newHarness(t)
	c, _ := h.client("a")
	o := h.open(c, "o", 1, AccessBoth, DenyNone)
	l, err := h.m.Lock(LockArgs{ClientID: c, Type: ReadLock, Offset: 0, Length: 10, NewLockOwner: true, OpenStateid: o, LockOwner: []byte("l")})
	wantErr(t, "lock", err, nil)
	if l.Type() != TypeLock {
		t.Fatal(l.Type())
	}
	wantErr(t, "free open", h.m.FreeStateid(c, o), ErrLocksHeld)
	wantErr(t, "free held lock", h.m.FreeStateid(c, l), ErrLocksHeld)
	l, err = h.m.Unlock(c, l, 0, 10)
	wantErr(t, "unlock", err, nil)
	wantErr(t, "io via lock stateid", h.m.CheckIO(c, l, 1, true), nil)
	wantErr(t, "free", h.m.FreeStateid(c, l), nil)
	wantErr(t, "free again", h.m.FreeStateid(c, l), pnfs.ErrBadStateid)
	if errs := h.m.TestStateid(c, []Stateid{o, l}); errs[0] != nil || errs[1] == nil {
		t.Fatalf("TestStateid %v", errs)
	}
}
