package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Test harness: a real Server on 127.0.0.1, restartable on the same data
// directory, plus operation builders and attribute decoding for the raw
// wiretest client.

var noSquash = false

// panicWatch is a slog handler that counts error records about handler
// panics, so a test fails even when the RPC layer turned a panic into
// SYSTEM_ERR and the client saw nothing special.
type panicWatch struct {
	panics *atomic.Int64
	mu     *sync.Mutex
	msgs   *[]string
}

func (h panicWatch) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h panicWatch) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "panic") {
		h.panics.Add(1)
		var sb strings.Builder
		sb.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&sb, " %s=%v", a.Key, a.Value)
			return true
		})
		h.mu.Lock()
		*h.msgs = append(*h.msgs, sb.String())
		h.mu.Unlock()
	}
	return nil
}
func (h panicWatch) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h panicWatch) WithGroup(string) slog.Handler      { return h }

type testServer struct {
	t    testing.TB
	cfg  Config
	srv  *Server
	addr string
	done chan error

	panics atomic.Int64
	mu     sync.Mutex
	msgs   []string
}

// defaultExports is one read-write export of / without root squashing, so
// tests can act as root.
func defaultExports() []*Export {
	return []*Export{{Path: "/", RootSquash: &noSquash}}
}

// startServer starts a server in a fresh temporary directory. cfg.Dir and
// cfg.Logger are filled in; nil Exports means defaultExports.
func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Exports == nil {
		cfg.Exports = defaultExports()
	}
	ts := &testServer{t: t, cfg: cfg}
	ts.cfg.Logger = slog.New(panicWatch{panics: &ts.panics, mu: &ts.mu, msgs: &ts.msgs})
	ts.start()
	t.Cleanup(func() {
		ts.stop()
		if n := ts.panics.Load(); n > 0 {
			t.Errorf("server logged %d handler panics: %q", n, ts.msgs)
		}
	})
	return ts
}

func cloneExports(in []*Export) []*Export {
	out := make([]*Export, len(in))
	for i, e := range in {
		c := *e
		c.Clients = slices.Clone(e.Clients)
		c.nets = nil
		out[i] = &c
	}
	return out
}

