package server

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Delegation tests: real server, real TCP, two wiretest clients (each
// with its own back channel, which records the callbacks it gets).

const (
	accRead  = uint32(nfs4.OPEN4_SHARE_ACCESS_READ)
	accWrite = uint32(nfs4.OPEN4_SHARE_ACCESS_WRITE)
	accBoth  = uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
)

// opened is the result of an OPEN.
type opened struct {
	fh    []byte
	sid   nfs4.Stateid4
	deleg nfs4.OpenDelegation4
}

// delegSid returns the delegation stateid of the OPEN, if any.
func (o opened) delegSid() (nfs4.Stateid4, bool) {
	switch o.deleg.DelegationType {
	case nfs4.OPEN_DELEGATE_READ:
		return o.deleg.Read.Stateid, true
	case nfs4.OPEN_DELEGATE_WRITE:
		return o.deleg.Write.Stateid, true
	}
	return nfs4.Stateid4{}, false
}

// openIn opens (creating if asked) name in the root directory.
func openIn(c *wiretest.Client, a openArgs) (*nfs4.COMPOUND4res, error) {
	return c.Compound(opPutRoot(), opOpen(c.ClientID, a), opGetFH())
}

func mustOpen(t *testing.T, c *wiretest.Client, a openArgs) opened {
	t.Helper()
	res := must(t)(openIn(c, a))
	ok := find(t, res, nfs4.OP_OPEN).Opopen.Resok4
	return opened{fh: fhOf(t, res), sid: ok.Stateid, deleg: ok.Delegation}
}

// create makes a an OPEN that creates the file. Unless a states a
// delegation want, it asks for the delegation its access implies: the
// server grants none in an OPEN that creates the file for a client that
// states no preference (TestDelegNotOnCreate).
func create(a openArgs) openArgs {
	a.create, a.mode = true, nfs4.UNCHECKED4
	if a.access&(accRead|accWrite) == 0 {
		a.access |= accRead
	}
	if a.access&nfs4.OPEN4_SHARE_ACCESS_WANT_DELEG_MASK == 0 {
		if a.access&accWrite != 0 {
			a.access |= nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG
		} else {
			a.access |= nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG
		}
	}
	return a
}

// TestDelegNotOnCreate: an OPEN that creates the file gets no delegation
// when the client states no preference (as Linux does), one when it asks;
// the next OPEN of the existing file gets one without asking.
func TestDelegNotOnCreate(t *testing.T) {
	ts := startServer(t, Config{})
	for _, tc := range []struct {
		name   string
		access uint32
		typ    nfs4.OpenDelegationType4
	}{
		{"write, no preference", accBoth, nfs4.OPEN_DELEGATE_NONE},
		{"read, no preference", accRead, nfs4.OPEN_DELEGATE_NONE},
		{"write, wanted", accBoth | nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG, nfs4.OPEN_DELEGATE_WRITE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := ts.client()
			name := "oncreate-" + strings.ReplaceAll(tc.name, " ", "")
			cr := mustOpen(t, a, openArgs{name: name, access: tc.access, create: true, mode: nfs4.UNCHECKED4})
			if cr.deleg.DelegationType != tc.typ {
				t.Fatalf("creating OPEN: delegation %v, want %v", cr.deleg.DelegationType, tc.typ)
			}
			if sid, ok := cr.delegSid(); ok {
				must(t)(a.Compound(opPutFH(cr.fh), opDelegReturn(sid)))
			}
			must(t)(a.Compound(opPutFH(cr.fh), opClose(cr.sid)))
			again := mustOpen(t, a, openArgs{name: name, owner: "again", access: accBoth})
			if again.deleg.DelegationType != nfs4.OPEN_DELEGATE_WRITE {
				t.Fatalf("OPEN of the existing file: delegation %v, want a write delegation", again.deleg.DelegationType)
			}
		})
	}
}

func opDelegReturn(sid nfs4.Stateid4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_DELEGRETURN, Opdelegreturn: &nfs4.DELEGRETURN4args{DelegStateid: sid}}
}

