package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// TestLayoutCommitStateid sends LAYOUTCOMMIT over the wire to a real pNFS
// metadata server (with a real data server) under every kind of stateid a
// client may hold. Only the client's own read/write layout stateid of the
// file may grow its size and set its mtime; anything else is refused with
// NFS4ERR_BADLAYOUT and leaves the file as it was. An older seqid of the
// layout stateid is accepted (state.checkLayoutSeqid).
func TestLayoutCommitStateid(t *testing.T) {
	const n = 5000 // the committed size; no data is written, so the recorded size is all there is
	c := startLayoutCluster(t)
	for _, tc := range []struct {
		name string
		// setup creates the file e.name and returns the stateid to commit
		// with on it.
		setup func(e *lcEnv) nfs4.Stateid4
		want  nfs4.Nfsstat4
	}{
		{"rw layout", func(e *lcEnv) nfs4.Stateid4 {
			return e.layoutGet(e.fh, e.open(), nfs4.LAYOUTIOMODE4_RW)
		}, nfs4.NFS4_OK},
		{"rw layout, seqid 0", func(e *lcEnv) nfs4.Stateid4 {
			ls := e.layoutGet(e.fh, e.open(), nfs4.LAYOUTIOMODE4_RW)
			ls.Seqid = 0
			return ls
		}, nfs4.NFS4_OK},
		{"read layout upgraded to rw", func(e *lcEnv) nfs4.Stateid4 {
			ls := e.layoutGet(e.fh, e.open(), nfs4.LAYOUTIOMODE4_READ)
			return e.layoutGet(e.fh, ls, nfs4.LAYOUTIOMODE4_RW)
		}, nfs4.NFS4_OK},
		{"open stateid", func(e *lcEnv) nfs4.Stateid4 {
			o := e.open()
			e.layoutGet(e.fh, o, nfs4.LAYOUTIOMODE4_RW)
			return o
		}, nfs4.NFS4ERR_BADLAYOUT},
		{"lock stateid", func(e *lcEnv) nfs4.Stateid4 {
			o := e.open()
			e.layoutGet(e.fh, o, nfs4.LAYOUTIOMODE4_RW)
			return e.lock(o)
		}, nfs4.NFS4ERR_BADLAYOUT},
		{"layout of another file", func(e *lcEnv) nfs4.Stateid4 {
			e.layoutGet(e.fh, e.open(), nfs4.LAYOUTIOMODE4_RW)
			otherSid, otherFH := e.openName(e.name+"-other", e.cl)
			return e.layoutGet(otherFH, otherSid, nfs4.LAYOUTIOMODE4_RW)
		}, nfs4.NFS4ERR_BADLAYOUT},
		{"layout of another file, none of this one", func(e *lcEnv) nfs4.Stateid4 {
			e.open()
			otherSid, otherFH := e.openName(e.name+"-other", e.cl)
			return e.layoutGet(otherFH, otherSid, nfs4.LAYOUTIOMODE4_RW)
		}, nfs4.NFS4ERR_BADLAYOUT},
		{"layout of another client", func(e *lcEnv) nfs4.Stateid4 {
			e.layoutGet(e.fh, e.open(), nfs4.LAYOUTIOMODE4_RW)
			cl2 := e.client(e.name + "-client2")
			sid2, _ := e.openName(e.name, cl2)
			return e.layoutGetAs(cl2, e.fh, sid2, nfs4.LAYOUTIOMODE4_RW)
		}, nfs4.NFS4ERR_BADLAYOUT},
		{"read-only layout", func(e *lcEnv) nfs4.Stateid4 {
			return e.layoutGet(e.fh, e.open(), nfs4.LAYOUTIOMODE4_READ)
		}, nfs4.NFS4ERR_BADLAYOUT},
		{"returned layout", func(e *lcEnv) nfs4.Stateid4 {
			ls := e.layoutGet(e.fh, e.open(), nfs4.LAYOUTIOMODE4_RW)
			e.layoutReturn(ls)
			return ls
		}, nfs4.NFS4ERR_BADLAYOUT},
		// An older seqid of the current layout is accepted: Linux may
		// not have seen the LAYOUTGET that moved it, and resends its
		// LAYOUTCOMMIT unchanged on NFS4ERR_OLD_STATEID.
		{"old layout seqid", func(e *lcEnv) nfs4.Stateid4 {
			ls := e.layoutGet(e.fh, e.open(), nfs4.LAYOUTIOMODE4_RW)
			e.layoutGet(e.fh, ls, nfs4.LAYOUTIOMODE4_RW)
			return ls
		}, nfs4.NFS4_OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			name := strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)
			e := &lcEnv{t: t, ctx: ctx, c: c, name: name}
			e.cl = e.client(name)
			sid := tc.setup(e)
			ino := e.ino()

			mtime := time.Unix(1_700_000_000, 123_000_000)
			res, err := e.cl.Compound(opPut(e.fh), nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
				LocaLength: n, LocaStateid: sid,
				LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: ref(uint64(n - 1))},
				LocaTimeModify: nfs4.Newtime4{NtTimechanged: true, NtTime: &nfs4.Nfstime4{
					Seconds: mtime.Unix(), Nseconds: uint32(mtime.Nanosecond())}},
				LocaLayoutupdate: nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_NFSV4_1_FILES},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want {
				// Go on: the size and mtime show what the commit did.
				t.Errorf("LAYOUTCOMMIT: %v, want %v", res.Status, tc.want)
			}
			wantSize := uint64(0)
			if tc.want == nfs4.NFS4_OK {
				wantSize = n
				if res.Status == nfs4.NFS4_OK {
					if ns := res.Resarray[2].Oplayoutcommit.LocrResok4.LocrNewsize; !ns.NsSizechanged || *ns.NsSize != n {
						t.Errorf("LAYOUTCOMMIT new size %+v, want %d", ns, n)
					}
				}
			}
			size, mt := e.sizeAndMtime()
			if size != wantSize {
				t.Errorf("size at the MDS after LAYOUTCOMMIT %d, want %d", size, wantSize)
			}
			if mt.Equal(mtime) != (tc.want == nfs4.NFS4_OK) {
				t.Errorf("mtime after LAYOUTCOMMIT %v (committed %v, status %v)", mt, mtime, res.Status)
			}
			a, err := c.MDS.Server.Meta().GetAttr(ctx, ino)
			if err != nil {
				t.Fatal(err)
			}
			if a.Size != wantSize {
				t.Errorf("recorded size after LAYOUTCOMMIT %d, want %d", a.Size, wantSize)
			}
		})
	}
}