func (ts *testServer) start() {
	ts.t.Helper()
	cfg := ts.cfg
	cfg.Exports = cloneExports(ts.cfg.Exports)
	srv, err := New(cfg)
	if err != nil {
		ts.t.Fatalf("server.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		ts.t.Fatalf("listen: %v", err)
	}
	ts.srv, ts.addr, ts.done = srv, ln.Addr().String(), make(chan error, 1)
	go func() { ts.done <- srv.Serve(ln) }()
}

func (ts *testServer) stop() {
	if ts.srv == nil {
		return
	}
	if err := ts.srv.Close(); err != nil {
		ts.t.Errorf("server Close: %v", err)
	}
	<-ts.done
	ts.srv = nil
}

// restart closes the server and starts a new one on the same directory (on
// a new port).
func (ts *testServer) restart() {
	ts.t.Helper()
	ts.stop()
	ts.start()
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var ownerSeq atomic.Int64

// client dials the server and sets up a client ID and a session. Each call
// uses a distinct client owner.
func (ts *testServer) client() *wiretest.Client {
	ts.t.Helper()
	return ts.clientOwner(fmt.Sprintf("wiretest-%d", ownerSeq.Add(1)))
}

func (ts *testServer) clientOwner(owner string) *wiretest.Client {
	ts.t.Helper()
	c, err := wiretest.Setup(testCtx(ts.t), ts.addr, []byte(owner))
	if err != nil {
		ts.t.Fatalf("client setup: %v", err)
	}
	ts.t.Cleanup(func() { c.Close() })
	return c
}

// reclaiming dials the server and sets up a client ID and a session, but
// sends no RECLAIM_COMPLETE: a client that may still reclaim, or one that
// skips it (its new opens and locks get NFS4ERR_GRACE).
func (ts *testServer) reclaiming() *wiretest.Client {
	ts.t.Helper()
	c, err := wiretest.SetupReclaiming(testCtx(ts.t), ts.addr, []byte(fmt.Sprintf("reclaiming-%d", ownerSeq.Add(1))))
	if err != nil {
		ts.t.Fatalf("client setup: %v", err)
	}
	ts.t.Cleanup(func() { c.Close() })
	return c
}

// dial connects without any NFS setup.
func (ts *testServer) dial() *wiretest.Client {
	ts.t.Helper()
	c, err := wiretest.Dial(testCtx(ts.t), ts.addr)
	if err != nil {
		ts.t.Fatalf("dial: %v", err)
	}
	ts.t.Cleanup(func() { c.Close() })
	return c
}

// ---- operation builders ----

func opPutRoot() nfs4.NfsArgop4 { return nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH} }
func opGetFH() nfs4.NfsArgop4   { return nfs4.NfsArgop4{Argop: nfs4.OP_GETFH} }
func opSaveFH() nfs4.NfsArgop4  { return nfs4.NfsArgop4{Argop: nfs4.OP_SAVEFH} }
func opRestFH() nfs4.NfsArgop4  { return nfs4.NfsArgop4{Argop: nfs4.OP_RESTOREFH} }
func opLookupP() nfs4.NfsArgop4 { return nfs4.NfsArgop4{Argop: nfs4.OP_LOOKUPP} }
func opReadlink() nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_READLINK}
}
func opPutFH(fh []byte) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_PUTFH, Opputfh: &nfs4.PUTFH4args{Object: fh}}
}
func opLookup(name string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LOOKUP, Oplookup: &nfs4.LOOKUP4args{Objname: []byte(name)}}
}
func opGetattr(attrs ...uint32) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: makeBitmap(attrs)}}
}
func opMkdir(name string) nfs4.NfsArgop4 {
	return opCreate(name, nfs4.Createtype4{Type: nfs4.NF4DIR}, nfs4.Fattr4{})
}
func opCreate(name string, typ nfs4.Createtype4, attrs nfs4.Fattr4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_CREATE, Opcreate: &nfs4.CREATE4args{Objtype: typ, Objname: []byte(name), Createattrs: attrs}}
}
func opRemove(name string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_REMOVE, Opremove: &nfs4.REMOVE4args{Target: []byte(name)}}
}
func opRename(from, to string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_RENAME, Oprename: &nfs4.RENAME4args{Oldname: []byte(from), Newname: []byte(to)}}
}
func opLink(name string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LINK, Oplink: &nfs4.LINK4args{Newname: []byte(name)}}
}
func opSetattr(sid nfs4.Stateid4, f nfs4.Fattr4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_SETATTR, Opsetattr: &nfs4.SETATTR4args{Stateid: sid, ObjAttributes: f}}
}
func opVerify(f nfs4.Fattr4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_VERIFY, Opverify: &nfs4.VERIFY4args{ObjAttributes: f}}
}
func opNVerify(f nfs4.Fattr4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_NVERIFY, Opnverify: &nfs4.NVERIFY4args{ObjAttributes: f}}
}
func opReaddir(cookie uint64, verf nfs4.Verifier4, maxcount uint32, attrs ...uint32) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_READDIR, Opreaddir: &nfs4.READDIR4args{
		Cookie: cookie, Cookieverf: verf, Dircount: maxcount, Maxcount: maxcount, AttrRequest: makeBitmap(attrs)}}
}
func opWrite(sid nfs4.Stateid4, off uint64, stable nfs4.StableHow4, data []byte) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{Stateid: sid, Offset: off, Stable: stable, Data: data}}
}
func opRead(sid nfs4.Stateid4, off uint64, count uint32) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{Stateid: sid, Offset: off, Count: count}}
}
func opCommit() nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_COMMIT, Opcommit: &nfs4.COMMIT4args{}}
}
func opClose(sid nfs4.Stateid4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_CLOSE, Opclose: &nfs4.CLOSE4args{OpenStateid: sid}}
}
func opOpenDowngrade(sid nfs4.Stateid4, access, deny uint32) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_OPEN_DOWNGRADE, OpopenDowngrade: &nfs4.OPENDOWNGRADE4args{OpenStateid: sid, ShareAccess: access, ShareDeny: deny}}
}

// openArgs describes an OPEN; the zero value opens name for reading.
type openArgs struct {
	name         string
	owner        string
	access, deny uint32
	create       bool
	mode         nfs4.Createmode4
	attrs        nfs4.Fattr4
	verf         nfs4.Verifier4
	claim        nfs4.OpenClaimType4 // default CLAIM_NULL
}