// recalls returns the CB_RECALLs c received.
func recalls(c *wiretest.Client) []nfs4.CBRECALL4args {
	var out []nfs4.CBRECALL4args
	for _, cb := range c.CBCompounds() {
		for _, op := range cb.Argarray {
			if op.Opcbrecall != nil {
				out = append(out, *op.Opcbrecall)
			}
		}
	}
	return out
}

// waitRecall waits for a CB_RECALL of sid at c and checks its filehandle.
func waitRecall(t *testing.T, c *wiretest.Client, sid nfs4.Stateid4, fh []byte) {
	t.Helper()
	if !pollUntil(500, 10*time.Millisecond, func() bool {
		for _, r := range recalls(c) {
			if r.Stateid.Other == sid.Other {
				if !bytes.Equal(r.Fh, fh) {
					t.Fatalf("CB_RECALL fh %x, want %x", r.Fh, fh)
				}
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no CB_RECALL of %x; got %+v", sid.Other, recalls(c))
	}
}

func TestDelegGrant(t *testing.T) {
	ts := startServer(t, Config{})
	a, b := ts.client(), ts.client()
	for _, tc := range []struct {
		name string
		// setup runs first, by client b, on the same file.
		setup   *openArgs
		open    openArgs
		typ     nfs4.OpenDelegationType4
		why     nfs4.WhyNoDelegation4
		errWant nfs4.Nfsstat4
	}{
		{name: "read", open: openArgs{access: accRead}, typ: nfs4.OPEN_DELEGATE_READ},
		{name: "write", open: openArgs{access: accBoth}, typ: nfs4.OPEN_DELEGATE_WRITE},
		{name: "write only", open: openArgs{access: accWrite}, typ: nfs4.OPEN_DELEGATE_WRITE},
		{name: "WANT_NO_DELEG", open: openArgs{access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG},
			typ: nfs4.OPEN_DELEGATE_NONE_EXT, why: nfs4.WND4_NOT_WANTED},
		{name: "WANT_CANCEL", open: openArgs{access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL},
			typ: nfs4.OPEN_DELEGATE_NONE_EXT, why: nfs4.WND4_CANCELLED},
		{name: "WANT_WRITE_DELEG on read open", open: openArgs{access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG},
			typ: nfs4.OPEN_DELEGATE_WRITE},
		{name: "read shared with another reader",
			setup: &openArgs{access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG},
			open:  openArgs{access: accRead}, typ: nfs4.OPEN_DELEGATE_READ},
		{name: "no read deleg while another client writes, no want",
			setup: &openArgs{access: accBoth | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG},
			open:  openArgs{access: accRead}, typ: nfs4.OPEN_DELEGATE_NONE},
		{name: "no read deleg while another client writes, wanted",
			setup: &openArgs{access: accBoth | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG},
			open:  openArgs{access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG},
			typ:   nfs4.OPEN_DELEGATE_NONE_EXT, why: nfs4.WND4_CONTENTION},
		{name: "no write deleg while another client reads",
			setup: &openArgs{access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG},
			open:  openArgs{access: accBoth | nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG},
			typ:   nfs4.OPEN_DELEGATE_NONE_EXT, why: nfs4.WND4_CONTENTION},
		{name: "any falls back to read",
			setup: &openArgs{access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG},
			open:  openArgs{access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_ANY_DELEG},
			typ:   nfs4.OPEN_DELEGATE_READ},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "grant-" + tc.name
			cr := mustOpen(t, b, create(openArgs{name: name, owner: "creator", access: accBoth | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG}))
			must(t)(b.Compound(opPutFH(cr.fh), opClose(cr.sid)))
			if tc.setup != nil {
				s := *tc.setup
				s.name, s.owner = name, "setup"
				mustOpen(t, b, s)
			}
			tc.open.name = name
			got := mustOpen(t, a, tc.open)
			if got.deleg.DelegationType != tc.typ {
				t.Fatalf("delegation %v, want %v", got.deleg.DelegationType, tc.typ)
			}
			if tc.typ == nfs4.OPEN_DELEGATE_NONE_EXT && got.deleg.OdWhynone.OndWhy != tc.why {
				t.Fatalf("why %v, want %v", got.deleg.OdWhynone.OndWhy, tc.why)
			}
			// A second OPEN of the file by the holder gets the same
			// delegation again.
			if sid, ok := got.delegSid(); ok {
				again := mustOpen(t, a, openArgs{name: name, owner: "again", access: accRead})
				if s2, _ := again.delegSid(); s2.Other != sid.Other {
					t.Fatalf("second OPEN: delegation %+v, want the same %x", again.deleg, sid.Other)
				}
				must(t)(a.Compound(opPutFH(got.fh), opDelegReturn(sid)))
				// Returned: the stateid is gone.
				want(t, nfs4.NFS4ERR_BAD_STATEID)(a.Compound(opPutFH(got.fh), opDelegReturn(sid)))
			}
		})
	}
	st := ts.srv.Stats()
	if st.DelegGranted == 0 || st.DelegReturned == 0 {
		t.Errorf("stats %+v: want granted and returned delegations counted", st)
	}
}

// TestDelegOff: with Config.NoDelegations nothing is granted.
func TestDelegOff(t *testing.T) {
	ts := startServer(t, Config{NoDelegations: true})
	a := ts.client()
	for _, acc := range []uint32{accRead, accBoth} {
		// The first creates the file, the second opens it (no preference
		// stated either time).
		got := mustOpen(t, a, openArgs{name: "off", access: acc, create: true, mode: nfs4.UNCHECKED4})
		if got.deleg.DelegationType != nfs4.OPEN_DELEGATE_NONE {
			t.Fatalf("access %d: delegation %+v with delegations off", acc, got.deleg)
		}
	}
	if n := ts.srv.Stats().DelegGranted; n != 0 {
		t.Fatalf("%d delegations granted with delegations off", n)
	}
}

// TestDelegRecall: another client's conflicting operation gets
// NFS4ERR_DELAY while the holder gets CB_RECALL with the delegation's
// stateid and filehandle; after DELEGRETURN the operation succeeds.
func TestDelegRecall(t *testing.T) {
	ts := startServer(t, Config{})
	for _, tc := range []struct {
		name   string
		access uint32 // the holder's OPEN
		op     func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error)
	}{
		{"OPEN for write vs read", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return openIn(b, openArgs{name: name, access: accWrite})
		}},
		{"OPEN for read vs write", accBoth, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return openIn(b, openArgs{name: name, access: accRead})
		}},
		{"OPEN denying writes vs read", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return openIn(b, openArgs{name: name, access: accRead, deny: nfs4.OPEN4_SHARE_DENY_WRITE})
		}},
		{"REMOVE", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return b.Compound(opPutRoot(), opRemove(name))
		}},
		{"RENAME", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return b.Compound(opPutRoot(), opSaveFH(), opRename(name, name+".moved"))
		}},
		{"RENAME over it", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			must(t)(openIn(b, create(openArgs{name: name + ".other", access: accRead | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG})))
			return b.Compound(opPutRoot(), opSaveFH(), opRename(name+".other", name))
		}},
		{"SETATTR mode", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return b.Compound(opPutFH(fh), opSetattr(nfs4.Stateid4{}, fattr(aMode(0o600))))
		}},
		{"SETATTR size", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return b.Compound(opPutFH(fh), opSetattr(nfs4.Stateid4{}, fattr(aSize(0))))
		}},
		{"WRITE anonymous", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return b.Compound(opPutFH(fh), opWrite(nfs4.Stateid4{}, 0, nfs4.FILE_SYNC4, []byte("x")))
		}},
		{"READ anonymous vs write", accBoth, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return b.Compound(opPutFH(fh), opRead(nfs4.Stateid4{}, 0, 10))
		}},
		{"LINK", accRead, func(b *wiretest.Client, name string, fh []byte) (*nfs4.COMPOUND4res, error) {
			return b.Compound(opPutFH(fh), opSaveFH(), opPutRoot(), opLink(name+".link"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := ts.client(), ts.client()
			name := "recall-" + tc.name
			held := mustOpen(t, a, create(openArgs{name: name, access: tc.access}))
			sid, ok := held.delegSid()
			if !ok {
				t.Fatalf("no delegation granted: %+v", held.deleg)
			}
			want(t, nfs4.NFS4ERR_DELAY)(tc.op(b, name, held.fh))
			waitRecall(t, a, sid, held.fh)
			// Still outstanding: the retry waits too.
			want(t, nfs4.NFS4ERR_DELAY)(tc.op(b, name, held.fh))
			must(t)(a.Compound(opPutFH(held.fh), opDelegReturn(sid)))
			must(t)(tc.op(b, name, held.fh))
		})
	}
}

