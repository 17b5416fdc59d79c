package server

import (
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
)

func TestShareReservations(t *testing.T) {
	ts := startServer(t, Config{NoDelegations: true}) // share reservations and locks between clients, not delegations (deleg_test.go)
	c1, c2 := ts.client(), ts.client()
	const (
		r  = nfs4.OPEN4_SHARE_ACCESS_READ
		w  = nfs4.OPEN4_SHARE_ACCESS_WRITE
		rw = nfs4.OPEN4_SHARE_ACCESS_BOTH
	)
	sid, fh := openFile(t, c1, "f", rw, nfs4.OPEN4_SHARE_DENY_WRITE, "o1")
	open2 := func(access, deny uint32) nfs4.NfsArgop4 {
		return opOpen(c2.ClientID, openArgs{name: "f", owner: "o2", access: access, deny: deny})
	}
	want(t, nfs4.NFS4ERR_SHARE_DENIED)(c2.Compound(opPutRoot(), open2(w, 0)))
	// Reading is still allowed, but not while denying what c1 holds.
	want(t, nfs4.NFS4ERR_SHARE_DENIED)(c2.Compound(opPutRoot(), open2(r, nfs4.OPEN4_SHARE_DENY_READ)))
	r2 := must(t)(c2.Compound(opPutRoot(), open2(r, 0)))
	must(t)(c2.Compound(opPutFH(fh), opClose(openSid(t, r2))))

	// OPEN_DOWNGRADE to read/deny-none lifts the deny.
	res := must(t)(c1.Compound(opPutFH(fh), opOpenDowngrade(sid, r, 0)))
	nsid := res.Resarray[2].OpopenDowngrade.Resok4.OpenStateid
	if nsid.Other != sid.Other || nsid.Seqid <= sid.Seqid {
		t.Errorf("downgraded stateid %+v from %+v", nsid, sid)
	}
	// Downgrading to access not held is INVAL.
	want(t, nfs4.NFS4ERR_INVAL)(c1.Compound(opPutFH(fh), opOpenDowngrade(nsid, rw, 0)))
	// The old seqid is now OLD_STATEID; writing through a read open is OPENMODE.
	want(t, nfs4.NFS4ERR_OLD_STATEID)(c1.Compound(opPutFH(fh), opRead(sid, 0, 1)))
	want(t, nfs4.NFS4ERR_OPENMODE)(c1.Compound(opPutFH(fh), opWrite(nsid, 0, nfs4.UNSTABLE4, []byte("x"))))
	r2 = must(t)(c2.Compound(opPutRoot(), open2(w, 0)))
	sid2 := openSid(t, r2)
	must(t)(c2.Compound(opPutFH(fh), opWrite(sid2, 0, nfs4.UNSTABLE4, []byte("x"))))

	res = must(t)(c1.Compound(opPutFH(fh), opClose(nsid)))
	// A closed stateid is gone.
	want(t, nfs4.NFS4ERR_BAD_STATEID)(c1.Compound(opPutFH(fh), opRead(nsid, 0, 1)))
	want(t, nfs4.NFS4ERR_BAD_STATEID)(c1.Compound(opPutFH(fh), opClose(nsid)))
	must(t)(c2.Compound(opPutFH(fh), opClose(sid2)))
}

