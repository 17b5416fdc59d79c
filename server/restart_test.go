package server

import (
	"bytes"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
)

func TestRestart(t *testing.T) {
	// The grace period lasts one lease; make it long enough that the test
	// never sees it end by itself, and end it with RECLAIM_COMPLETE.
	ts := startServer(t, Config{Lease: 30 * time.Second})
	ctx := testCtx(t)
	const owner = "restart-owner"
	c := ts.clientOwner(owner)
	data := bytes.Repeat([]byte("persist!"), 3000)
	rw := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
	sid, fh := openFile(t, c, "f", rw, 0, "o1")
	res := must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, data),
		opSetattr(sid, fattr(aMode(0o640), aOwner("1000"))),
		opGetattr(nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE, nfs4.FATTR4_OWNER, nfs4.FATTR4_FILEID, nfs4.FATTR4_TIME_MODIFY)))
	oldVerf := res.Resarray[2].Opwrite.Resok4.Writeverf
	before := attrsOf(t, res)
	// An UNSTABLE write that is then committed survives too.
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, uint64(len(data)), nfs4.UNSTABLE4, []byte("tail")), opCommit()))
	data = append(data, "tail"...)
	before[nfs4.FATTR4_SIZE] = uint64(len(data))
	dirFH := fhOf(t, must(t)(c.Compound(opPutRoot(), opMkdir("dir"), opGetFH())))
	oldSession, oldClientID := c.SessionID, c.ClientID

	ts.restart()

	// The old session is gone, and so is the client ID.
	c2 := ts.dial()
	c2.SessionID = oldSession
	want(t, nfs4.NFS4ERR_BADSESSION)(c2.Compound(opPutRoot()))
	c2.ClientID, c2.CSSeq = oldClientID, c.CSSeq
	if _, err := c2.CreateSession(ctx, true); wiretest.StatusOf(err) != nfs4.NFS4ERR_STALE_CLIENTID {
		t.Errorf("CREATE_SESSION with a client ID of the previous boot: %v", err)
	}

	// The client comes back with the same owner and verifier. Client IDs
	// are per boot (RFC 8881 §2.4: the old one is stale), so it gets a new
	// one; what survived is its record, which grants it reclaim rights.
	if _, err := c2.ExchangeID(ctx, []byte(owner), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.CreateSession(ctx, true); err != nil {
		t.Fatal(err)
	}

	// Handles are stable, data and attributes intact.
	res = must(t)(c2.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE, nfs4.FATTR4_OWNER,
		nfs4.FATTR4_FILEID, nfs4.FATTR4_TIME_MODIFY)))
	after := attrsOf(t, res)
	for _, n := range []uint32{nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE, nfs4.FATTR4_OWNER, nfs4.FATTR4_FILEID} {
		if before[n] != after[n] {
			t.Errorf("attribute %d: %v before restart, %v after", n, before[n], after[n])
		}
	}
	must(t)(c2.Compound(opPutFH(dirFH), opGetattr(nfs4.FATTR4_TYPE)))

	// State of the previous boot is stale.
	want(t, nfs4.NFS4ERR_STALE_STATEID)(c2.Compound(opPutFH(fh), opRead(sid, 0, 10)))

	// During grace: a new OPEN is refused, a reclaim succeeds.
	want(t, nfs4.NFS4ERR_GRACE)(c2.Compound(opPutRoot(), opOpen(c2.ClientID, openArgs{name: "f", owner: "o2", access: rw})))
	want(t, nfs4.NFS4ERR_GRACE)(c2.Compound(opPutRoot(), opOpen(c2.ClientID, openArgs{name: "new", owner: "o2", access: rw,
		create: true, mode: nfs4.GUARDED4})))
	res = must(t)(c2.Compound(opPutFH(fh), opOpen(c2.ClientID, openArgs{owner: "o1", access: rw, claim: nfs4.CLAIM_PREVIOUS})))
	rsid := openSid(t, res)
	// Locks likewise: only reclaims during grace.
	want(t, nfs4.NFS4ERR_GRACE)(c2.Compound(opPutFH(fh), opLockNew(nfs4.WRITE_LT, 0, 10, rsid, c2.ClientID, "lo")))
	reclaimLock := opLockNew(nfs4.WRITE_LT, 0, 10, rsid, c2.ClientID, "lo")
	reclaimLock.Oplock.Reclaim = true
	must(t)(c2.Compound(opPutFH(fh), reclaimLock))

	// A client the server never knew has nothing to reclaim.
	stranger := ts.client()
	res, err := stranger.Compound(opPutFH(fh), opOpen(stranger.ClientID, openArgs{owner: "s", access: rw, claim: nfs4.CLAIM_PREVIOUS}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nfs4.NFS4ERR_RECLAIM_BAD && res.Status != nfs4.NFS4ERR_NO_GRACE {
		t.Errorf("reclaim by unknown client: %s", summary(res))
	}

	// RECLAIM_COMPLETE from the only previous client ends grace.
	rc := func(oneFS bool) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_RECLAIM_COMPLETE, OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{RcaOneFs: oneFS}}
	}
	must(t)(c2.Compound(rc(false)))
	want(t, nfs4.NFS4ERR_COMPLETE_ALREADY)(c2.Compound(rc(false)))
	must(t)(c2.Compound(opPutRoot(), opOpen(c2.ClientID, openArgs{name: "new", owner: "o2", access: rw,
		create: true, mode: nfs4.GUARDED4})))
	want(t, nfs4.NFS4ERR_NO_GRACE)(c2.Compound(opPutFH(fh), opOpen(c2.ClientID, openArgs{owner: "o1", access: rw, claim: nfs4.CLAIM_PREVIOUS})))

	res = must(t)(c2.Compound(opPutFH(fh), opRead(rsid, 0, uint32(len(data)+10)), opWrite(rsid, 0, nfs4.UNSTABLE4, []byte("p"))))
	if got := res.Resarray[2].Opread.Resok4.Data; !bytes.Equal(got, data) {
		t.Errorf("data after restart: %d bytes, want %d", len(got), len(data))
	}
	if v := res.Resarray[3].Opwrite.Resok4.Writeverf; v == oldVerf {
		t.Error("write verifier unchanged across restart")
	}
}