// TestDelegHolderOwnOps: the holder's own operations recall nothing.
func TestDelegHolderOwnOps(t *testing.T) {
	ts := startServer(t, Config{})
	a := ts.client()
	held := mustOpen(t, a, create(openArgs{name: "own", access: accRead}))
	if _, ok := held.delegSid(); !ok {
		t.Fatalf("no delegation: %+v", held.deleg)
	}
	must(t)(openIn(a, openArgs{name: "own", owner: "writer", access: accBoth}))
	must(t)(a.Compound(opPutFH(held.fh), opSetattr(nfs4.Stateid4{}, fattr(aMode(0o640)))))
	must(t)(a.Compound(opPutRoot(), opSaveFH(), opRename("own", "own2")))
	must(t)(a.Compound(opPutRoot(), opRemove("own2")))
	if r := recalls(a); len(r) != 0 {
		t.Fatalf("holder got recalls for its own operations: %+v", r)
	}
}

// TestDelegClaimCur: during a recall the holder turns its local opens into
// server opens with CLAIM_DELEG_CUR_FH and CLAIM_DELEGATE_CUR, then
// returns the delegation.
func TestDelegClaimCur(t *testing.T) {
	ts := startServer(t, Config{})
	a, b := ts.client(), ts.client()
	held := mustOpen(t, a, create(openArgs{name: "claim", access: accBoth}))
	sid, ok := held.delegSid()
	if !ok || held.deleg.DelegationType != nfs4.OPEN_DELEGATE_WRITE {
		t.Fatalf("no write delegation: %+v", held.deleg)
	}
	want(t, nfs4.NFS4ERR_DELAY)(openIn(b, openArgs{name: "claim", access: accRead}))
	waitRecall(t, a, sid, held.fh)
	byFH := &nfs4.OPEN4args{ShareAccess: accBoth, Owner: nfs4.OpenOwner4{Clientid: a.ClientID, Owner: []byte("local1")},
		Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_DELEG_CUR_FH, OcDelegateStateid: &sid}}
	res := must(t)(a.Compound(opPutFH(held.fh), nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: byFH}))
	if d := find(t, res, nfs4.OP_OPEN).Opopen.Resok4.Delegation; d.DelegationType != nfs4.OPEN_DELEGATE_NONE {
		t.Fatalf("CLAIM_DELEG_CUR_FH delegation %+v, want none", d)
	}
	byName := &nfs4.OPEN4args{ShareAccess: accRead, Owner: nfs4.OpenOwner4{Clientid: a.ClientID, Owner: []byte("local2")},
		Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_DELEGATE_CUR, DelegateCurInfo: &nfs4.OpenClaimDelegateCur4{DelegateStateid: sid, File: []byte("claim")}}}
	must(t)(a.Compound(opPutRoot(), nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: byName}))
	// Another client cannot claim under it.
	steal := *byFH
	steal.Owner.Clientid = b.ClientID
	want(t, nfs4.NFS4ERR_BAD_STATEID)(b.Compound(opPutFH(held.fh), nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &steal}))
	prev := &nfs4.OPEN4args{ShareAccess: accRead, Owner: nfs4.OpenOwner4{Clientid: a.ClientID, Owner: []byte("p")},
		Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_DELEG_PREV_FH}}
	want(t, nfs4.NFS4ERR_NOTSUPP)(a.Compound(opPutFH(held.fh), nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: prev}))
	must(t)(a.Compound(opPutFH(held.fh), opDelegReturn(sid)))
	must(t)(openIn(b, openArgs{name: "claim", access: accRead}))
}

