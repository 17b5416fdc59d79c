package wiring

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
)

// restartMDS stops the cluster's metadata server and starts a new one on
// the same directory and address, as after a crash and restart; the data
// servers keep running and re-register by themselves.
func restartMDS(t *testing.T, c *Cluster, dir string, lease time.Duration) {
	t.Helper()
	addr := c.MDS.Addr.String()
	if err := c.MDS.Close(); err != nil {
		t.Fatalf("closing the MDS: %v", err)
	}
	f := false
	m, err := StartMDS(MDSConfig{
		Listen: addr, Dir: filepath.Join(dir, "mds"),
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Lease:   lease,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("restarting the MDS on %s: %v", addr, err)
	}
	c.mu.Lock()
	c.MDS = m
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := m.Registry.WaitFor(ctx, len(c.DS)); err != nil {
		t.Fatalf("data servers re-registering: %v", err)
	}
}

// TestLayoutCommitAfterMDSRestart covers a client that wrote through a
// layout to a data server when the MDS restarted before its LAYOUTCOMMIT.
// The Linux client then sends LAYOUTCOMMIT with the layout stateid of the
// previous boot, never with loca_reclaim, and ignores BADLAYOUT: a refusal
// would lose the size growth although the data is on the data server. A
// client that holds a write open of the file again (reclaimed) must get its
// commit; one without a write open, or with a layout that was returned in
// this boot, must not grow the file.
func TestLayoutCommitAfterMDSRestart(t *testing.T) {
	// Grace lasts one lease; long enough that only RECLAIM_COMPLETE ends it
	// (the cases that commit during grace check it still holds afterwards).
	const lease = 60 * time.Second
	const n = 5000 // bytes written past EOF (the file is empty)
	const (
		noReopen = iota
		reclaimRW
		reclaimRead
	)
	for _, tc := range []struct {
		name        string
		restart     bool
		reopen      int  // after the restart
		complete    bool // RECLAIM_COMPLETE before the LAYOUTCOMMIT
		returnFirst bool // LAYOUTRETURN the layout, then commit under it
		locaReclaim bool
		want        nfs4.Nfsstat4
	}{
		{name: "reclaimed write open", restart: true, reopen: reclaimRW, complete: true, want: nfs4.NFS4_OK},
		{name: "reclaimed write open, commit during grace", restart: true, reopen: reclaimRW, want: nfs4.NFS4_OK},
		{name: "reclaimed write open, loca_reclaim during grace", restart: true, reopen: reclaimRW, locaReclaim: true, want: nfs4.NFS4_OK},
		{name: "not reopened", restart: true, complete: true, want: nfs4.NFS4ERR_BADLAYOUT},
		{name: "not reopened, commit during grace", restart: true, want: nfs4.NFS4ERR_BADLAYOUT},
		{name: "reclaimed read-only open", restart: true, reopen: reclaimRead, complete: true, want: nfs4.NFS4ERR_BADLAYOUT},
		{name: "loca_reclaim after grace", restart: true, reopen: reclaimRW, complete: true, locaReclaim: true, want: nfs4.NFS4ERR_NO_GRACE},
		{name: "returned layout of this boot", returnFirst: true, want: nfs4.NFS4ERR_BADLAYOUT},
		{name: "returned layout of this boot, loca_reclaim", returnFirst: true, locaReclaim: true, want: nfs4.NFS4ERR_NO_GRACE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx := ctxT(t)
			c := startClusterIn(t, dir, 1, lease)
			const owner = "restart-client"
			cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte(owner))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()

			// OPEN for write, RW layout, WRITE n bytes at a data server.
			res, err := cl.Compound(
				op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
				openOp(cl.ClientID, nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4("f"))}, true),
				op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}),
			)
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("OPEN: %v", wiretest.Check(res))
			}
			openSid := res.Resarray[2].Opopen.Resok4.Stateid
			fh := bytes.Clone(res.Resarray[3].Opgetfh.Resok4.Object)
			// A layout of its own: one in the OPEN's COMPOUND is
			// declined for a file with no data on the data servers.
			res, err = cl.Compound(putFH(fh), layoutGet(openSid, nfs4.LAYOUTIOMODE4_RW))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("LAYOUTGET: %v", wiretest.Check(res))
			}
			lg := res.Resarray[2].Oplayoutget.LogrResok4
			layoutSid := lg.LogrStateid
			var fl nfs4.Nfsv41FileLayout4
			if err := xdr.Unmarshal(lg.LogrLayout[0].LoContent.LocBody, &fl); err != nil {
				t.Fatal(err)
			}
			data := bytes.Repeat([]byte("0123456789"), n/10)
			ds, err := wiretest.Setup(ctx, c.DS[0].Addr.String(), []byte(owner))
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			res, err = ds.Compound(putFH(fl.NflFhList[0]), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: openSid, Offset: 0, Stable: nfs4.FILE_SYNC4, Data: data}}))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("DS WRITE: %v", wiretest.Check(res))
			}

			var ioSid nfs4.Stateid4 // an open stateid for READ after the commit
			if tc.restart {
				cl.Close()
				restartMDS(t, c, dir, lease)
				// Same owner and verifier: the client's record survived,
				// so it may reclaim (RFC 8881 §8.4.2.1).
				cl, err = wiretest.SetupReclaiming(ctx, c.MDS.Addr.String(), []byte(owner))
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				if tc.reopen != noReopen {
					access := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
					if tc.reopen == reclaimRead {
						access = nfs4.OPEN4_SHARE_ACCESS_READ
					}
					dt := nfs4.OPEN_DELEGATE_NONE
					res, err := cl.Compound(putFH(fh), openOp(cl.ClientID, access,
						nfs4.OpenClaim4{Claim: nfs4.CLAIM_PREVIOUS, DelegateType: &dt}, false))
					if status(t, res, err) != nfs4.NFS4_OK {
						t.Fatalf("OPEN CLAIM_PREVIOUS: %v", wiretest.Check(res))
					}
					ioSid = res.Resarray[2].Opopen.Resok4.Stateid
				}
				if tc.complete {
					if res, err := cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_RECLAIM_COMPLETE,
						OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{}})); status(t, res, err) != nfs4.NFS4_OK {
						t.Fatalf("RECLAIM_COMPLETE: %v", wiretest.Check(res))
					}
				}
			} else {
				ioSid = openSid
			}
			if tc.returnFirst {
				res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTRETURN, Oplayoutreturn: &nfs4.LAYOUTRETURN4args{
					LoraLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, LoraIomode: nfs4.LAYOUTIOMODE4_ANY,
					LoraLayoutreturn: nfs4.Layoutreturn4{LrReturntype: nfs4.LAYOUTRETURN4_FILE, LrLayout: &nfs4.LayoutreturnFile4{
						LrfLength: ^uint64(0), LrfStateid: layoutSid}},
				}}))
				if status(t, res, err) != nfs4.NFS4_OK {
					t.Fatalf("LAYOUTRETURN: %v", wiretest.Check(res))
				}
			}

			mtime := time.Unix(1_700_000_000, 123_000_000)
			res, err = cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
				LocaLength: n, LocaReclaim: tc.locaReclaim, LocaStateid: layoutSid,
				LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: ptr(uint64(n - 1))},
				LocaTimeModify: nfs4.Newtime4{NtTimechanged: true, NtTime: &nfs4.Nfstime4{
					Seconds: mtime.Unix(), Nseconds: uint32(mtime.Nanosecond())}},
				LocaLayoutupdate: nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_NFSV4_1_FILES},
			}}))
			if got := status(t, res, err); got != tc.want {
				t.Fatalf("LAYOUTCOMMIT: %v, want %v", got, tc.want)
			}
			if tc.restart && !tc.complete {
				// The commit happened during grace: a new OPEN is still
				// refused with GRACE now.
				res, err := cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}), openOp(cl.ClientID,
					nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4("probe"))}, true))
				if got := status(t, res, err); got != nfs4.NFS4ERR_GRACE {
					t.Fatalf("new OPEN after the commit: %v, want GRACE (grace ended early?)", got)
				}
			}

			size, mt := sizeAndMtime(t, cl, fh)
			wantSize, mtimeSet := uint64(0), false
			if tc.want == nfs4.NFS4_OK {
				wantSize, mtimeSet = n, true
			}
			if size != wantSize {
				t.Fatalf("size after LAYOUTCOMMIT %d, want %d", size, wantSize)
			}
			if mt.Equal(mtime) != mtimeSet {
				t.Fatalf("mtime after LAYOUTCOMMIT %v (committed %v, expected applied: %v)", mt, mtime, mtimeSet)
			}
			if tc.want != nfs4.NFS4_OK {
				return
			}
			// The data written before the restart reads back through the MDS.
			res, err = cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
				Stateid: ioSid, Offset: 0, Count: 2 * n}}))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("READ: %v", wiretest.Check(res))
			}
			if got := res.Resarray[2].Opread.Resok4; !bytes.Equal(got.Data, data) || !got.Eof {
				t.Fatalf("READ after the commit: %d bytes (eof %v), want the %d written", len(got.Data), got.Eof, n)
			}
		})
	}
}