func TestLocks(t *testing.T) {
	ts := startServer(t, Config{NoDelegations: true}) // share reservations and locks between clients, not delegations (deleg_test.go)
	c1, c2 := ts.client(), ts.client()
	rw := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
	sid1, fh := openFile(t, c1, "f", rw, 0, "o1")
	res := must(t)(c2.Compound(opPutRoot(), opOpen(c2.ClientID, openArgs{name: "f", owner: "o2", access: rw})))
	sid2 := openSid(t, res)

	res = must(t)(c1.Compound(opPutFH(fh), opLockNew(nfs4.WRITE_LT, 100, 50, sid1, c1.ClientID, "lo1")))
	lsid1 := res.Resarray[2].Oplock.Resok4.LockStateid
	if lsid1.Other == sid1.Other {
		t.Error("lock stateid equals open stateid")
	}

	// Conflicting lock from the other client: DENIED with the holder.
	res = want(t, nfs4.NFS4ERR_DENIED)(c2.Compound(opPutFH(fh), opLockNew(nfs4.READ_LT, 120, 10, sid2, c2.ClientID, "lo2")))
	d := res.Resarray[2].Oplock.Denied
	if d == nil || d.Offset != 100 || d.Length != 50 || d.Locktype != nfs4.WRITE_LT ||
		d.Owner.Clientid != c1.ClientID || string(d.Owner.Owner) != "lo1" {
		t.Errorf("LOCK4denied = %+v", d)
	}
	// LOCKT reports the same conflict, and nothing outside the range.
	res = want(t, nfs4.NFS4ERR_DENIED)(c2.Compound(opPutFH(fh), opLockT(nfs4.READ_LT, 0, 101, c2.ClientID, "lo2")))
	if d := res.Resarray[2].Oplockt.Denied; d == nil || d.Offset != 100 || string(d.Owner.Owner) != "lo1" {
		t.Errorf("LOCKT denied = %+v", d)
	}
	must(t)(c2.Compound(opPutFH(fh), opLockT(nfs4.WRITE_LT, 150, 10, c2.ClientID, "lo2")))
	// Non-conflicting lock succeeds.
	res = must(t)(c2.Compound(opPutFH(fh), opLockNew(nfs4.WRITE_LT, 0, 100, sid2, c2.ClientID, "lo2")))
	lsid2 := res.Resarray[2].Oplock.Resok4.LockStateid
	// Zero length is INVAL.
	want(t, nfs4.NFS4ERR_INVAL)(c2.Compound(opPutFH(fh), opLockExisting(nfs4.WRITE_LT, 0, 0, lsid2)))

	// CLOSE with locks held.
	want(t, nfs4.NFS4ERR_LOCKS_HELD)(c1.Compound(opPutFH(fh), opClose(sid1)))

	// TEST_STATEID sees both the open and the lock stateid as valid, and a
	// made-up one of this boot (same epoch bytes, see state.Stateid) as bad.
	bogus := nfs4.Stateid4{Seqid: 1, Other: [12]byte{4: 1, 5: 0x55, 8: 0xff, 9: 0xee, 10: 0xdd, 11: 0xcc}}
	copy(bogus.Other[:4], sid1.Other[:4])
	ts1 := nfs4.NfsArgop4{Argop: nfs4.OP_TEST_STATEID, OptestStateid: &nfs4.TESTSTATEID4args{TsStateids: []nfs4.Stateid4{sid1, lsid1, bogus}}}
	res = must(t)(c1.Compound(ts1))
	codes := res.Resarray[1].OptestStateid.TsrResok4.TsrStatusCodes
	if len(codes) != 3 || codes[0] != nfs4.NFS4_OK || codes[1] != nfs4.NFS4_OK || codes[2] != nfs4.NFS4ERR_BAD_STATEID {
		t.Errorf("TEST_STATEID codes %v", codes)
	}
	// FREE_STATEID of a lock stateid that still holds locks is LOCKS_HELD.
	free := func(s nfs4.Stateid4) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_FREE_STATEID, OpfreeStateid: &nfs4.FREESTATEID4args{FsaStateid: s}}
	}
	want(t, nfs4.NFS4ERR_LOCKS_HELD)(c1.Compound(free(lsid1)))

	// LOCKU, then the other client can lock.
	res = must(t)(c1.Compound(opPutFH(fh), opLockU(nfs4.WRITE_LT, 100, 50, lsid1)))
	lsid1b := *res.Resarray[2].Oplocku.LockStateid
	if lsid1b.Seqid <= lsid1.Seqid {
		t.Errorf("LOCKU did not bump seqid: %+v", lsid1b)
	}
	must(t)(c2.Compound(opPutFH(fh), opLockExisting(nfs4.READ_LT, 120, 10, lsid2)))
	must(t)(c1.Compound(free(lsid1b)))
	res = must(t)(c1.Compound(ts1))
	if codes := res.Resarray[1].OptestStateid.TsrResok4.TsrStatusCodes; codes[1] == nfs4.NFS4_OK {
		t.Errorf("freed lock stateid still tests OK: %v", codes)
	}
	must(t)(c1.Compound(opPutFH(fh), opClose(sid1)))
}