// TestDelegStateidIO: READ, WRITE and SETATTR of the size under a
// delegation stateid.
func TestDelegStateidIO(t *testing.T) {
	ts := startServer(t, Config{})
	a := ts.client()
	w := mustOpen(t, a, create(openArgs{name: "wio", access: accBoth}))
	wsid, ok := w.delegSid()
	if !ok || w.deleg.DelegationType != nfs4.OPEN_DELEGATE_WRITE {
		t.Fatalf("no write delegation: %+v", w.deleg)
	}
	must(t)(a.Compound(opPutFH(w.fh), opWrite(wsid, 0, nfs4.FILE_SYNC4, []byte("hello"))))
	res := must(t)(a.Compound(opPutFH(w.fh), opRead(wsid, 0, 10)))
	if got := find(t, res, nfs4.OP_READ).Opread.Resok4.Data; string(got) != "hello" {
		t.Fatalf("READ under the delegation: %q", got)
	}
	must(t)(a.Compound(opPutFH(w.fh), opSetattr(wsid, fattr(aSize(2)))))

	r := mustOpen(t, a, create(openArgs{name: "rio", access: accRead}))
	rsid, ok := r.delegSid()
	if !ok || r.deleg.DelegationType != nfs4.OPEN_DELEGATE_READ {
		t.Fatalf("no read delegation: %+v", r.deleg)
	}
	must(t)(a.Compound(opPutFH(r.fh), opRead(rsid, 0, 10)))
	want(t, nfs4.NFS4ERR_OPENMODE)(a.Compound(opPutFH(r.fh), opWrite(rsid, 0, nfs4.FILE_SYNC4, []byte("x"))))
	want(t, nfs4.NFS4ERR_OPENMODE)(a.Compound(opPutFH(r.fh), opSetattr(rsid, fattr(aSize(0)))))
	// Of another file, or another client: bad stateid.
	want(t, nfs4.NFS4ERR_BAD_STATEID)(a.Compound(opPutFH(r.fh), opRead(wsid, 0, 10)))
	b := ts.client()
	want(t, nfs4.NFS4ERR_BAD_STATEID)(b.Compound(opPutFH(r.fh), opRead(rsid, 0, 10)))
}