func opOpen(clientid uint64, a openArgs) nfs4.NfsArgop4 {
	if a.access == 0 {
		a.access = nfs4.OPEN4_SHARE_ACCESS_READ
	}
	if a.owner == "" {
		a.owner = "owner"
	}
	args := &nfs4.OPEN4args{
		ShareAccess: a.access, ShareDeny: a.deny,
		Owner: nfs4.OpenOwner4{Clientid: clientid, Owner: []byte(a.owner)},
	}
	if a.create {
		how := &nfs4.Createhow4{Mode: a.mode}
		switch a.mode {
		case nfs4.UNCHECKED4, nfs4.GUARDED4:
			how.Createattrs = &a.attrs
		case nfs4.EXCLUSIVE4:
			how.Createverf = &a.verf
		case nfs4.EXCLUSIVE4_1:
			how.ChCreateboth = &nfs4.Creatverfattr{CvaVerf: a.verf, CvaAttrs: a.attrs}
		}
		args.Openhow = nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: how}
	}
	switch a.claim {
	case nfs4.CLAIM_NULL:
		name := []byte(a.name)
		args.Claim = nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: &name}
	case nfs4.CLAIM_PREVIOUS:
		dt := nfs4.OPEN_DELEGATE_NONE
		args.Claim = nfs4.OpenClaim4{Claim: nfs4.CLAIM_PREVIOUS, DelegateType: &dt}
	default:
		args.Claim = nfs4.OpenClaim4{Claim: a.claim}
	}
	return nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: args}
}

func opLockNew(typ nfs4.NfsLockType4, off, length uint64, openSid nfs4.Stateid4, clientid uint64, owner string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LOCK, Oplock: &nfs4.LOCK4args{
		Locktype: typ, Offset: off, Length: length,
		Locker: nfs4.Locker4{NewLockOwner: true, OpenOwner: &nfs4.OpenToLockOwner4{
			OpenStateid: openSid, LockOwner: nfs4.LockOwner4{Clientid: clientid, Owner: []byte(owner)}}},
	}}
}
func opLockExisting(typ nfs4.NfsLockType4, off, length uint64, lockSid nfs4.Stateid4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LOCK, Oplock: &nfs4.LOCK4args{
		Locktype: typ, Offset: off, Length: length,
		Locker: nfs4.Locker4{LockOwner: &nfs4.ExistLockOwner4{LockStateid: lockSid}},
	}}
}
func opLockT(typ nfs4.NfsLockType4, off, length uint64, clientid uint64, owner string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LOCKT, Oplockt: &nfs4.LOCKT4args{
		Locktype: typ, Offset: off, Length: length, Owner: nfs4.LockOwner4{Clientid: clientid, Owner: []byte(owner)}}}
}
func opLockU(typ nfs4.NfsLockType4, off, length uint64, sid nfs4.Stateid4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LOCKU, Oplocku: &nfs4.LOCKU4args{Locktype: typ, LockStateid: sid, Offset: off, Length: length}}
}

// ---- result helpers ----

// opStatus returns the status of one operation result: every nfs_resop4
// arm starts with an nfsstat4, so re-encoding and reading the second word
// works for all of them.
func opStatus(r *nfs4.NfsResop4) nfs4.Nfsstat4 {
	b := xdr.Marshal(r)
	if len(b) < 8 {
		return -1
	}
	return nfs4.Nfsstat4(binary.BigEndian.Uint32(b[4:8]))
}

// summary renders a COMPOUND result as "OK" or "NOENT" followed by each
// operation and its status, e.g. "NOENT: SEQUENCE OK, PUTROOTFH OK, LOOKUP NOENT".
func summary(res *nfs4.COMPOUND4res) string {
	var parts []string
	for i := range res.Resarray {
		r := &res.Resarray[i]
		parts = append(parts, opName(r.Resop)+" "+statName(opStatus(r)))
	}
	return statName(res.Status) + ": " + strings.Join(parts, ", ")
}

func opName(op nfs4.NfsOpnum4) string { return strings.TrimPrefix(op.String(), "OP_") }
func statName(s nfs4.Nfsstat4) string {
	return strings.TrimPrefix(strings.TrimPrefix(s.String(), "NFS4ERR_"), "NFS4_")
}

// must returns a function that fails the test unless the COMPOUND it is
// given succeeded: must(t)(c.Compound(...)).
func must(t *testing.T) func(*nfs4.COMPOUND4res, error) *nfs4.COMPOUND4res {
	t.Helper()
	return func(res *nfs4.COMPOUND4res, err error) *nfs4.COMPOUND4res {
		t.Helper()
		if err != nil {
			t.Fatalf("compound: %v", err)
		}
		if res.Status != nfs4.NFS4_OK {
			t.Fatalf("compound failed: %s", summary(res))
		}
		return res
	}
}

