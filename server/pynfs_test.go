package server

import (
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// TestPynfsCases replays, over the wire against a real server, the pynfs
// NFSv4.1 server tests that MDS failover rests on (pynfs itself does not
// run here). Each case names the pynfs code, and its comment quotes the
// RFC 8881 sentence that decides what the server must answer; in all three
// the RFC sides with pynfs.
func TestPynfsCases(t *testing.T) {
	ts := startServer(t, Config{})
	for _, tc := range []struct {
		code, what string
		run        func(t *testing.T, ts *testServer)
	}{
		{"RECC3", "non-reclaim OPEN before RECLAIM_COMPLETE", pynfsRECC3},
		{"CSESS10", "CREATE_SESSION from another principal once confirmed", pynfsCSESS10},
		{"CSESS27", "SEQUENCE with sa_cachethis over ca_maxresponsesize_cached", pynfsCSESS27},
	} {
		t.Run(tc.code, func(t *testing.T) {
			t.Logf("pynfs %s: %s", tc.code, tc.what)
			tc.run(t, ts)
		})
	}
}

// pynfsRECC3 (testOpenBeforeRECC): a new client ID with a session, and an
// OPEN that creates a file before any RECLAIM_COMPLETE, on a server that is
// not in a grace period. RFC 8881 §18.51.3: "Whenever a client establishes
// a new client ID and before it does the first non-reclaim operation that
// obtains a lock, it MUST send a RECLAIM_COMPLETE with rca_one_fs set to
// FALSE, even if there are no locks to reclaim. If non-reclaim locking
// operations are done before the RECLAIM_COMPLETE, an NFS4ERR_GRACE error
// will be returned." Nothing there limits the refusal to a grace period.
// The refused create must leave no file behind, and LOCKT, the other
// non-reclaim locking operation a client can send without an open, is
// refused alike.
func pynfsRECC3(t *testing.T, ts *testServer) {
	c := ts.reclaiming()
	rw := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
	create := opOpen(c.ClientID, openArgs{name: "recc3", owner: "recc3", access: rw, create: true, mode: nfs4.UNCHECKED4})
	want(t, nfs4.NFS4ERR_GRACE)(c.Compound(opPutRoot(), create))
	want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutRoot(), opLookup("recc3")))

	// Another client makes the file; a plain OPEN and LOCKT on it are
	// refused too.
	other := ts.client()
	_, fh := openFile(t, other, "recc3", rw, 0, "other")
	want(t, nfs4.NFS4ERR_GRACE)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "recc3", owner: "recc3"})))
	want(t, nfs4.NFS4ERR_GRACE)(c.Compound(opPutFH(fh), opLockT(nfs4.READ_LT, 0, 1, c.ClientID, "recc3")))

	// After RECLAIM_COMPLETE they go through, and so does a create.
	if err := c.ReclaimComplete(testCtx(t)); err != nil {
		t.Fatalf("RECLAIM_COMPLETE: %v", err)
	}
	must(t)(c.Compound(opPutFH(fh), opLockT(nfs4.READ_LT, 0, 1, c.ClientID, "recc3")))
	must(t)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "recc3-after", owner: "recc3", access: rw,
		create: true, mode: nfs4.UNCHECKED4})))
}

// pynfsCSESS10 (testPrincipalCollision2): CREATE_SESSION for a confirmed
// client ID from another AUTH_SYS principal (another uid) succeeds. RFC 8881
// §18.36.4 checks the principal in phase 3, client ID confirmation, which
// only the first CREATE_SESSION goes through: "If this would be the first
// session for the client ID, the CREATE_SESSION operation serves to confirm
// the client ID. Otherwise, the client ID confirmation phase is skipped and
// only the session creation phase occurs." (A principal check on a
// confirmed client ID belongs to SP4_MACH_CRED state protection, §18.35,
// which the server does not offer.) Before confirmation another principal
// still gets NFS4ERR_CLID_INUSE (pynfs CSESS9), also when it sends the
// right csa_sequence, which stays the client's to use.
func pynfsCSESS10(t *testing.T, ts *testServer) {
	c := newClientID(t, ts)
	own := c.Cred
	other := wiretest.Cred(1000, 1000)

	c.Cred = other
	if _, st := createSession(t, c, 0, kernelFore, kernelBack); st != nfs4.NFS4ERR_CLID_INUSE {
		t.Fatalf("first CREATE_SESSION from uid 1000: %v, want NFS4ERR_CLID_INUSE", statName(st))
	}
	c.Cred = own
	first, st := createSession(t, c, 0, kernelFore, kernelBack)
	if st != nfs4.NFS4_OK {
		t.Fatalf("first CREATE_SESSION from the client's principal: %v", statName(st))
	}
	c.Cred = other
	second, st := createSession(t, c, 0, kernelFore, kernelBack)
	if st != nfs4.NFS4_OK {
		t.Fatalf("CREATE_SESSION from uid 1000 on the confirmed client ID: %v, want NFS4_OK", statName(st))
	}
	if second.CsrSessionid == first.CsrSessionid {
		t.Fatal("the second CREATE_SESSION returned the first session")
	}
	// The new session works, under either credential.
	for _, cred := range []rpc.OpaqueAuth{other, own} {
		c.Cred = cred
		must(t)(c.Compound(opPutRoot(), opGetFH()))
	}
}

// pynfsCSESS27 (testRepTooBigToCache): CREATE_SESSION with a fore channel
// ca_maxresponsesize_cached of 10, then SEQUENCE alone with sa_cachethis:
// NFS4ERR_REP_TOO_BIG_TO_CACHE. RFC 8881 §18.36.3 on
// ca_maxresponsesize_cached: "For each channel, the server MAY decrease
// this value, but MUST NOT increase it", so the server grants 10; and
// §2.10.6.4: "If the reply exceeds ca_maxresponsesize_cached (and
// sa_cachethis or csa_cachethis is TRUE), then the server MUST return
// NFS4ERR_REP_TOO_BIG_TO_CACHE." SEQUENCE's own result does not fit, so
// SEQUENCE fails and the slot is left as it was: the same sequence ID then
// works without sa_cachethis.
func pynfsCSESS27(t *testing.T, ts *testServer) {
	c := newClientID(t, ts)
	fore := kernelFore
	fore.CaMaxresponsesizeCached = 10
	ok, st := createSession(t, c, 0, fore, kernelBack)
	if st != nfs4.NFS4_OK {
		t.Fatalf("CREATE_SESSION with ca_maxresponsesize_cached 10: %v", statName(st))
	}
	if got := ok.CsrForeChanAttrs.CaMaxresponsesizeCached; got > 10 {
		t.Fatalf("granted ca_maxresponsesize_cached %d, more than the 10 asked", got)
	}
	send := func(cacheThis bool) *nfs4.COMPOUND4res {
		t.Helper()
		res, _, err := c.Send(testCtx(t), &nfs4.COMPOUND4args{Minorversion: c.Minor,
			Argarray: []nfs4.NfsArgop4{wiretest.Seq(c.SessionID, 0, 1, cacheThis)}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := send(true); res.Status != nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE || len(res.Resarray) != 1 ||
		res.Resarray[0].Resop != nfs4.OP_SEQUENCE {
		t.Fatalf("SEQUENCE with sa_cachethis: %s, want SEQUENCE NFS4ERR_REP_TOO_BIG_TO_CACHE", summary(res))
	}
	if res := send(false); res.Status != nfs4.NFS4_OK {
		t.Fatalf("SEQUENCE seqid 1 again without sa_cachethis: %s, want NFS4_OK (the slot must not have moved)", summary(res))
	}
}