func TestLeaseExpiryFreesLocks(t *testing.T) {
	ts := startServer(t, Config{Lease: 2 * time.Second, NoDelegations: true})
	c1, c2 := ts.client(), ts.client()
	rw := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
	sid1, fh := openFile(t, c1, "f", rw, 0, "o1")
	must(t)(c1.Compound(opPutFH(fh), opLockNew(nfs4.WRITE_LT, 0, 10, sid1, c1.ClientID, "lo1")))
	res := must(t)(c2.Compound(opPutRoot(), opOpen(c2.ClientID, openArgs{name: "f", owner: "o2", access: rw})))
	sid2 := openSid(t, res)
	want(t, nfs4.NFS4ERR_DENIED)(c2.Compound(opPutFH(fh), opLockT(nfs4.WRITE_LT, 0, 10, c2.ClientID, "lo2")))
	// c1 goes silent; c2 keeps its own lease alive by polling. The lock
	// must eventually be released (bounded: 60 polls of 250 ms, far longer
	// than lease plus sweep interval).
	freed := pollUntil(60, 250*time.Millisecond, func() bool {
		res, err := c2.Compound(opPutFH(fh), opLockT(nfs4.WRITE_LT, 0, 10, c2.ClientID, "lo2"))
		return err == nil && res.Status == nfs4.NFS4_OK
	})
	if !freed {
		t.Fatal("expired client's lock was never released")
	}
	must(t)(c2.Compound(opPutFH(fh), opLockNew(nfs4.WRITE_LT, 0, 10, sid2, c2.ClientID, "lo2")))
	// The expired client's session is gone.
	res, err := c1.Compound(opPutRoot())
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nfs4.NFS4ERR_BADSESSION && res.Status != nfs4.NFS4ERR_DEADSESSION {
		t.Errorf("expired client's SEQUENCE: %s", summary(res))
	}
}

// TestOpenTruncateRespectsShareDeny: an UNCHECKED4 create with size 0 on
// an existing file (O_TRUNC) that is refused for a share conflict must not
// truncate the file.
func TestOpenTruncateRespectsShareDeny(t *testing.T) {
	ts := startServer(t, Config{NoDelegations: true}) // share reservations and locks between clients, not delegations (deleg_test.go)
	c1, c2 := ts.client(), ts.client()
	sid, fh := openFile(t, c1, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.OPEN4_SHARE_DENY_WRITE, "o1")
	must(t)(c1.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, []byte("precious"))))
	want(t, nfs4.NFS4ERR_SHARE_DENIED)(c2.Compound(opPutRoot(), opOpen(c2.ClientID, openArgs{name: "f", owner: "o2",
		access: nfs4.OPEN4_SHARE_ACCESS_WRITE, create: true, mode: nfs4.UNCHECKED4, attrs: fattr(aSize(0))})))
	res := must(t)(c1.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE)))
	if got := attrsOf(t, res)[nfs4.FATTR4_SIZE]; got != uint64(8) {
		t.Errorf("size after refused O_TRUNC open = %v, want 8", got)
	}
	// Once c1 closes, the truncating open goes through.
	must(t)(c1.Compound(opPutFH(fh), opClose(sid)))
	res = must(t)(c2.Compound(opPutRoot(), opOpen(c2.ClientID, openArgs{name: "f", owner: "o2",
		access: nfs4.OPEN4_SHARE_ACCESS_WRITE, create: true, mode: nfs4.UNCHECKED4, attrs: fattr(aSize(0))}),
		opGetattr(nfs4.FATTR4_SIZE)))
	if got := attrsOf(t, res)[nfs4.FATTR4_SIZE]; got != uint64(0) {
		t.Errorf("size after O_TRUNC open = %v, want 0", got)
	}
	if set := find(t, res, nfs4.OP_OPEN).Opopen.Resok4.Attrset; !bitmapHas(set, nfs4.FATTR4_SIZE) {
		t.Errorf("attrset %v lacks size", set)
	}
}