// want returns a function that fails the test unless the COMPOUND it is
// given ended with status st: want(t, nfs4.NFS4ERR_NOENT)(c.Compound(...)).
func want(t *testing.T, st nfs4.Nfsstat4) func(*nfs4.COMPOUND4res, error) *nfs4.COMPOUND4res {
	t.Helper()
	return func(res *nfs4.COMPOUND4res, err error) *nfs4.COMPOUND4res {
		t.Helper()
		if err != nil {
			t.Fatalf("compound: %v", err)
		}
		if res.Status != st {
			t.Fatalf("got %s, want status %s", summary(res), statName(st))
		}
		return res
	}
}

// find returns the last result of operation op.
func find(t *testing.T, res *nfs4.COMPOUND4res, op nfs4.NfsOpnum4) *nfs4.NfsResop4 {
	t.Helper()
	for i := len(res.Resarray) - 1; i >= 0; i-- {
		if res.Resarray[i].Resop == op {
			return &res.Resarray[i]
		}
	}
	t.Fatalf("no %s result in %s", opName(op), summary(res))
	return nil
}

func fhOf(t *testing.T, res *nfs4.COMPOUND4res) []byte {
	t.Helper()
	return bytesClone(find(t, res, nfs4.OP_GETFH).Opgetfh.Resok4.Object)
}

func bytesClone(b []byte) []byte { return append([]byte(nil), b...) }

func openSid(t *testing.T, res *nfs4.COMPOUND4res) nfs4.Stateid4 {
	t.Helper()
	return find(t, res, nfs4.OP_OPEN).Opopen.Resok4.Stateid
}

func attrsOf(t *testing.T, res *nfs4.COMPOUND4res) attrMap {
	t.Helper()
	r := find(t, res, nfs4.OP_GETATTR)
	m, err := decodeAttrs(&r.Opgetattr.Resok4.ObjAttributes)
	if err != nil {
		t.Fatalf("decode attributes: %v", err)
	}
	return m
}

// ---- attributes ----

// attrMap holds decoded attribute values: uint32, uint64, string, []byte,
// nfs4.Bitmap4, time.Time, [2]uint64 (fsid) or []uint32 (layout types).
type attrMap map[uint32]any

// decodeAttrs decodes a fattr4 independently of the server's encoder, so
// encoding mistakes show up as decode errors or trailing bytes.
func decodeAttrs(f *nfs4.Fattr4) (attrMap, error) {
	d := xdr.NewDecoder(f.AttrVals)
	m := attrMap{}
	var err error
	bitmapEach(f.Attrmask, func(n uint32) bool {
		switch n {
		case nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_SUPPATTR_EXCLCREAT:
			k := d.ArrayLen(8, 4)
			bm := make(nfs4.Bitmap4, k)
			for i := range bm {
				bm[i] = d.Uint32()
			}
			m[n] = bm
		case nfs4.FATTR4_TYPE, nfs4.FATTR4_FH_EXPIRE_TYPE, nfs4.FATTR4_LEASE_TIME, nfs4.FATTR4_RDATTR_ERROR,
			nfs4.FATTR4_ACLSUPPORT, nfs4.FATTR4_MAXLINK, nfs4.FATTR4_MAXNAME, nfs4.FATTR4_MODE,
			nfs4.FATTR4_NUMLINKS, nfs4.FATTR4_CHANGE_ATTR_TYPE, nfs4.FATTR4_LAYOUT_BLKSIZE,
			nfs4.FATTR4_LAYOUT_ALIGNMENT, nfs4.FATTR4_CLONE_BLKSIZE:
			m[n] = d.Uint32()
		case nfs4.FATTR4_LINK_SUPPORT, nfs4.FATTR4_SYMLINK_SUPPORT, nfs4.FATTR4_NAMED_ATTR,
			nfs4.FATTR4_UNIQUE_HANDLES, nfs4.FATTR4_CANSETTIME, nfs4.FATTR4_CASE_INSENSITIVE,
			nfs4.FATTR4_CASE_PRESERVING, nfs4.FATTR4_CHOWN_RESTRICTED, nfs4.FATTR4_HOMOGENEOUS,
			nfs4.FATTR4_NO_TRUNC, nfs4.FATTR4_XATTR_SUPPORT:
			m[n] = d.Bool()
		case nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE, nfs4.FATTR4_FILEID, nfs4.FATTR4_MOUNTED_ON_FILEID,
			nfs4.FATTR4_FILES_AVAIL, nfs4.FATTR4_FILES_FREE, nfs4.FATTR4_FILES_TOTAL,
			nfs4.FATTR4_MAXFILESIZE, nfs4.FATTR4_MAXREAD, nfs4.FATTR4_MAXWRITE,
			nfs4.FATTR4_SPACE_AVAIL, nfs4.FATTR4_SPACE_FREE, nfs4.FATTR4_SPACE_TOTAL, nfs4.FATTR4_SPACE_USED:
			m[n] = d.Uint64()
		case nfs4.FATTR4_FSID:
			m[n] = [2]uint64{d.Uint64(), d.Uint64()}
		case nfs4.FATTR4_FILEHANDLE:
			m[n] = bytesClone(d.Opaque(128))
		case nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP:
			m[n] = d.String(1024)
		case nfs4.FATTR4_RAWDEV:
			m[n] = [2]uint64{uint64(d.Uint32()), uint64(d.Uint32())}
		case nfs4.FATTR4_TIME_ACCESS, nfs4.FATTR4_TIME_CREATE, nfs4.FATTR4_TIME_DELTA,
			nfs4.FATTR4_TIME_METADATA, nfs4.FATTR4_TIME_MODIFY:
			sec := d.Int64()
			nsec := d.Uint32()
			if nsec >= 1e9 {
				err = fmt.Errorf("attribute %d: nseconds %d", n, nsec)
				return false
			}
			m[n] = time.Unix(sec, int64(nsec))
		case nfs4.FATTR4_OPEN_ARGUMENTS:
			var oa nfs4.OpenArguments4
			oa.DecodeXDR(d)
			m[n] = oa
		case nfs4.FATTR4_MDSTHRESHOLD:
			var th nfs4.Mdsthreshold4
			th.DecodeXDR(d)
			m[n] = th
		case nfs4.FATTR4_FS_LAYOUT_TYPES, nfs4.FATTR4_LAYOUT_TYPES:
			k := d.ArrayLen(64, 4)
			lt := make([]uint32, k)
			for i := range lt {
				lt[i] = d.Uint32()
			}
			m[n] = lt
		default:
			err = fmt.Errorf("attribute %d returned but the test cannot decode it", n)
			return false
		}
		return d.Err() == nil
	})
	if err != nil {
		return nil, err
	}
	if d.Err() != nil {
		return nil, d.Err()
	}
	if d.Remaining() != 0 {
		return nil, fmt.Errorf("%d trailing bytes in attribute values", d.Remaining())
	}
	return m, nil
}