func startLayoutCluster(t *testing.T) *wiring.Cluster {
	t.Helper()
	f := false
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := wiring.Start(ctx, wiring.Config{
		Dir: t.TempDir(), DataServers: 1, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		// Long enough that no lease runs out during the test.
		Lease:  60 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
		// Two clients open one file for writing; a delegation of the
		// first would hold the second back until a lease passed.
		NoDelegations: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// lcEnv is one LAYOUTCOMMIT case: a client and the file it commits on.
type lcEnv struct {
	t    *testing.T
	ctx  context.Context
	c    *wiring.Cluster
	cl   *wiretest.Client
	name string // of the file, in the root directory
	fh   []byte // set by open
}

func (e *lcEnv) client(owner string) *wiretest.Client {
	e.t.Helper()
	cl, err := wiretest.Setup(e.ctx, e.c.MDS.Addr.String(), []byte(owner))
	if err != nil {
		e.t.Fatalf("client setup: %v", err)
	}
	e.t.Cleanup(func() { cl.Close() })
	return cl
}

// compound runs ops on cl and fails the test unless all succeed.
func (e *lcEnv) compound(cl *wiretest.Client, what string, ops ...nfs4.NfsArgop4) *nfs4.COMPOUND4res {
	e.t.Helper()
	res, err := cl.Compound(ops...)
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	if err := wiretest.Check(res); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	return res
}

// open creates and opens the case's file for reading and writing.
func (e *lcEnv) open() nfs4.Stateid4 {
	e.t.Helper()
	sid, fh := e.openName(e.name, e.cl)
	e.fh = fh
	return sid
}

// openName opens (creating if needed) name in the root directory for
// reading and writing with cl, and returns the open stateid and the
// filehandle.
func (e *lcEnv) openName(name string, cl *wiretest.Client) (nfs4.Stateid4, []byte) {
	e.t.Helper()
	file := nfs4.Component4(name)
	res := e.compound(cl, "OPEN "+name, nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH},
		nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
			ShareAccess: nfs4.OPEN4_SHARE_ACCESS_BOTH,
			Owner:       nfs4.OpenOwner4{Clientid: cl.ClientID, Owner: []byte("o1")},
			Openhow: nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: &nfs4.Createhow4{
				Mode: nfs4.UNCHECKED4, Createattrs: &nfs4.Fattr4{}}},
			Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: &file},
		}},
		nfs4.NfsArgop4{Argop: nfs4.OP_GETFH})
	return res.Resarray[2].Opopen.Resok4.Stateid, bytes.Clone(res.Resarray[3].Opgetfh.Resok4.Object)
}

