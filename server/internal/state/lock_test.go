package state

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/shoalfs/shoal/pnfs"
)

// ranges renders a file's held locks as "owner:type[first-last]" in order.
func ranges(m *Manager, f FileID) string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	fs := m.files[f]
	if fs == nil {
		return ""
	}
	var out []string
	for _, r := range fs.locks {
		last := fmt.Sprint(r.last)
		if r.length() == LengthToEOF {
			last = "EOF"
		}
		out = append(out, fmt.Sprintf("%s:%s[%d-%s]", r.ls.owner.owner, r.typ, r.first, last))
	}
	return strings.Join(out, " ")
}

func TestLockConflictMatrix(t *testing.T) {
	type lk struct {
		typ      LockType
		off, len uint64
	}
	tests := []struct {
		held, req lk
		sameOwner bool
		conflict  bool
	}{
		{lk{ReadLock, 0, 10}, lk{ReadLock, 5, 10}, false, false},
		{lk{ReadLock, 0, 10}, lk{WriteLock, 5, 10}, false, true},
		{lk{WriteLock, 0, 10}, lk{ReadLock, 5, 10}, false, true},
		{lk{WriteLock, 0, 10}, lk{WriteLock, 9, 1}, false, true},
		{lk{WriteLock, 0, 10}, lk{WriteLock, 10, 1}, false, false},
		{lk{WriteLock, 100, LengthToEOF}, lk{ReadLock, 1 << 62, 1}, false, true},
		{lk{WriteLock, 100, LengthToEOF}, lk{ReadLock, 0, 100}, false, false},
		{lk{WriteLock, 0, 10}, lk{WriteWLock, 0, 10}, false, true},
		{lk{ReadLock, 0, 10}, lk{ReadWLock, 0, 10}, false, false},
		{lk{WriteLock, 0, 10}, lk{WriteLock, 0, 10}, true, false},
		{lk{ReadLock, 0, 10}, lk{WriteLock, 0, 10}, true, false},
	}
	for _, tc := range tests {
		name := fmt.Sprintf("%v%d+%d/%v%d+%d/same=%v", tc.held.typ, tc.held.off, tc.held.len, tc.req.typ, tc.req.off, tc.req.len, tc.sameOwner)
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			a, _ := h.client("a")
			b, _ := h.client("b")
			oa := h.open(a, "o", 1, AccessBoth, DenyNone)
			ob := h.open(b, "o", 1, AccessBoth, DenyNone)
			la, err := h.m.Lock(LockArgs{ClientID: a, Type: tc.held.typ, Offset: tc.held.off, Length: tc.held.len, NewLockOwner: true, OpenStateid: oa, LockOwner: []byte("la")})
			wantErr(t, "held", err, nil)
			args := LockArgs{ClientID: b, Type: tc.req.typ, Offset: tc.req.off, Length: tc.req.len, NewLockOwner: true, OpenStateid: ob, LockOwner: []byte("lb")}
			owner := LockOwner{ClientID: b, Owner: []byte("lb")}
			if tc.sameOwner {
				args = LockArgs{ClientID: a, Type: tc.req.typ, Offset: tc.req.off, Length: tc.req.len, LockStateid: la}
				owner = LockOwner{ClientID: a, Owner: []byte("la")}
			}
			var want error
			if tc.conflict {
				want = ErrDenied
			}
			// LOCKT agrees with LOCK, without creating state.
			err = h.m.LockTest(LockTestArgs{ClientID: owner.ClientID, File: 1, Type: tc.req.typ, Offset: tc.req.off, Length: tc.req.len, LockOwner: owner.Owner})
			wantErr(t, "LOCKT", err, want)
			_, err = h.m.Lock(args)
			wantErr(t, "LOCK", err, want)
			if tc.conflict {
				var d *LockDeniedError
				if !errors.As(err, &d) {
					t.Fatalf("not a LockDeniedError: %T", err)
				}
				heldLen := tc.held.len
				if d.Offset != tc.held.off || d.Length != heldLen || d.Type != tc.held.typ.norm(t) || d.Owner.ClientID != a || string(d.Owner.Owner) != "la" {
					t.Fatalf("denied = %+v", d)
				}
				// A denied new lock-owner leaves no lock stateid behind.
				h.m.mu.RLock()
				n := len(h.m.clients[b].lockOwners)
				h.m.mu.RUnlock()
				if n != 0 {
					t.Fatalf("lock-owner state left after denial")
				}
			}
		})
	}
}