func seqFlags(t *testing.T, res *nfs4.COMPOUND4res) uint32 {
	t.Helper()
	return find(t, res, nfs4.OP_SEQUENCE).Opsequence.SrResok4.SrStatusFlags
}

// TestDelegRevoke: a holder that ignores the recall loses the delegation
// after a lease: SEQUENCE flags it, its use fails with
// NFS4ERR_DELEG_REVOKED, TEST_STATEID reports it, FREE_STATEID clears it.
func TestDelegRevoke(t *testing.T) {
	ts := startServer(t, Config{Lease: time.Second})
	a, b := ts.client(), ts.client()
	held := mustOpen(t, a, create(openArgs{name: "revoke", access: accRead}))
	sid, ok := held.delegSid()
	if !ok {
		t.Fatalf("no delegation: %+v", held.deleg)
	}
	want(t, nfs4.NFS4ERR_DELAY)(openIn(b, openArgs{name: "revoke", access: accWrite}))
	waitRecall(t, a, sid, held.fh)
	// a keeps its lease but does not return the delegation; b retries.
	var flags uint32
	if !pollUntil(200, 50*time.Millisecond, func() bool {
		flags = seqFlags(t, must(t)(a.Compound()))
		res, err := openIn(b, openArgs{name: "revoke", access: accWrite})
		return err == nil && res.Status == nfs4.NFS4_OK && flags&nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED != 0
	}) {
		t.Fatalf("delegation not revoked (last SEQUENCE flags %#x)", flags)
	}
	want(t, nfs4.NFS4ERR_DELEG_REVOKED)(a.Compound(opPutFH(held.fh), opRead(sid, 0, 1)))
	res := must(t)(a.Compound(nfs4.NfsArgop4{Argop: nfs4.OP_TEST_STATEID, OptestStateid: &nfs4.TESTSTATEID4args{TsStateids: []nfs4.Stateid4{sid}}}))
	if codes := find(t, res, nfs4.OP_TEST_STATEID).OptestStateid.TsrResok4.TsrStatusCodes; len(codes) != 1 || codes[0] != nfs4.NFS4ERR_DELEG_REVOKED {
		t.Fatalf("TEST_STATEID: %v", codes)
	}
	must(t)(a.Compound(nfs4.NfsArgop4{Argop: nfs4.OP_FREE_STATEID, OpfreeStateid: &nfs4.FREESTATEID4args{FsaStateid: sid}}))
	if f := seqFlags(t, must(t)(a.Compound())); f&nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED != 0 {
		t.Fatalf("SEQUENCE flags %#x after FREE_STATEID", f)
	}
	if n := ts.srv.Stats().DelegRevoked; n != 1 {
		t.Fatalf("%d delegations revoked, want 1", n)
	}
}

