package server

import (
	"bytes"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/wiretest"
)

func TestNullProc(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial()
	if err := c.Null(testCtx(t)); err != nil {
		t.Fatalf("NULL: %v", err)
	}
}

func TestSessionBasics(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	res := must(t)(c.Compound(opPutRoot(), opGetFH(), opGetattr(
		nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE,
		nfs4.FATTR4_FILEID, nfs4.FATTR4_CHANGE, nfs4.FATTR4_FS_LAYOUT_TYPES,
		nfs4.FATTR4_SUPPATTR_EXCLCREAT, nfs4.FATTR4_LEASE_TIME, nfs4.FATTR4_FSID,
		nfs4.FATTR4_NUMLINKS, nfs4.FATTR4_OWNER, nfs4.FATTR4_TIME_MODIFY, nfs4.FATTR4_FILEHANDLE)))
	if fh := fhOf(t, res); len(fh) == 0 || len(fh) > nfs4.NFS4_FHSIZE {
		t.Errorf("root filehandle length %d", len(fh))
	}
	a := attrsOf(t, res)
	if got := a[nfs4.FATTR4_TYPE]; got != uint32(nfs4.NF4DIR) {
		t.Errorf("root type = %v, want NF4DIR", got)
	}
	if m := a[nfs4.FATTR4_MODE].(uint32); m&0o700 == 0 || m > 0o7777 {
		t.Errorf("root mode = %o", m)
	}
	if a[nfs4.FATTR4_FILEID].(uint64) == 0 {
		t.Error("root fileid is 0")
	}
	if a[nfs4.FATTR4_NUMLINKS].(uint32) < 2 {
		t.Errorf("root numlinks = %d", a[nfs4.FATTR4_NUMLINKS])
	}
	sup := a[nfs4.FATTR4_SUPPORTED_ATTRS].(nfs4.Bitmap4)
	for _, n := range []uint32{nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_TYPE, nfs4.FATTR4_FH_EXPIRE_TYPE,
		nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE, nfs4.FATTR4_LINK_SUPPORT, nfs4.FATTR4_SYMLINK_SUPPORT,
		nfs4.FATTR4_NAMED_ATTR, nfs4.FATTR4_FSID, nfs4.FATTR4_UNIQUE_HANDLES, nfs4.FATTR4_LEASE_TIME,
		nfs4.FATTR4_RDATTR_ERROR, nfs4.FATTR4_FILEHANDLE, nfs4.FATTR4_SUPPATTR_EXCLCREAT,
		nfs4.FATTR4_FS_LAYOUT_TYPES, nfs4.FATTR4_MODE, nfs4.FATTR4_OWNER} {
		if !bitmapHas(sup, n) {
			t.Errorf("supported_attrs lacks %d", n)
		}
	}
	excl := a[nfs4.FATTR4_SUPPATTR_EXCLCREAT].(nfs4.Bitmap4)
	bitmapEach(excl, func(n uint32) bool {
		if !bitmapHas(sup, n) {
			t.Errorf("suppattr_exclcreat has %d, which is not supported", n)
		}
		return true
	})
	if lt, ok := a[nfs4.FATTR4_FS_LAYOUT_TYPES].([]uint32); !ok || len(lt) != 0 {
		t.Errorf("fs_layout_types = %v, want present and empty", a[nfs4.FATTR4_FS_LAYOUT_TYPES])
	}
	if a[nfs4.FATTR4_LEASE_TIME].(uint32) == 0 {
		t.Error("lease_time 0")
	}
	if fh, _ := a[nfs4.FATTR4_FILEHANDLE].([]byte); !bytes.Equal(fh, fhOf(t, res)) {
		t.Errorf("filehandle attribute %x differs from GETFH %x", fh, fhOf(t, res))
	}
	seq := res.Resarray[0].Opsequence.SrResok4
	// The session's second request: setup sent RECLAIM_COMPLETE first.
	if seq.SrSessionid != c.SessionID || seq.SrSequenceid != 2 {
		t.Errorf("SEQUENCE result %+v", seq)
	}
	if seq.SrStatusFlags&nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION != 0 {
		t.Error("back channel reported down although CREATE_SESSION bound one")
	}
}

func TestMinorVersionMismatch(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial()
	for _, minor := range []uint32{0, 3, 1 << 31} {
		res, _, err := c.Send(testCtx(t), &nfs4.COMPOUND4args{Tag: []byte("tag"), Minorversion: minor,
			Argarray: []nfs4.NfsArgop4{opPutRoot(), opGetFH()}})
		if err != nil {
			t.Fatalf("minor %d: %v", minor, err)
		}
		if res.Status != nfs4.NFS4ERR_MINOR_VERS_MISMATCH || len(res.Resarray) != 0 {
			t.Errorf("minor %d: got %s with %d results, want MINOR_VERS_MISMATCH and none", minor, statName(res.Status), len(res.Resarray))
		}
		if string(res.Tag) != "tag" {
			t.Errorf("minor %d: tag %q not echoed", minor, res.Tag)
		}
	}
}

