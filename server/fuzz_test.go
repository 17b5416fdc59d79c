package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
)

// fuzzSession is a placeholder session ID in fuzz inputs. The harness
// replaces it (and the sequence and slot IDs after it) with a live
// session's values, so mutated inputs get past SEQUENCE and reach the
// operations; a fuzzer could never guess a random session ID.
var fuzzSession = nfs4.Sessionid4{0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f}

// currentSid is the special "current stateid" (RFC 8881 §16.2.3.1.2).
var currentSid = nfs4.Stateid4{Seqid: 1}

func fuzzSeeds() [][]nfs4.NfsArgop4 {
	rw := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
	link := nfs4.Linktext4("t")
	return [][]nfs4.NfsArgop4{
		{opPutRoot(), opGetFH(), opGetattr(readableAttrs()...), opGetattr(supportedAttrs...)},
		{opPutRoot(), opMkdir("d"), opGetattr(nfs4.FATTR4_TYPE), opLookupP(), opReaddir(0, nfs4.Verifier4{}, 4096, nfs4.FATTR4_FILEID)},
		{opPutRoot(), opOpen(0, openArgs{name: "f", access: rw, create: true, mode: nfs4.UNCHECKED4, attrs: fattr(aMode(0o644), aSize(0))}),
			opSaveFH(), opWrite(currentSid, 0, nfs4.UNSTABLE4, []byte("hello")), opRead(currentSid, 0, 100), opCommit(),
			opLockNew(nfs4.WRITE_LT, 0, 10, currentSid, 0, "l"), opLockU(nfs4.WRITE_LT, 0, 10, currentSid),
			opRestFH(), opClose(currentSid)},
		{opPutRoot(), opOpen(0, openArgs{name: "x", access: rw, create: true, mode: nfs4.EXCLUSIVE4_1, verf: nfs4.Verifier4{1}}),
			opSetattr(currentSid, fattr(aSize(100), aMode(0o600), aOwner("1000"), aGroup("1000"))),
			nfs4.NfsArgop4{Argop: nfs4.OP_SEEK, Opseek: &nfs4.SEEK4args{SaStateid: currentSid, SaWhat: nfs4.NFS4_CONTENT_HOLE}},
			nfs4.NfsArgop4{Argop: nfs4.OP_DEALLOCATE, Opdeallocate: &nfs4.DEALLOCATE4args{DaStateid: currentSid, DaLength: 10}},
			nfs4.NfsArgop4{Argop: nfs4.OP_READ_PLUS, OpreadPlus: &nfs4.READPLUS4args{RpaStateid: currentSid, RpaCount: 100}},
			nfs4.NfsArgop4{Argop: nfs4.OP_ALLOCATE, Opallocate: &nfs4.ALLOCATE4args{AaStateid: currentSid, AaOffset: 50, AaLength: 100}},
			opOpenDowngrade(currentSid, nfs4.OPEN4_SHARE_ACCESS_READ, 0), opClose(currentSid)},
		{opPutRoot(), opCreate("l", nfs4.Createtype4{Type: nfs4.NF4LNK, Linkdata: &link}, nfs4.Fattr4{}), opReadlink(),
			opPutRoot(), opSaveFH(), opRename("l", "l2"), opLookup("l2"), opSaveFH(), opPutRoot(), opLink("l3"), opRemove("l3")},
		{opPutRoot(), opVerify(fattr(aMode(0o755))), opNVerify(fattr(aType(2))),
			nfs4.NfsArgop4{Argop: nfs4.OP_ACCESS, Opaccess: &nfs4.ACCESS4args{Access: 0x3f}}},
		{opPutRoot(), opLockT(nfs4.READ_LT, 0, 1, 0, "l"),
			nfs4.NfsArgop4{Argop: nfs4.OP_TEST_STATEID, OptestStateid: &nfs4.TESTSTATEID4args{TsStateids: []nfs4.Stateid4{currentSid}}},
			nfs4.NfsArgop4{Argop: nfs4.OP_FREE_STATEID, OpfreeStateid: &nfs4.FREESTATEID4args{FsaStateid: currentSid}}},
		{nfs4.NfsArgop4{Argop: nfs4.OP_RECLAIM_COMPLETE, OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{RcaOneFs: true}},
			nfs4.NfsArgop4{Argop: nfs4.OP_BACKCHANNEL_CTL, OpbackchannelCtl: &nfs4.BACKCHANNELCTL4args{BcaCbProgram: wiretest.CBProgram}}},
		{opPutRoot(), nfs4.NfsArgop4{Argop: nfs4.OP_SECINFO, Opsecinfo: &nfs4.SECINFO4args{Name: []byte("d")}}},
		{opPutRoot(), opOpen(0, openArgs{name: "c", access: rw, create: true, mode: nfs4.UNCHECKED4}),
			opWrite(currentSid, 0, nfs4.FILE_SYNC4, []byte("copy me")), opSaveFH(),
			nfs4.NfsArgop4{Argop: nfs4.OP_COPY, Opcopy: &nfs4.COPY4args{CaSrcStateid: currentSid, CaDstStateid: currentSid,
				CaDstOffset: 100, CaCount: 7, CaConsecutive: true}},
			nfs4.NfsArgop4{Argop: nfs4.OP_CLONE, Opclone: &nfs4.CLONE4args{ClSrcStateid: currentSid, ClDstStateid: currentSid,
				ClDstOffset: 1 << 16}},
			nfs4.NfsArgop4{Argop: nfs4.OP_OFFLOAD_STATUS, OpoffloadStatus: &nfs4.OFFLOADSTATUS4args{OsaStateid: currentSid}},
			nfs4.NfsArgop4{Argop: nfs4.OP_OFFLOAD_CANCEL, OpoffloadCancel: &nfs4.OFFLOADCANCEL4args{OcaStateid: currentSid}}},
		{opPutRoot(), opLookup("f"),
			nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTSTATS, Oplayoutstats: &nfs4.LAYOUTSTATS4args{LsaStateid: currentSid, LsaLength: 10}},
			nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTERROR, Oplayouterror: &nfs4.LAYOUTERROR4args{LeaStateid: currentSid,
				LeaErrors: []nfs4.DeviceError4{{DeStatus: nfs4.NFS4ERR_IO, DeOpnum: nfs4.OP_READ}}}}},
	}
}