// TestDelegDestroyClientBusy: DESTROY_CLIENTID with a delegation held is
// NFS4ERR_CLIENTID_BUSY.
func TestDelegDestroyClientBusy(t *testing.T) {
	ts := startServer(t, Config{})
	a := ts.client()
	held := mustOpen(t, a, create(openArgs{name: "busy", access: accRead}))
	sid, ok := held.delegSid()
	if !ok {
		t.Fatalf("no delegation: %+v", held.deleg)
	}
	must(t)(a.Compound(opPutFH(held.fh), opClose(held.sid)))
	ctx := testCtx(t)
	must(t)(a.Sessionless(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_DESTROY_SESSION, OpdestroySession: &nfs4.DESTROYSESSION4args{DsaSessionid: a.SessionID}}))
	want(t, nfs4.NFS4ERR_CLIENTID_BUSY)(a.Sessionless(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_DESTROY_CLIENTID, OpdestroyClientid: &nfs4.DESTROYCLIENTID4args{DcaClientid: a.ClientID}}))
	_ = sid
}

// TestWantDelegation: WANT_DELEGATION grants without an OPEN, or says why
// not.
func TestWantDelegation(t *testing.T) {
	ts := startServer(t, Config{})
	a, b := ts.client(), ts.client()
	f := mustOpen(t, b, create(openArgs{name: "want", access: accBoth | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG}))
	must(t)(b.Compound(opPutFH(f.fh), opClose(f.sid)))
	wd := func(want uint32, claim nfs4.OpenClaimType4) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_WANT_DELEGATION, OpwantDelegation: &nfs4.WANTDELEGATION4args{WdaWant: want, WdaClaim: nfs4.DelegClaim4{DcClaim: claim}}}
	}
	for _, tc := range []struct {
		name  string
		fh    func() []byte
		want  uint32
		claim nfs4.OpenClaimType4
		st    nfs4.Nfsstat4
		typ   nfs4.OpenDelegationType4
		why   nfs4.WhyNoDelegation4
	}{
		{"read", func() []byte { return f.fh }, nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG, nfs4.CLAIM_FH, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_READ, 0},
		{"no deleg", func() []byte { return f.fh }, nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG, nfs4.CLAIM_FH, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_NOT_WANTED},
		{"cancel", func() []byte { return f.fh }, nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL, nfs4.CLAIM_FH, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_CANCELLED},
		{"directory", func() []byte { return fhOf(t, must(t)(a.Compound(opPutRoot(), opGetFH()))) }, nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG, nfs4.CLAIM_FH, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_IS_DIR},
		{"upgrade", func() []byte { return f.fh }, nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG, nfs4.CLAIM_FH, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_NOT_SUPP_UPGRADE},
		{"no preference", func() []byte { return f.fh }, nfs4.OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE, nfs4.CLAIM_FH, nfs4.NFS4ERR_INVAL, 0, 0},
		{"previous outside grace", func() []byte { return f.fh }, nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG, nfs4.CLAIM_PREVIOUS, nfs4.NFS4ERR_NO_GRACE, 0, 0},
		{"deleg prev", func() []byte { return f.fh }, nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG, nfs4.CLAIM_DELEG_PREV_FH, nfs4.NFS4ERR_NOTSUPP, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := a.Compound(opPutFH(tc.fh()), wd(tc.want, tc.claim))
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.st {
				t.Fatalf("WANT_DELEGATION: %s, want %s", summary(res), statName(tc.st))
			}
			if tc.st != nfs4.NFS4_OK {
				return
			}
			d := find(t, res, nfs4.OP_WANT_DELEGATION).OpwantDelegation.WdrResok4
			if d.DelegationType != tc.typ {
				t.Fatalf("delegation %+v, want %v", d, tc.typ)
			}
			if tc.typ == nfs4.OPEN_DELEGATE_NONE_EXT && d.OdWhynone.OndWhy != tc.why {
				t.Fatalf("why %v, want %v", d.OdWhynone.OndWhy, tc.why)
			}
		})
	}
}