func TestSequenceReplay(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	ctx := testCtx(t)
	ops := []nfs4.NfsArgop4{opPutRoot(), opMkdir("replayed"), opGetFH()}
	res, raw, seq, err := c.CompoundRaw(ctx, ops...)
	must(t)(res, err)

	// Resend the same request on the same slot and sequence ID.
	args := &nfs4.COMPOUND4args{Minorversion: c.Minor,
		Argarray: append([]nfs4.NfsArgop4{wiretest.Seq(c.SessionID, 0, seq, true)}, ops...)}
	res2, raw2, err := c.Send(ctx, args)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, raw2) {
		t.Fatalf("retransmission reply differs:\n%s\n%s", summary(res), summary(res2))
	}
	// The CREATE ran once: a fresh request sees the directory and exactly
	// one entry.
	must(t)(c.Compound(opPutRoot(), opLookup("replayed")))
	rd := must(t)(c.Compound(opPutRoot(), opReaddir(0, nfs4.Verifier4{}, 4096)))
	if names := readdirNames(t, rd); len(names) != 1 || names[0] != "replayed" {
		t.Errorf("root entries %q, want [replayed]", names)
	}
	// Creating it again for real fails: the retransmission did not hide a
	// second execution.
	res, err = c.CompoundCtx(ctx, opPutRoot(), opMkdir("replayed"))
	want(t, nfs4.NFS4ERR_EXIST)(res, err)

	// A large reply the client did not ask to cache is not cached: its
	// retransmission gets RETRY_UNCACHED_REP rather than a re-execution.
	sid, fh := openFile(t, c, "big", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, make([]byte, 8000))))
	readOps := []nfs4.NfsArgop4{opPutFH(fh), opRead(sid, 0, 8000)}
	must(t)(c.Compound(readOps...))
	args = &nfs4.COMPOUND4args{Minorversion: 2,
		Argarray: append([]nfs4.NfsArgop4{wiretest.Seq(c.SessionID, 0, c.SlotSeq(), false)}, readOps...)}
	res, _, err = c.Send(ctx, args)
	want(t, nfs4.NFS4ERR_RETRY_UNCACHED_REP)(res, err)
}

func TestSequenceErrors(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	ctx := testCtx(t)
	must(t)(c.Compound(opPutRoot()))
	cur := c.SlotSeq()
	bogus := nfs4.Sessionid4{0xde, 0xad}
	tests := []struct {
		name string
		seq  nfs4.NfsArgop4
		want nfs4.Nfsstat4
	}{
		{"misordered ahead", wiretest.Seq(c.SessionID, 0, cur+2, false), nfs4.NFS4ERR_SEQ_MISORDERED},
		{"misordered behind", wiretest.Seq(c.SessionID, 0, cur-1, false), nfs4.NFS4ERR_SEQ_MISORDERED},
		{"unused slot seqid 0", wiretest.Seq(c.SessionID, 1, 0, false), nfs4.NFS4ERR_SEQ_MISORDERED},
		{"bad slot", wiretest.Seq(c.SessionID, 1000, 1, false), nfs4.NFS4ERR_BADSLOT},
		{"bad session", wiretest.Seq(bogus, 0, 1, false), nfs4.NFS4ERR_BADSESSION},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, _, err := c.Send(ctx, &nfs4.COMPOUND4args{Minorversion: 1, Argarray: []nfs4.NfsArgop4{tc.seq, opPutRoot()}})
			want(t, tc.want)(res, err)
			if len(res.Resarray) != 1 {
				t.Errorf("%d results after failed SEQUENCE", len(res.Resarray))
			}
		})
	}
	// The slot is unaffected by the failures.
	must(t)(c.Compound(opPutRoot()))
	// SEQUENCE not first.
	res, _, err := c.Send(ctx, &nfs4.COMPOUND4args{Minorversion: 1, Argarray: []nfs4.NfsArgop4{
		wiretest.Seq(c.SessionID, 0, c.SlotSeq()+1, false), opPutRoot(), wiretest.Seq(c.SessionID, 1, 1, false)}})
	want(t, nfs4.NFS4ERR_SEQUENCE_POS)(res, err)
}