// attrVal is one attribute to encode into a fattr4.
type attrVal struct {
	n   uint32
	enc func(e *xdr.Encoder)
}

func aSize(v uint64) attrVal { return attrVal{nfs4.FATTR4_SIZE, func(e *xdr.Encoder) { e.Uint64(v) }} }
func aMode(v uint32) attrVal { return attrVal{nfs4.FATTR4_MODE, func(e *xdr.Encoder) { e.Uint32(v) }} }
func aOwner(s string) attrVal {
	return attrVal{nfs4.FATTR4_OWNER, func(e *xdr.Encoder) { e.String(s) }}
}
func aGroup(s string) attrVal {
	return attrVal{nfs4.FATTR4_OWNER_GROUP, func(e *xdr.Encoder) { e.String(s) }}
}
func aMtime(t time.Time) attrVal {
	return attrVal{nfs4.FATTR4_TIME_MODIFY_SET, func(e *xdr.Encoder) {
		e.Uint32(uint32(nfs4.SET_TO_CLIENT_TIME4))
		e.Int64(t.Unix())
		e.Uint32(uint32(t.Nanosecond()))
	}}
}
func aAtime(t time.Time) attrVal {
	return attrVal{nfs4.FATTR4_TIME_ACCESS_SET, func(e *xdr.Encoder) {
		e.Uint32(uint32(nfs4.SET_TO_CLIENT_TIME4))
		e.Int64(t.Unix())
		e.Uint32(uint32(t.Nanosecond()))
	}}
}
func aType(v uint32) attrVal { return attrVal{nfs4.FATTR4_TYPE, func(e *xdr.Encoder) { e.Uint32(v) }} }

// fattr encodes attributes in bitmap order.
func fattr(vals ...attrVal) nfs4.Fattr4 {
	sort.Slice(vals, func(i, j int) bool { return vals[i].n < vals[j].n })
	var f nfs4.Fattr4
	e := xdr.NewEncoder(64)
	for _, v := range vals {
		f.Attrmask = bitmapSet(f.Attrmask, v.n)
		v.enc(e)
	}
	f.AttrVals = e.Bytes()
	return f
}

// pollUntil calls cond until it reports true, at most n times, pausing
// between attempts; it reports whether cond became true. Used to wait for
// lease expiry without asserting on how long it takes.
func pollUntil(n int, pause time.Duration, cond func() bool) bool {
	for range n {
		if cond() {
			return true
		}
		time.Sleep(pause)
	}
	return false
}