// TestDelegCBGetattr: another client's GETATTR of size or change of a
// file under a write delegation asks the holder with CB_GETATTR and
// reports its size, with a change attribute past the server's; a holder
// that cannot answer has the delegation recalled instead.
func TestDelegCBGetattr(t *testing.T) {
	ts := startServer(t, Config{})
	a, b := ts.client(), ts.client()
	var answer atomic.Bool // a answers CB_GETATTR
	a.CBGetattr = func(args *nfs4.CBGETATTR4args) nfs4.CBGETATTR4res {
		if !answer.Load() {
			return nfs4.CBGETATTR4res{Status: nfs4.NFS4ERR_BADHANDLE}
		}
		e := xdr.NewEncoder(16)
		e.Uint64(777)  // change: the holder's
		e.Uint64(1234) // size: it wrote in its cache
		return nfs4.CBGETATTR4res{Status: nfs4.NFS4_OK, Resok4: &nfs4.CBGETATTR4resok{ObjAttributes: nfs4.Fattr4{
			Attrmask: makeBitmap([]uint32{nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE}), AttrVals: e.Bytes()}}}
	}
	answer.Store(true)
	held := mustOpen(t, a, create(openArgs{name: "cbgetattr", access: accBoth}))
	sid, ok := held.delegSid()
	if !ok || held.deleg.DelegationType != nfs4.OPEN_DELEGATE_WRITE {
		t.Fatalf("no write delegation: %+v", held.deleg)
	}
	before := attrsOf(t, must(t)(a.Compound(opPutFH(held.fh), opGetattr(nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE))))
	got := attrsOf(t, must(t)(b.Compound(opPutFH(held.fh), opGetattr(nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE))))
	if got[nfs4.FATTR4_SIZE] != uint64(1234) {
		t.Fatalf("size %v, want the holder's 1234", got[nfs4.FATTR4_SIZE])
	}
	if got[nfs4.FATTR4_CHANGE] == before[nfs4.FATTR4_CHANGE] {
		t.Fatalf("change %v did not move past the server's", got[nfs4.FATTR4_CHANGE])
	}
	if len(recalls(a)) != 0 {
		t.Fatal("recall sent although CB_GETATTR was answered")
	}
	answer.Store(false)
	want(t, nfs4.NFS4ERR_DELAY)(b.Compound(opPutFH(held.fh), opGetattr(nfs4.FATTR4_SIZE)))
	waitRecall(t, a, sid, held.fh)
	must(t)(a.Compound(opPutFH(held.fh), opDelegReturn(sid)))
	must(t)(b.Compound(opPutFH(held.fh), opGetattr(nfs4.FATTR4_SIZE)))
}

// FuzzDecodeSizeChange: the attributes of a CB_GETATTR reply come from a
// client; decoding them never panics and accepts only size and change.
func FuzzDecodeSizeChange(f *testing.F) {
	e := xdr.NewEncoder(16)
	e.Uint64(7)
	e.Uint64(4096)
	f.Add(uint32(1<<nfs4.FATTR4_CHANGE|1<<nfs4.FATTR4_SIZE), uint32(0), e.Bytes())
	f.Add(uint32(1<<nfs4.FATTR4_SIZE), uint32(0), e.Bytes()[:8])
	f.Add(uint32(1<<nfs4.FATTR4_CHANGE|1<<nfs4.FATTR4_SIZE), uint32(1), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, w0, w1 uint32, vals []byte) {
		size, change, ok := decodeSizeChange(&nfs4.Fattr4{Attrmask: nfs4.Bitmap4{w0, w1}, AttrVals: vals})
		if !ok {
			return
		}
		if w0 != 1<<nfs4.FATTR4_CHANGE|1<<nfs4.FATTR4_SIZE || w1 != 0 || len(vals) < 16 {
			t.Fatalf("accepted mask %#x %#x with %d bytes", w0, w1, len(vals))
		}
		d := xdr.NewDecoder(vals)
		if c, s := d.Uint64(), d.Uint64(); c != change || s != size {
			t.Fatalf("decoded %d/%d, want %d/%d", size, change, s, c)
		}
	})
}