func TestDestroySessionAndClientID(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	ctx := testCtx(t)
	destroyClient := nfs4.NfsArgop4{Argop: nfs4.OP_DESTROY_CLIENTID, OpdestroyClientid: &nfs4.DESTROYCLIENTID4args{DcaClientid: c.ClientID}}
	// A client with a session is busy.
	res, err := c.Sessionless(ctx, destroyClient)
	want(t, nfs4.NFS4ERR_CLIENTID_BUSY)(res, err)

	destroySess := nfs4.NfsArgop4{Argop: nfs4.OP_DESTROY_SESSION, OpdestroySession: &nfs4.DESTROYSESSION4args{DsaSessionid: c.SessionID}}
	must(t)(c.Sessionless(ctx, destroySess))
	res, err = c.Compound(opPutRoot())
	want(t, nfs4.NFS4ERR_BADSESSION)(res, err)
	res, err = c.Sessionless(ctx, destroySess)
	want(t, nfs4.NFS4ERR_BADSESSION)(res, err)

	must(t)(c.Sessionless(ctx, destroyClient))
	res, err = c.Sessionless(ctx, destroyClient)
	want(t, nfs4.NFS4ERR_STALE_CLIENTID)(res, err)
	if _, err := c.CreateSession(ctx, false); wiretest.StatusOf(err) != nfs4.NFS4ERR_STALE_CLIENTID {
		t.Errorf("CREATE_SESSION after DESTROY_CLIENTID: %v", err)
	}
	// Sessionless operations must be alone in their COMPOUND.
	res, err = c.Sessionless(ctx, destroyClient, opPutRoot())
	want(t, nfs4.NFS4ERR_NOT_ONLY_OP)(res, err)
}

func TestBindConnToSession(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	ctx := testCtx(t)
	c2 := ts.dial()
	c2.SessionID, c2.ClientID = c.SessionID, c.ClientID
	bind := func(sid nfs4.Sessionid4, dir nfs4.ChannelDirFromClient4) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_BIND_CONN_TO_SESSION, OpbindConnToSession: &nfs4.BINDCONNTOSESSION4args{BctsaSessid: sid, BctsaDir: dir}}
	}
	res := must(t)(c2.Sessionless(ctx, bind(c.SessionID, nfs4.CDFC4_FORE_OR_BOTH)))
	ok := res.Resarray[0].OpbindConnToSession.BctsrResok4
	if ok.BctsrSessid != c.SessionID || ok.BctsrDir != nfs4.CDFS4_BOTH {
		t.Errorf("BIND_CONN_TO_SESSION result %+v", ok)
	}
	res, err := c2.Sessionless(ctx, bind(nfs4.Sessionid4{1}, nfs4.CDFC4_FORE))
	want(t, nfs4.NFS4ERR_BADSESSION)(res, err)

	// Both connections now drive the same session; they must share the
	// slot's sequence ID, so use distinct slots through raw SEQUENCEs.
	res, _, err = c2.Send(ctx, &nfs4.COMPOUND4args{Minorversion: 1, Argarray: []nfs4.NfsArgop4{
		wiretest.Seq(c.SessionID, 1, 1, false), opPutRoot(), opGetFH()}})
	must(t)(res, err)
	must(t)(c.Compound(opPutRoot()))
}

func TestBackchannelProbe(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client() // CREATE_SESSION with CONN_BACK_CHAN
	if err := c.WaitCallback(testCtx(t), nfs4.CB_NULL); err != nil {
		t.Fatalf("%v (callbacks seen: %v)", err, c.Callbacks())
	}
}

func readdirNames(t *testing.T, res *nfs4.COMPOUND4res) []string {
	t.Helper()
	var names []string
	ok := find(t, res, nfs4.OP_READDIR).Opreaddir.Resok4
	for e := ok.Reply.Entries; e != nil; e = e.Nextentry {
		names = append(names, string(e.Name))
	}
	return names
}