// TestRestartGraceless checks that a server whose previous boot had no
// clients starts without a grace period.
func TestRestartGraceless(t *testing.T) {
	ts := startServer(t, Config{Lease: 30 * time.Second})
	ts.restart()
	c := ts.client()
	must(t)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "f", access: nfs4.OPEN4_SHARE_ACCESS_BOTH,
		create: true, mode: nfs4.GUARDED4})))
}

// TestGraceBeforeReclaimComplete: after a restart, a non-reclaim OPEN is
// refused with NFS4ERR_GRACE during the grace period (RFC 8881 §8.4.2.1),
// and from a client that has not sent RECLAIM_COMPLETE also after the
// previous clients ended it early by completing their reclaims (§18.51.3:
// a client sends RECLAIM_COMPLETE before its first non-reclaim locking
// operation, as the Linux client does). Once it has sent RECLAIM_COMPLETE,
// it may open. TestPynfsCases/RECC3 has the same rule with no restart.
func TestGraceBeforeReclaimComplete(t *testing.T) {
	ts := startServer(t, Config{Lease: 30 * time.Second})
	ctx := testCtx(t)
	rw := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
	rc := nfs4.NfsArgop4{Argop: nfs4.OP_RECLAIM_COMPLETE, OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{}}
	const owner = "grace-known"
	a := ts.clientOwner(owner)
	_, fh := openFile(t, a, "f", rw, 0, "o1")

	ts.restart()

	// A new client during grace, before and after RECLAIM_COMPLETE.
	b := ts.reclaiming()
	want(t, nfs4.NFS4ERR_GRACE)(b.Compound(opPutRoot(), opOpen(b.ClientID, openArgs{name: "f", owner: "b", access: rw})))
	want(t, nfs4.NFS4ERR_GRACE)(b.Compound(opPutRoot(), opOpen(b.ClientID, openArgs{name: "new-b", owner: "b", access: rw,
		create: true, mode: nfs4.GUARDED4})))
	must(t)(b.Compound(rc))
	want(t, nfs4.NFS4ERR_GRACE)(b.Compound(opPutRoot(), opOpen(b.ClientID, openArgs{name: "f", owner: "b", access: rw})))

	// The only previous client reclaims and completes: grace is over.
	a2 := ts.dial()
	if _, err := a2.ExchangeID(ctx, []byte(owner), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := a2.CreateSession(ctx, true); err != nil {
		t.Fatal(err)
	}
	must(t)(a2.Compound(opPutFH(fh), opOpen(a2.ClientID, openArgs{owner: "o1", access: rw, claim: nfs4.CLAIM_PREVIOUS})))
	must(t)(a2.Compound(rc))
	must(t)(b.Compound(opPutRoot(), opOpen(b.ClientID, openArgs{name: "f", owner: "b", access: rw})))

	// A client that skips RECLAIM_COMPLETE still gets NFS4ERR_GRACE, and
	// its refused create leaves nothing behind.
	c := ts.reclaiming()
	want(t, nfs4.NFS4ERR_GRACE)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "f", owner: "c", access: rw})))
	want(t, nfs4.NFS4ERR_GRACE)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "new-c", owner: "c", access: rw,
		create: true, mode: nfs4.GUARDED4})))
	want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutRoot(), opLookup("new-c")))
	must(t)(c.Compound(rc))
	must(t)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "new-c", owner: "c", access: rw,
		create: true, mode: nfs4.GUARDED4})))
}
