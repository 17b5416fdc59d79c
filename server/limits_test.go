package server

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// Channel attributes like the Linux client's: it asks for room for 1 MiB
// READs and WRITEs plus headers, and for cached replies as large as the
// largest OPEN reply its decoder takes, a few KiB with the LAYOUTGET it
// adds to OPEN (encode_create_session and NFS4_dec_open_sz in
// fs/nfs/nfs4xdr.c); it sets sa_cachethis on OPEN and other non-idempotent
// requests. Its back channel has one page, two operations and no reply
// cache.
var (
	kernelFore = nfs4.ChannelAttrs4{CaMaxrequestsize: 1<<20 + 4096, CaMaxresponsesize: 1<<20 + 4096,
		CaMaxresponsesizeCached: 5 << 10, CaMaxoperations: 16, CaMaxrequests: 64}
	kernelBack = nfs4.ChannelAttrs4{CaMaxrequestsize: 4096, CaMaxresponsesize: 4096,
		CaMaxoperations: 2, CaMaxrequests: 1}
)

// createSession sends CREATE_SESSION for a fresh client ID of c with the
// given flags and channel attributes, and on success makes it c's session.
func createSession(t *testing.T, c *wiretest.Client, flags uint32, fore, back nfs4.ChannelAttrs4) (*nfs4.CREATESESSION4resok, nfs4.Nfsstat4) {
	t.Helper()
	res, err := c.Sessionless(testCtx(t), nfs4.NfsArgop4{Argop: nfs4.OP_CREATE_SESSION, OpcreateSession: &nfs4.CREATESESSION4args{
		CsaClientid: c.ClientID, CsaSequence: c.CSSeq, CsaFlags: flags,
		CsaForeChanAttrs: fore, CsaBackChanAttrs: back, CsaCbProgram: wiretest.CBProgram,
		CsaSecParms: []nfs4.CallbackSecParms4{{CbSecflavor: nfs4.AUTH_NONE}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nfs4.NFS4_OK {
		return nil, res.Status
	}
	ok := res.Resarray[0].OpcreateSession.CsrResok4
	c.SessionID = ok.CsrSessionid
	c.CSSeq++
	return ok, nfs4.NFS4_OK
}

// newClientID dials ts and establishes a client ID (no session).
func newClientID(t *testing.T, ts *testServer) *wiretest.Client {
	t.Helper()
	c := ts.dial()
	if _, err := c.ExchangeID(testCtx(t), []byte(fmt.Sprintf("%s-%d", t.Name(), ownerSeq.Add(1))), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCreateSessionChannelLimits: CREATE_SESSION refuses channel limits
// too small for the smallest request and reply (NFS4ERR_TOOSMALL) and
// undefined flags (NFS4ERR_INVAL); it grants what it will enforce, never
// more than asked, and still gives the Linux client room for 1 MiB I/O.
func TestCreateSessionChannelLimits(t *testing.T) {
	ts := startServer(t, Config{})
	with := func(a nfs4.ChannelAttrs4, f func(*nfs4.ChannelAttrs4)) nfs4.ChannelAttrs4 { f(&a); return a }
	for _, tc := range []struct {
		name       string
		flags      uint32
		fore, back nfs4.ChannelAttrs4
		want       nfs4.Nfsstat4
	}{
		{"kernel-like", nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN, kernelFore, kernelBack, nfs4.NFS4_OK},
		{"fore maxrequestsize 20", 0, with(kernelFore, func(a *nfs4.ChannelAttrs4) { a.CaMaxrequestsize = 20 }), kernelBack, nfs4.NFS4ERR_TOOSMALL},
		{"fore maxresponsesize 0", 0, with(kernelFore, func(a *nfs4.ChannelAttrs4) { a.CaMaxresponsesize = 0 }), kernelBack, nfs4.NFS4ERR_TOOSMALL},
		{"fore maxresponsesize 60", 0, with(kernelFore, func(a *nfs4.ChannelAttrs4) { a.CaMaxresponsesize = 60 }), kernelBack, nfs4.NFS4ERR_TOOSMALL},
		{"fore maxoperations 0", 0, with(kernelFore, func(a *nfs4.ChannelAttrs4) { a.CaMaxoperations = 0 }), kernelBack, nfs4.NFS4ERR_TOOSMALL},
		{"back maxrequestsize 20", 0, kernelFore, with(kernelBack, func(a *nfs4.ChannelAttrs4) { a.CaMaxrequestsize = 20 }), nfs4.NFS4ERR_TOOSMALL},
		{"back maxresponsesize 0", 0, kernelFore, with(kernelBack, func(a *nfs4.ChannelAttrs4) { a.CaMaxresponsesize = 0 }), nfs4.NFS4ERR_TOOSMALL},
		{"back maxoperations 1", 0, kernelFore, with(kernelBack, func(a *nfs4.ChannelAttrs4) { a.CaMaxoperations = 1 }), nfs4.NFS4ERR_TOOSMALL},
		{"undefined flag 0x8", 0x8, kernelFore, kernelBack, nfs4.NFS4ERR_INVAL},
		{"undefined flag 0x80000000", 0x80000000 | nfs4.CREATE_SESSION4_FLAG_PERSIST, kernelFore, kernelBack, nfs4.NFS4ERR_INVAL},
		{"small but usable", 0, with(kernelFore, func(a *nfs4.ChannelAttrs4) {
			a.CaMaxrequestsize, a.CaMaxresponsesize, a.CaMaxresponsesizeCached = 400, 400, 400
		}), kernelBack, nfs4.NFS4_OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClientID(t, ts)
			ok, st := createSession(t, c, tc.flags, tc.fore, tc.back)
			if st != tc.want {
				t.Fatalf("CREATE_SESSION: %v, want %v", statName(st), statName(tc.want))
			}
			if ok == nil {
				return
			}
			if err := c.ReclaimComplete(testCtx(t)); err != nil {
				t.Fatalf("RECLAIM_COMPLETE: %v", err)
			}
			got := ok.CsrForeChanAttrs
			// RFC 8881 §18.36.3: the server may lower these, never
			// raise them.
			if got.CaMaxrequestsize > tc.fore.CaMaxrequestsize || got.CaMaxresponsesize > tc.fore.CaMaxresponsesize ||
				got.CaMaxresponsesizeCached > tc.fore.CaMaxresponsesizeCached || got.CaMaxoperations > tc.fore.CaMaxoperations {
				t.Errorf("granted fore channel %+v exceeds the request %+v", got, tc.fore)
			}
			if tc.name == "kernel-like" {
				// Room for a 1 MiB WRITE or READ plus its COMPOUND.
				if got.CaMaxrequestsize < 1<<20+1024 || got.CaMaxresponsesize < 1<<20+1024 {
					t.Errorf("granted fore channel %+v: no room for 1 MiB I/O", got)
				}
			}
			// The session works, also for an OPEN the client asks to
			// cache, as the Linux client does.
			must(t)(c.Compound(opPutRoot(), opGetFH()))
			res, _, _, err := c.CompoundRaw(testCtx(t), opPutRoot(), opOpen(c.ClientID, openArgs{name: "f-" + strings.ReplaceAll(tc.name, " ", "-"),
				access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: nfs4.UNCHECKED4}), opGetFH(), opGetattr(nfs4.FATTR4_SIZE, nfs4.FATTR4_CHANGE))
			must(t)(res, err)
		})
	}
}

// bigGetattr asks for many attributes of the root: its reply is over 450
// bytes.
func bigGetattr() []nfs4.NfsArgop4 {
	return []nfs4.NfsArgop4{opPutRoot(), opGetattr(
		nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_TYPE, nfs4.FATTR4_FH_EXPIRE_TYPE, nfs4.FATTR4_CHANGE,
		nfs4.FATTR4_SIZE, nfs4.FATTR4_LINK_SUPPORT, nfs4.FATTR4_SYMLINK_SUPPORT, nfs4.FATTR4_NAMED_ATTR,
		nfs4.FATTR4_FSID, nfs4.FATTR4_UNIQUE_HANDLES, nfs4.FATTR4_LEASE_TIME, nfs4.FATTR4_RDATTR_ERROR,
		nfs4.FATTR4_FILEHANDLE, nfs4.FATTR4_FILEID, nfs4.FATTR4_MODE, nfs4.FATTR4_NUMLINKS,
		nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP, nfs4.FATTR4_RAWDEV, nfs4.FATTR4_SPACE_USED,
		nfs4.FATTR4_TIME_ACCESS, nfs4.FATTR4_TIME_METADATA, nfs4.FATTR4_TIME_MODIFY, nfs4.FATTR4_MOUNTED_ON_FILEID,
		nfs4.FATTR4_SUPPATTR_EXCLCREAT, nfs4.FATTR4_FS_LAYOUT_TYPES, nfs4.FATTR4_MAXREAD, nfs4.FATTR4_MAXWRITE,
		nfs4.FATTR4_MAXFILESIZE, nfs4.FATTR4_MAXNAME, nfs4.FATTR4_MAXLINK, nfs4.FATTR4_FILES_FREE,
		nfs4.FATTR4_FILES_TOTAL, nfs4.FATTR4_SPACE_FREE, nfs4.FATTR4_SPACE_TOTAL, nfs4.FATTR4_SPACE_AVAIL,
		nfs4.FATTR4_ACLSUPPORT, nfs4.FATTR4_CANSETTIME, nfs4.FATTR4_CASE_INSENSITIVE, nfs4.FATTR4_CASE_PRESERVING,
		nfs4.FATTR4_CHOWN_RESTRICTED, nfs4.FATTR4_HOMOGENEOUS, nfs4.FATTR4_NO_TRUNC, nfs4.FATTR4_TIME_DELTA,
		nfs4.FATTR4_FILES_AVAIL, nfs4.FATTR4_MAXLINK, nfs4.FATTR4_LAYOUT_BLKSIZE, nfs4.FATTR4_TIME_CREATE)}
}

// TestSessionLimitsEnforced: with the fore channel limits a session was
// granted, a request over ca_maxrequestsize gets NFS4ERR_REQ_TOO_BIG on
// SEQUENCE (the slot does not move), a reply over ca_maxresponsesize ends
// with NFS4ERR_REP_TOO_BIG on the operation that overflowed, and one the
// client asked to cache over ca_maxresponsesize_cached with
// NFS4ERR_REP_TOO_BIG_TO_CACHE, cached as such (RFC 8881 §2.10.6.4).
func TestSessionLimitsEnforced(t *testing.T) {
	ts := startServer(t, Config{})
	// The reply to bigGetattr on an ordinary session, for scale.
	_, raw, _, err := ts.client().CompoundRaw(testCtx(t), bigGetattr()...)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw)+rpcReplyHeader <= 450 {
		t.Fatalf("bigGetattr's reply is only %d bytes", len(raw)+rpcReplyHeader)
	}

	t.Run("REP_TOO_BIG", func(t *testing.T) {
		c := newClientID(t, ts)
		fore := kernelFore
		fore.CaMaxrequestsize, fore.CaMaxresponsesize, fore.CaMaxresponsesizeCached = 1024, 400, 400
		ok, st := createSession(t, c, 0, fore, kernelBack)
		if st != nfs4.NFS4_OK {
			t.Fatalf("CREATE_SESSION: %v", statName(st))
		}
		if got := ok.CsrForeChanAttrs.CaMaxresponsesize; got != 400 {
			t.Fatalf("granted ca_maxresponsesize %d, want 400", got)
		}
		res, err := c.Compound(bigGetattr()...)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != nfs4.NFS4ERR_REP_TOO_BIG || len(res.Resarray) != 3 ||
			opStatus(&res.Resarray[1]) != nfs4.NFS4_OK || res.Resarray[2].Resop != nfs4.OP_GETATTR {
			t.Fatalf("big GETATTR on a 400-byte channel: %s, want PUTROOTFH OK, GETATTR REP_TOO_BIG", summary(res))
		}
		// A small reply still fits.
		must(t)(c.Compound(opPutRoot(), opGetattr(nfs4.FATTR4_TYPE)))
	})

	t.Run("REQ_TOO_BIG", func(t *testing.T) {
		c := newClientID(t, ts)
		fore := kernelFore
		fore.CaMaxrequestsize = 1024
		if _, st := createSession(t, c, 0, fore, kernelBack); st != nfs4.NFS4_OK {
			t.Fatalf("CREATE_SESSION: %v", statName(st))
		}
		must(t)(c.Compound(opPutRoot(), opGetFH()))
		seq := c.SlotSeq()
		res, err := c.Compound(opPutRoot(), opCreate(string(bytes.Repeat([]byte("n"), 255)), nfs4.Createtype4{Type: nfs4.NF4LNK,
			Linkdata: ptr(nfs4.Linktext4(bytes.Repeat([]byte("x"), 1000)))}, nfs4.Fattr4{}))
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != nfs4.NFS4ERR_REQ_TOO_BIG || len(res.Resarray) != 1 || res.Resarray[0].Resop != nfs4.OP_SEQUENCE {
			t.Fatalf("request over ca_maxrequestsize: %s, want SEQUENCE REQ_TOO_BIG", summary(res))
		}
		// The slot did not move: the next request reuses its sequence ID.
		if c.SlotSeq() != seq {
			t.Fatalf("slot advanced")
		}
		must(t)(c.Compound(opPutRoot(), opGetFH()))
	})

	t.Run("REP_TOO_BIG_TO_CACHE", func(t *testing.T) {
		c := newClientID(t, ts)
		fore := kernelFore
		fore.CaMaxresponsesizeCached = 300
		ok, st := createSession(t, c, 0, fore, kernelBack)
		if st != nfs4.NFS4_OK {
			t.Fatalf("CREATE_SESSION: %v", statName(st))
		}
		if err := c.ReclaimComplete(testCtx(t)); err != nil {
			t.Fatalf("RECLAIM_COMPLETE: %v", err)
		}
		cached := ok.CsrForeChanAttrs.CaMaxresponsesizeCached
		sid, fh := openFile(t, c, "cache-me", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
		must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, make([]byte, cached+1000))))
		read := []nfs4.NfsArgop4{opPutFH(fh), opRead(sid, 0, cached+1000)}
		// Not asked to cache: the whole reply.
		must(t)(c.Compound(read...))
		// Asked to cache: it does not fit the cache.
		ctx := testCtx(t)
		res, raw, seq, err := c.CompoundRaw(ctx, read...)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE || len(res.Resarray) != 3 || res.Resarray[2].Resop != nfs4.OP_READ {
			t.Fatalf("cached READ over ca_maxresponsesize_cached %d: %s, want READ REP_TOO_BIG_TO_CACHE", cached, summary(res))
		}
		// That reply was cached: a retransmission gets it again.
		args := &nfs4.COMPOUND4args{Minorversion: c.Minor,
			Argarray: append([]nfs4.NfsArgop4{wiretest.Seq(c.SessionID, 0, seq, true)}, read...)}
		_, raw2, err := c.Send(ctx, args)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw, raw2) {
			t.Fatal("retransmission got another reply than the cached one")
		}
	})
}

// TestCreateSessionOtherPrincipal: the CREATE_SESSION that confirms a
// client ID must come from the principal that sent EXCHANGE_ID, or it is
// NFS4ERR_CLID_INUSE; once the client ID is confirmed, any principal may
// add a session (RFC 8881 §18.36.4 checks the principal in the
// confirmation phase only; TestPynfsCases/CSESS10). An AUTH_SYS principal
// is a uid on a machine.
func TestCreateSessionOtherPrincipal(t *testing.T) {
	ts := startServer(t, Config{})
	for _, tc := range []struct {
		name string
		cred rpc.OpaqueAuth
	}{
		{"other machine", rpc.AuthSysCred(rpc.AuthSysParams{Machine: "elsewhere", UID: 0})},
		{"other uid", rpc.AuthSysCred(rpc.AuthSysParams{Machine: "wiretest", UID: 1000, GID: 1000})},
		{"AUTH_NONE", rpc.OpaqueAuth{Flavor: rpc.AuthNone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, confirmed := range []bool{false, true} {
				c := newClientID(t, ts)
				if confirmed {
					if _, st := createSession(t, c, 0, kernelFore, kernelBack); st != nfs4.NFS4_OK {
						t.Fatalf("CREATE_SESSION: %v", statName(st))
					}
				}
				own := c.Cred
				c.Cred = tc.cred
				want := nfs4.NFS4ERR_CLID_INUSE
				if confirmed {
					want = nfs4.NFS4_OK
				}
				if _, st := createSession(t, c, 0, kernelFore, kernelBack); st != want {
					t.Errorf("confirmed=%v: CREATE_SESSION from %s: %v, want %v", confirmed, tc.name, statName(st), statName(want))
				}
				c.Cred = own
				if _, st := createSession(t, c, 0, kernelFore, kernelBack); st != nfs4.NFS4_OK {
					t.Errorf("confirmed=%v: CREATE_SESSION from the client ID's own principal: %v", confirmed, statName(st))
				}
			}
		})
	}
}