func (lt LockType) norm(t *testing.T) LockType {
	n, err := lt.normalize()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLockSplitMergeUpgrade(t *testing.T) {
	h := newHarness(t)
	a, _ := h.client("a")
	o := h.open(a, "o", 1, AccessBoth, DenyNone)
	ls, err := h.m.Lock(LockArgs{ClientID: a, Type: ReadLock, Offset: 0, Length: 100, NewLockOwner: true, OpenStateid: o, LockOwner: []byte("x")})
	wantErr(t, "first", err, nil)
	steps := []struct {
		op        string // lock-r, lock-w, unlock
		off, len  uint64
		want      string
		wantSeqid uint32
	}{
		{"lock-w", 40, 20, "x:read[0-39] x:write[40-59] x:read[60-99]", 2},
		{"lock-w", 60, 10, "x:read[0-39] x:write[40-69] x:read[70-99]", 3},
		{"unlock", 45, 5, "x:read[0-39] x:write[40-44] x:write[50-69] x:read[70-99]", 4},
		{"lock-r", 0, LengthToEOF, "x:read[0-EOF]", 5},
		{"unlock", 10, 10, "x:read[0-9] x:read[20-EOF]", 6},
		{"lock-r", 10, 10, "x:read[0-EOF]", 7},
		{"lock-w", 200, 10, "x:read[0-199] x:write[200-209] x:read[210-EOF]", 8},
		{"unlock", 0, LengthToEOF, "", 9},
	}
	for i, st := range steps {
		switch st.op {
		case "unlock":
			ls, err = h.m.Unlock(a, ls, st.off, st.len)
		default:
			typ := ReadLock
			if st.op == "lock-w" {
				typ = WriteLock
			}
			ls, err = h.m.Lock(LockArgs{ClientID: a, Type: typ, Offset: st.off, Length: st.len, LockStateid: ls})
		}
		wantErr(t, fmt.Sprintf("step %d", i), err, nil)
		if got := ranges(h.m, 1); got != st.want {
			t.Fatalf("step %d: ranges %q, want %q", i, got, st.want)
		}
		if ls.Seqid != st.wantSeqid {
			t.Fatalf("step %d: seqid %d, want %d", i, ls.Seqid, st.wantSeqid)
		}
	}
}

func TestLockArgErrors(t *testing.T) {
	h := newHarness(t)
	a, _ := h.client("a")
	ro := h.open(a, "r", 1, AccessRead, DenyNone)
	wo := h.open(a, "w", 2, AccessWrite, DenyNone)
	tests := []struct {
		name string
		args LockArgs
		want error
	}{
		{"zero length", LockArgs{Type: ReadLock, Length: 0, NewLockOwner: true, OpenStateid: ro, LockOwner: []byte("l")}, ErrInval},
		{"overflow", LockArgs{Type: ReadLock, Offset: 1 << 63, Length: 1<<63 + 1, NewLockOwner: true, OpenStateid: ro, LockOwner: []byte("l")}, ErrInval},
		{"exact end", LockArgs{Type: ReadLock, Offset: 1 << 63, Length: 1 << 63, NewLockOwner: true, OpenStateid: ro, LockOwner: []byte("l")}, nil},
		{"bad type", LockArgs{Type: 9, Length: 1, NewLockOwner: true, OpenStateid: ro, LockOwner: []byte("l")}, ErrInval},
		{"write lock on read open", LockArgs{Type: WriteLock, Length: 1, NewLockOwner: true, OpenStateid: ro, LockOwner: []byte("l2")}, pnfs.ErrOpenMode},
		{"read lock on write open", LockArgs{Type: ReadLock, Length: 1, NewLockOwner: true, OpenStateid: wo, LockOwner: []byte("l3")}, pnfs.ErrOpenMode},
		{"open stateid as lock stateid", LockArgs{Type: ReadLock, Length: 1, LockStateid: ro}, pnfs.ErrBadStateid},
		{"empty lock-owner", LockArgs{Type: ReadLock, Length: 1, NewLockOwner: true, OpenStateid: ro}, ErrInval},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.args.ClientID = a
			_, err := h.m.Lock(tc.args)
			wantErr(t, "Lock", err, tc.want)
		})
	}
	_, err := h.m.Unlock(a, ro, 0, 1)
	wantErr(t, "unlock with open stateid", err, pnfs.ErrBadStateid)
}

func TestCloseWithLocksHeld(t *testing.T) {
	h := newHarness(t)
	a, _ := h.client("a")
	b, _ := h.client("b")
	o := h.open(a, "o", 1, AccessBoth, DenyNone)
	ls, err := h.m.Lock(LockArgs{ClientID: a, Type: WriteLock, Offset: 0, Length: 10, NewLockOwner: true, OpenStateid: o, LockOwner: []byte("l")})
	wantErr(t, "lock", err, nil)
	_, err = h.m.Close(a, o)
	wantErr(t, "close with locks", err, ErrLocksHeld)
	ls, err = h.m.Unlock(a, ls, 0, 10)
	wantErr(t, "unlock", err, nil)
	_, err = h.m.Close(a, o)
	wantErr(t, "close", err, nil)
	// The lock stateid went away with the open.
	wantErr(t, "lock stateid after close", h.m.TestStateid(a, []Stateid{ls})[0], pnfs.ErrBadStateid)
	h.m.mu.RLock()
	nfiles, nstates := len(h.m.files), len(h.m.states)
	h.m.mu.RUnlock()
	if nfiles != 0 || nstates != 0 {
		t.Fatalf("leftover state: %d files %d stateids", nfiles, nstates)
	}
	// LOCKT by an owner without any state.
	ob := h.open(b, "o", 1, AccessBoth, DenyNone)
	wantErr(t, "LOCKT free", h.m.LockTest(LockTestArgs{ClientID: b, File: 1, Type: WriteLock, Length: LengthToEOF, LockOwner: []byte("nobody")}), nil)
	_, err = h.m.Lock(LockArgs{ClientID: b, Type: ReadLock, Offset: 5, Length: 1, NewLockOwner: true, OpenStateid: ob, LockOwner: []byte("l")})
	wantErr(t, "lock b", err, nil)
	err = h.m.LockTest(LockTestArgs{ClientID: a, File: 1, Type: WriteLock, Length: LengthToEOF, LockOwner: []byte("l")})
	var d *LockDeniedError
	if !errors.As(err, &d) || d.Offset != 5 || d.Length != 1 || d.Type != ReadLock || d.Owner.ClientID != b {
		t.Fatalf("LOCKT: %v", err)
	}
	if !slices.Equal(d.Owner.Owner, []byte("l")) {
		t.Fatal(d.Owner)
	}
}