func (e *lcEnv) layoutGet(fh []byte, sid nfs4.Stateid4, mode nfs4.Layoutiomode4) nfs4.Stateid4 {
	e.t.Helper()
	return e.layoutGetAs(e.cl, fh, sid, mode)
}

func (e *lcEnv) layoutGetAs(cl *wiretest.Client, fh []byte, sid nfs4.Stateid4, mode nfs4.Layoutiomode4) nfs4.Stateid4 {
	e.t.Helper()
	res := e.compound(cl, fmt.Sprintf("LAYOUTGET %v", mode), opPut(fh), nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTGET, Oplayoutget: &nfs4.LAYOUTGET4args{
		LogaLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, LogaIomode: mode,
		LogaLength: ^uint64(0), LogaStateid: sid, LogaMaxcount: 1 << 16,
	}})
	lg := res.Resarray[2].Oplayoutget.LogrResok4
	if len(lg.LogrLayout) != 1 || lg.LogrLayout[0].LoIomode != mode {
		e.t.Fatalf("LAYOUTGET %v granted %+v", mode, lg.LogrLayout)
	}
	return lg.LogrStateid
}

// lock takes a write lock on the whole file under a new lock-owner and
// returns the lock stateid.
func (e *lcEnv) lock(openSid nfs4.Stateid4) nfs4.Stateid4 {
	e.t.Helper()
	res := e.compound(e.cl, "LOCK", opPut(e.fh), nfs4.NfsArgop4{Argop: nfs4.OP_LOCK, Oplock: &nfs4.LOCK4args{
		Locktype: nfs4.WRITE_LT, Offset: 0, Length: ^uint64(0),
		Locker: nfs4.Locker4{NewLockOwner: true, OpenOwner: &nfs4.OpenToLockOwner4{
			OpenStateid: openSid, LockOwner: nfs4.LockOwner4{Clientid: e.cl.ClientID, Owner: []byte("lo")}}},
	}})
	return res.Resarray[2].Oplock.Resok4.LockStateid
}

func (e *lcEnv) layoutReturn(sid nfs4.Stateid4) {
	e.t.Helper()
	e.compound(e.cl, "LAYOUTRETURN", opPut(e.fh), nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTRETURN, Oplayoutreturn: &nfs4.LAYOUTRETURN4args{
		LoraLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, LoraIomode: nfs4.LAYOUTIOMODE4_ANY,
		LoraLayoutreturn: nfs4.Layoutreturn4{LrReturntype: nfs4.LAYOUTRETURN4_FILE, LrLayout: &nfs4.LayoutreturnFile4{
			LrfLength: ^uint64(0), LrfStateid: sid}},
	}})
}

func (e *lcEnv) ino() meta.Ino {
	e.t.Helper()
	nd, err := e.c.MDS.Server.Meta().Lookup(e.ctx, 1, e.name)
	if err != nil {
		e.t.Fatalf("looking up %s: %v", e.name, err)
	}
	return nd.Ino
}

// sizeAndMtime reads size and time_modify with GETATTR at the MDS.
func (e *lcEnv) sizeAndMtime() (uint64, time.Time) {
	e.t.Helper()
	mask := nfs4.Bitmap4{1 << nfs4.FATTR4_SIZE, 1 << (nfs4.FATTR4_TIME_MODIFY - 32)}
	res := e.compound(e.cl, "GETATTR", opPut(e.fh), nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: mask}})
	fa := res.Resarray[2].Opgetattr.Resok4.ObjAttributes
	v := fa.AttrVals
	if len(fa.Attrmask) < 2 || fa.Attrmask[0] != mask[0] || fa.Attrmask[1] != mask[1] || len(v) != 8+12 {
		e.t.Fatalf("GETATTR returned mask %v with %d bytes", fa.Attrmask, len(v))
	}
	sec := int64(binary.BigEndian.Uint64(v[8:16]))
	return binary.BigEndian.Uint64(v[0:8]), time.Unix(sec, int64(binary.BigEndian.Uint32(v[16:20])))
}

func opPut(fh []byte) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_PUTFH, Opputfh: &nfs4.PUTFH4args{Object: fh}}
}

func ref[T any](v T) *T { return &v }