// TestDelegMetrics: the collector exports delegation events and the
// number outstanding (and the time spent per operation).
func TestDelegMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	ts := startServer(t, Config{Metrics: reg})
	a := ts.client()
	held := mustOpen(t, a, create(openArgs{name: "metrics", access: accRead}))
	if _, ok := held.delegSid(); !ok {
		t.Fatalf("no delegation: %+v", held.deleg)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "/" + l.GetValue()
			}
			if c := m.GetCounter(); c != nil {
				got[key] = c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				got[key] = g.GetValue()
			}
		}
	}
	for key, want := range map[string]float64{
		"shoal_nfs_delegation_events_total/granted":  1,
		"shoal_nfs_delegation_events_total/returned": 0,
		"shoal_nfs_delegations":                      1,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
	// Every operation that ran has its time counted, and OPEN's (a
	// durable create) took some.
	if v := got["shoal_nfs_op_seconds_total/OPEN"]; v <= 0 {
		t.Errorf("shoal_nfs_op_seconds_total/OPEN = %v, want > 0", v)
	}
	if _, ok := got["shoal_nfs_op_seconds_total/SEQUENCE"]; !ok {
		t.Error("no shoal_nfs_op_seconds_total/SEQUENCE")
	}
}

// TestDelegReclaim: after a server restart, a client reclaims its open
// with CLAIM_PREVIOUS naming the delegation it held, and gets the
// delegation back (the Linux client keeps locks under a delegation
// without the server seeing them, and reclaims none of them otherwise);
// a conflicting open after grace recalls it as usual.
func TestDelegReclaim(t *testing.T) {
	ts := startServer(t, Config{Lease: 30 * time.Second})
	ctx := testCtx(t)
	const owner = "deleg-reclaim"
	a := ts.clientOwner(owner)
	held := mustOpen(t, a, create(openArgs{name: "r", owner: "o1", access: accBoth}))
	if held.deleg.DelegationType != nfs4.OPEN_DELEGATE_WRITE {
		t.Fatalf("no write delegation: %+v", held.deleg)
	}

	ts.restart()

	a2 := ts.dial()
	if _, err := a2.ExchangeID(ctx, []byte(owner), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := a2.CreateSession(ctx, true); err != nil {
		t.Fatal(err)
	}
	reclaim := opOpen(a2.ClientID, openArgs{owner: "o1", access: accBoth, claim: nfs4.CLAIM_PREVIOUS})
	dt := nfs4.OPEN_DELEGATE_WRITE
	reclaim.Opopen.Claim.DelegateType = &dt
	res := must(t)(a2.Compound(opPutFH(held.fh), reclaim))
	d := find(t, res, nfs4.OP_OPEN).Opopen.Resok4.Delegation
	if d.DelegationType != nfs4.OPEN_DELEGATE_WRITE || d.Write.Recall {
		t.Fatalf("reclaimed delegation %+v, want WRITE without recall", d)
	}
	sid := d.Write.Stateid
	must(t)(a2.Compound(nfs4.NfsArgop4{Argop: nfs4.OP_RECLAIM_COMPLETE, OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{}}))

	b := ts.reclaiming()
	must(t)(b.Compound(nfs4.NfsArgop4{Argop: nfs4.OP_RECLAIM_COMPLETE, OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{}}))
	want(t, nfs4.NFS4ERR_DELAY)(openIn(b, openArgs{name: "r", access: accRead}))
	waitRecall(t, a2, sid, held.fh)
	must(t)(a2.Compound(opPutFH(held.fh), opDelegReturn(sid)))
	must(t)(openIn(b, openArgs{name: "r", access: accRead}))
}