func FuzzCompound(f *testing.F) {
	ts := startServer(f, Config{})
	ctx := context.Background()
	c, err := wiretest.Setup(ctx, ts.addr, []byte("fuzz"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	conn := pipeConn(f)

	for _, ops := range fuzzSeeds() {
		all := append([]nfs4.NfsArgop4{wiretest.Seq(fuzzSession, 0, 0, false)}, ops...)
		f.Add(encodeArgs("seed", 2, all...))
	}
	f.Add(encodeArgs("", 1, nfs4.NfsArgop4{Argop: nfs4.OP_EXCHANGE_ID, OpexchangeId: &nfs4.EXCHANGEID4args{
		EiaClientowner: nfs4.ClientOwner4{CoOwnerid: []byte("o")}}}))
	f.Add(encodeArgs("", 1, nfs4.NfsArgop4{Argop: nfs4.OP_CREATE_SESSION, OpcreateSession: &nfs4.CREATESESSION4args{CsaClientid: 1}}))
	f.Add(encodeArgs("", 1, nfs4.NfsArgop4{Argop: nfs4.OP_BIND_CONN_TO_SESSION, OpbindConnToSession: &nfs4.BINDCONNTOSESSION4args{
		BctsaSessid: fuzzSession, BctsaDir: nfs4.CDFC4_BACK}}))
	f.Add(encodeArgs("", 0, opPutRoot()))
	f.Add([]byte{})

	var mu sync.Mutex // fuzz inputs share the session's slot 0
	f.Fuzz(func(t *testing.T, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		args := bytes.Clone(data)
		substituted := false
		if i := bytes.Index(args, fuzzSession[:]); i >= 0 && i+24 <= len(args) {
			copy(args[i:], c.SessionID[:])
			binary.BigEndian.PutUint32(args[i+16:], c.SlotSeq()+1)
			binary.BigEndian.PutUint32(args[i+20:], 0)
			substituted = true
		}
		// Handler panics must surface here, not be turned into SYSTEM_ERR.
		out, st := inProcess(t, ts.srv, conn, args)
		switch st {
		case rpc.Success:
		case rpc.GarbageArgs:
			return
		default:
			t.Fatalf("accept stat %v", st)
		}
		var res nfs4.COMPOUND4res
		if err := xdr.Unmarshal(out, &res); err != nil {
			t.Fatalf("server sent an undecodable COMPOUND reply (%v): %x", err, out)
		}
		t.Logf("%s", summary(&res))
		// Attribute values are opaque to XDR; check them too.
		for i := range res.Resarray {
			r := &res.Resarray[i]
			switch {
			case r.Resop == nfs4.OP_GETATTR && r.Opgetattr.Status == nfs4.NFS4_OK:
				if _, err := decodeAttrs(&r.Opgetattr.Resok4.ObjAttributes); err != nil {
					t.Fatalf("GETATTR result %d: %v", i, err)
				}
			case r.Resop == nfs4.OP_READDIR && r.Opreaddir.Status == nfs4.NFS4_OK:
				for e := r.Opreaddir.Resok4.Reply.Entries; e != nil; e = e.Nextentry {
					if _, err := decodeAttrs(&e.Attrs); err != nil {
						t.Fatalf("READDIR entry %q: %v", e.Name, err)
					}
				}
			}
		}
		if !substituted || len(res.Resarray) == 0 || res.Resarray[0].Resop != nfs4.OP_SEQUENCE {
			return
		}
		switch opStatus(&res.Resarray[0]) {
		case nfs4.NFS4_OK:
			c.AdvanceSlot()
		case nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_STALE_CLIENTID:
			// The input destroyed our session (or client); start over.
			if _, err := c.ExchangeID(ctx, []byte("fuzz"), nfs4.Verifier4{1}); err != nil {
				t.Fatalf("re-establishing the fuzz client: %v", err)
			}
			if _, err := c.CreateSession(ctx, true); err != nil {
				t.Fatalf("re-establishing the fuzz session: %v", err)
			}
		}
	})
}

// FuzzDecodeFH feeds arbitrary bytes to the MDS's and a data server's
// filehandle codecs. Decoding must not panic; whatever decodes must be
// exactly what the codec would encode (so only correctly MAC'd handles get
// through); a data server's codec accepts data handles only; and the two
// codecs agree on data handles.
func FuzzDecodeFH(f *testing.F) {
	master := bytes.Repeat([]byte{0xa5}, 32)
	mds := newFHCodec(master)
	ds := newDataFHCodec(dataFHKey(master))
	for _, h := range []fhandle{
		{kind: fhObject, export: 1, ino: 1},
		{kind: fhObject, export: 0xffff, ino: 1 << 40},
		{kind: fhPseudo},
		{kind: fhPseudo, export: 2},
		{kind: fhData, ino: 1},
		{kind: fhData, ino: 1 << 40},
	} {
		f.Add(mds.encode(h))
	}
	f.Add([]byte{})
	f.Add(make([]byte, fhLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		hm, errM := mds.decode(b)
		if errM == nil && !bytes.Equal(mds.encode(hm), b) {
			t.Fatalf("mds decoded %x to %+v, which encodes differently", b, hm)
		}
		hd, errD := ds.decode(b)
		if errD == nil {
			if hd.kind != fhData {
				t.Fatalf("data server codec decoded a kind-%d handle", hd.kind)
			}
			if !bytes.Equal(ds.encode(hd), b) {
				t.Fatalf("ds decoded %x to %+v, which encodes differently", b, hd)
			}
		}
		if len(b) > 1 && b[1] == fhData && (errM == nil) != (errD == nil) {
			t.Fatalf("codecs disagree on data handle %x: mds %v, ds %v", b, errM, errD)
		}
	})
}