// TestLayoutGetGrantedIOMode asks for a read/write layout under a
// read-only open. The server grants a READ layout, and its reply must say
// READ: a client told RW would believe it may write through the layout,
// and its LAYOUTCOMMIT would then be refused.
func TestLayoutGetGrantedIOMode(t *testing.T) {
	c := startLayoutCluster(t)
	for _, tc := range []struct {
		name   string
		access uint32
		want   nfs4.Layoutiomode4
	}{
		{"read open", nfs4.OPEN4_SHARE_ACCESS_READ, nfs4.LAYOUTIOMODE4_READ},
		{"read-write open", nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.LAYOUTIOMODE4_RW},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			name := "iomode-" + strings.ReplaceAll(tc.name, " ", "-")
			e := &lcEnv{t: t, ctx: ctx, c: c, name: name}
			e.cl = e.client(name)
			e.open() // creates the file
			file := nfs4.Component4(name)
			res := e.compound(e.cl, "OPEN for reading", nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH},
				nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
					ShareAccess: tc.access,
					Owner:       nfs4.OpenOwner4{Clientid: e.cl.ClientID, Owner: []byte("o2")},
					Openhow:     nfs4.Openflag4{Opentype: nfs4.OPEN4_NOCREATE},
					Claim:       nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: &file},
				}})
			sid := res.Resarray[2].Opopen.Resok4.Stateid
			res = e.compound(e.cl, "LAYOUTGET RW", opPut(e.fh), nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTGET, Oplayoutget: &nfs4.LAYOUTGET4args{
				LogaLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, LogaIomode: nfs4.LAYOUTIOMODE4_RW,
				LogaLength: ^uint64(0), LogaStateid: sid, LogaMaxcount: 1 << 16,
			}})
			lg := res.Resarray[2].Oplayoutget.LogrResok4
			if len(lg.LogrLayout) != 1 || lg.LogrLayout[0].LoIomode != tc.want {
				t.Fatalf("LAYOUTGET RW under a %s granted %+v, want iomode %v", tc.name, lg.LogrLayout, tc.want)
			}
		})
	}
}

// TestLayoutGetRangeAndSeqid: LAYOUTGET refuses a range shorter than
// loga_minlength, or running past the largest offset, with NFS4ERR_INVAL
// (RFC 8881 §18.43.3). Under a layout stateid it takes an older seqid than
// the current one, as parallel LAYOUTGETs of one client carry (§12.5.3),
// but not one the server has not issued.
func TestLayoutGetRangeAndSeqid(t *testing.T) {
	c := startLayoutCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := &lcEnv{t: t, ctx: ctx, c: c, name: "layoutget-args"}
	e.cl = e.client(e.name)
	open := e.open()
	layoutGet := func(sid nfs4.Stateid4, off, length, minLength uint64) (*nfs4.COMPOUND4res, error) {
		return e.cl.Compound(opPut(e.fh), nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTGET, Oplayoutget: &nfs4.LAYOUTGET4args{
			LogaLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, LogaIomode: nfs4.LAYOUTIOMODE4_RW,
			LogaOffset: off, LogaLength: length, LogaMinlength: minLength, LogaStateid: sid, LogaMaxcount: 1 << 16,
		}})
	}
	const all = ^uint64(0)
	for _, tc := range []struct {
		name                   string
		off, length, minLength uint64
		want                   nfs4.Nfsstat4
	}{
		{"length below minlength", 0, 100, 200, nfs4.NFS4ERR_INVAL},
		{"minlength past the largest offset", 1 << 63, all, 1<<63 + 1, nfs4.NFS4ERR_INVAL},
		{"length past the largest offset", 1 << 63, 1<<63 + 1, 0, nfs4.NFS4ERR_INVAL},
		{"to EOF from far out", 1 << 63, all, all, nfs4.NFS4_OK},
		{"minlength equal to length", 0, 4096, 4096, nfs4.NFS4_OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := layoutGet(open, tc.off, tc.length, tc.minLength)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want {
				t.Fatalf("LAYOUTGET offset %d length %d minlength %d: %v, want %v", tc.off, tc.length, tc.minLength, res.Status, tc.want)
			}
		})
	}

	t.Run("seqids", func(t *testing.T) {
		ls := e.layoutGet(e.fh, open, nfs4.LAYOUTIOMODE4_RW)
		// Two LAYOUTGETs that left together with seqid ls.Seqid: the
		// server bumps the seqid for the first, and still serves the
		// second.
		first := e.layoutGet(e.fh, ls, nfs4.LAYOUTIOMODE4_RW)
		res, err := layoutGet(ls, 0, all, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTGET with seqid %d after the server issued %d: %v, want OK", ls.Seqid, first.Seqid, res.Status)
		}
		second := res.Resarray[2].Oplayoutget.LogrResok4.LogrStateid
		if second.Other != ls.Other || second.Seqid != first.Seqid+1 {
			t.Errorf("seqids %d then %d, want consecutive", first.Seqid, second.Seqid)
		}
		future := second
		future.Seqid++
		res, err = layoutGet(future, 0, all, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != nfs4.NFS4ERR_BAD_STATEID {
			t.Errorf("LAYOUTGET with a seqid not issued yet: %v, want BAD_STATEID", res.Status)
		}
	})
}