// openOp is an OPEN of owner "o1"; create makes it OPEN4_CREATE UNCHECKED4.
func openOp(clientID uint64, access uint32, claim nfs4.OpenClaim4, create bool) nfs4.NfsArgop4 {
	a := &nfs4.OPEN4args{
		ShareAccess: access,
		Owner:       nfs4.OpenOwner4{Clientid: clientID, Owner: []byte("o1")},
		Claim:       claim,
	}
	if create {
		a.Openhow = nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: &nfs4.Createhow4{
			Mode: nfs4.UNCHECKED4, Createattrs: &nfs4.Fattr4{}}}
	}
	return nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: a}
}

// sizeAndMtime reads size and time_modify with GETATTR at the MDS.
func sizeAndMtime(t *testing.T, cl *wiretest.Client, fh []byte) (uint64, time.Time) {
	t.Helper()
	mask := nfs4.Bitmap4{1 << nfs4.FATTR4_SIZE, 1 << (nfs4.FATTR4_TIME_MODIFY - 32)}
	res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: mask}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("GETATTR: %v", wiretest.Check(res))
	}
	fa := res.Resarray[2].Opgetattr.Resok4.ObjAttributes
	v := fa.AttrVals
	if len(fa.Attrmask) < 2 || fa.Attrmask[0] != mask[0] || fa.Attrmask[1] != mask[1] || len(v) != 8+12 {
		t.Fatalf("GETATTR returned mask %v with %d bytes", fa.Attrmask, len(v))
	}
	size := binary.BigEndian.Uint64(v[0:8])
	sec := int64(binary.BigEndian.Uint64(v[8:16]))
	nsec := binary.BigEndian.Uint32(v[16:20])
	return size, time.Unix(sec, int64(nsec))
}