func TestCreateSessionReplayAndMisorder(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial()
	ctx := testCtx(t)
	if _, err := c.ExchangeID(ctx, []byte("cs-replay"), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	first, err := c.CreateSession(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	// Same csa_sequence again: the cached result, same session.
	c.CSSeq--
	again, err := c.CreateSession(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if again.CsrSessionid != first.CsrSessionid {
		t.Error("CREATE_SESSION replay created another session")
	}
	c.CSSeq += 5
	if _, err := c.CreateSession(ctx, false); wiretest.StatusOf(err) != nfs4.NFS4ERR_SEQ_MISORDERED {
		t.Errorf("CREATE_SESSION with a sequence from the future: %v", err)
	}
	// The client ID is confirmed: another principal may add a session
	// (RFC 8881 §18.36.4 checks the principal only when confirming;
	// TestPynfsCases/CSESS10).
	c.CSSeq -= 5
	c.Cred = wiretest.Cred(1000, 1000)
	if _, err := c.CreateSession(ctx, false); err != nil {
		t.Errorf("CREATE_SESSION by another principal on the confirmed client ID: %v", err)
	}
}

// TestSessionSurvivesConnection: with SP4_NONE, a session outlives its
// connection; a new connection is bound by its first SEQUENCE and
// continues the slot's sequence.
func TestSessionSurvivesConnection(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	must(t)(c.Compound(opPutRoot(), opMkdir("before")))
	c.Close()
	c2 := ts.dial()
	c2.SessionID, c2.ClientID = c.SessionID, c.ClientID
	res, _, err := c2.Send(testCtx(t), &nfs4.COMPOUND4args{Minorversion: 2, Argarray: []nfs4.NfsArgop4{
		wiretest.Seq(c.SessionID, 0, c.SlotSeq()+1, false), opPutRoot(), opLookup("before")}})
	must(t)(res, err)
	// (That the back channel is then reported down is checked, with
	// polling, in TestBackchannelBinding.)
}

func TestBackchannelBinding(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := testCtx(t)
	c := ts.dial()
	if _, err := c.ExchangeID(ctx, []byte("bc"), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSession(ctx, false); err != nil {
		t.Fatal(err)
	}
	flags := func(c *wiretest.Client) uint32 {
		t.Helper()
		res := must(t)(c.Compound(opPutRoot()))
		return res.Resarray[0].Opsequence.SrResok4.SrStatusFlags
	}
	if flags(c)&nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION == 0 {
		t.Error("session without back channel: CB_PATH_DOWN_SESSION not set")
	}
	cb := ts.dial()
	res := must(t)(cb.Sessionless(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_BIND_CONN_TO_SESSION,
		OpbindConnToSession: &nfs4.BINDCONNTOSESSION4args{BctsaSessid: c.SessionID, BctsaDir: nfs4.CDFC4_BACK}}))
	if d := res.Resarray[0].OpbindConnToSession.BctsrResok4.BctsrDir; d != nfs4.CDFS4_BACK {
		t.Errorf("bound direction %v", d)
	}
	if flags(c)&nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION != 0 {
		t.Error("back channel bound but CB_PATH_DOWN_SESSION still set")
	}
	cb.Close()
	// Unbinding happens when the server notices the close; poll, bounded.
	if !pollUntil(200, 25*time.Millisecond, func() bool { return flags(c)&nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION != 0 }) {
		t.Error("back channel connection closed, CB_PATH_DOWN_SESSION never set")
	}
}

// TestDestroySessionInSession: DESTROY_SESSION of the session the
// COMPOUND runs in is allowed as its last operation.
func TestDestroySessionInSession(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	must(t)(c.Compound(opPutRoot(), nfs4.NfsArgop4{Argop: nfs4.OP_DESTROY_SESSION,
		OpdestroySession: &nfs4.DESTROYSESSION4args{DsaSessionid: c.SessionID}}))
	want(t, nfs4.NFS4ERR_BADSESSION)(c.Compound(opPutRoot()))
}

func TestRPCProgramAndVersion(t *testing.T) {
	ts := startServer(t, Config{})
	r, err := wiretest.DialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	body := wiretest.CallBody(1, 0, wiretest.Cred(0, 0), nil)
	// Patch program (offset 12) and version (offset 16).
	wrongProg := bytes.Clone(body)
	copy(wrongProg[12:16], []byte{0, 1, 0x86, 0xa5}) // mountd
	wrongVers := bytes.Clone(body)
	wrongVers[19] = 3
	wrongProc := wiretest.CallBody(3, 7, wiretest.Cred(0, 0), nil)
	for _, tc := range []struct {
		rec  []byte
		want rpc.AcceptStat
	}{
		{wrongProg, rpc.ProgUnavail},
		{wrongVers, rpc.ProgMismatch},
		{wrongProc, rpc.ProcUnavail},
	} {
		if err := r.Raw(wiretest.Record(tc.rec)); err != nil {
			t.Fatal(err)
		}
		rp, err := r.ReadReply()
		if err != nil {
			t.Fatal(err)
		}
		if !rp.Accepted || rp.AcceptStat != tc.want {
			t.Errorf("got %+v, want %v", rp, tc.want)
		}
		if tc.want == rpc.ProgMismatch && !bytes.Equal(rp.Body, []byte{0, 0, 0, 4, 0, 0, 0, 4}) {
			t.Errorf("PROG_MISMATCH range %x, want 4-4", rp.Body)
		}
	}
}
