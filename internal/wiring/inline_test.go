package wiring

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// inlineState is where a file's data is, as the engine records it.
type inlineState struct {
	inline []byte // nil if the file has no inline record
	placed bool   // it has a stripe map
}

func stateOf(t *testing.T, c *Cluster, ino uint64) inlineState {
	t.Helper()
	m := c.MDS.Server.Meta()
	d, ok, err := m.InlineData(context.Background(), meta.Ino(ino))
	if err != nil {
		t.Fatalf("InlineData %d: %v", ino, err)
	}
	var st inlineState
	if ok {
		st.inline = append([]byte{}, d...)
	}
	_, err = m.StripeMap(context.Background(), meta.Ino(ino))
	switch {
	case err == nil:
		st.placed = true
	case !errors.Is(err, meta.ErrNotFound):
		t.Fatalf("StripeMap %d: %v", ino, err)
	}
	return st
}

// onDataServers reads ino's data as the data servers hold it (what a
// client with a layout reads).
func onDataServers(t *testing.T, c *Cluster, ino uint64, n int) []byte {
	t.Helper()
	f, err := c.MDS.Striped.Open(ino, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n+1)
	got, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return b[:got]
}

func setSize(t *testing.T, cl *wiretest.Client, sid nfs4.Stateid4, fh []byte, size uint64) {
	t.Helper()
	v := binary.BigEndian.AppendUint64(nil, size)
	res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_SETATTR, Opsetattr: &nfs4.SETATTR4args{
		Stateid: sid, ObjAttributes: nfs4.Fattr4{Attrmask: nfs4.Bitmap4{1 << nfs4.FATTR4_SIZE}, AttrVals: v}}}))
	if st := status(t, res, err); st != nfs4.NFS4_OK {
		t.Fatalf("SETATTR size %d: %v", size, st)
	}
}

// TestInlineData: a pNFS metadata server keeps files of up to InlineMax
// bytes written through it in its metadata engine (server/inline.go),
// answers their WRITEs FILE_SYNC4, and moves them to the data servers,
// bytes intact, as soon as a write or a truncation takes them past the
// limit, a client asks for a layout, or an operation needs the data
// servers (ALLOCATE); a move the server did not finish is redone from
// the inline record.
func TestInlineData(t *testing.T) {
	const limit = 32 << 10
	c := startSparseCluster(t, 3, 1, nil)
	cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte("inline-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	zeros := func(n int) []byte { return make([]byte, n) }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	a4, b8 := randomBytes(t, 4096), randomBytes(t, 8192)

	t.Run("unstable write is kept inline and stable", func(t *testing.T) {
		sid, fh, ino := openOnMDS(t, cl, "unstable")
		res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
			Stateid: sid, Stable: nfs4.UNSTABLE4, Data: a4}}))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatal(wiretest.Check(res))
		}
		if got := res.Resarray[2].Opwrite.Resok4.Committed; got != nfs4.FILE_SYNC4 {
			t.Fatalf("WRITE committed %v, want FILE_SYNC4: data, size and mtime are one commit", got)
		}
		if st := stateOf(t, c, ino); !bytes.Equal(st.inline, a4) || st.placed {
			t.Fatalf("after a 4 KiB write: inline %d bytes, placed %v", len(st.inline), st.placed)
		}
		if got, err := readMDS(t, cl, sid, fh); err != nil || !bytes.Equal(got, a4) {
			t.Fatalf("read back %d bytes, %v", len(got), err)
		}
	})

	for _, tc := range []struct {
		name string
		// do changes the file after its first 4 KiB write and returns
		// what it must hold then.
		do     func(t *testing.T, sid nfs4.Stateid4, fh []byte, ino uint64) []byte
		inline bool // still inline afterwards
	}{
		{"overwrite and extend within the limit", func(t *testing.T, sid nfs4.Stateid4, fh []byte, _ uint64) []byte {
			writeMDS(t, cl, sid, fh, 2048, b8)
			return cat(a4[:2048], b8)
		}, true},
		{"write up to the limit", func(t *testing.T, sid nfs4.Stateid4, fh []byte, _ uint64) []byte {
			writeMDS(t, cl, sid, fh, limit-8192, b8)
			return cat(a4, zeros(limit-8192-4096), b8)
		}, true},
		{"write past the limit moves the data", func(t *testing.T, sid nfs4.Stateid4, fh []byte, _ uint64) []byte {
			writeMDS(t, cl, sid, fh, 40<<10, b8)
			return cat(a4, zeros(40<<10-4096), b8)
		}, false},
		{"shrink and grow within the limit", func(t *testing.T, sid nfs4.Stateid4, fh []byte, _ uint64) []byte {
			setSize(t, cl, sid, fh, 1000)
			setSize(t, cl, sid, fh, 20000)
			return cat(a4[:1000], zeros(19000))
		}, true},
		{"grow past the limit moves the data", func(t *testing.T, sid nfs4.Stateid4, fh []byte, _ uint64) []byte {
			setSize(t, cl, sid, fh, 100<<10)
			return cat(a4, zeros(100<<10-4096))
		}, false},
		{"a layout moves the data first", func(t *testing.T, sid nfs4.Stateid4, fh []byte, _ uint64) []byte {
			layoutOf(t, cl, sid, fh)
			return a4
		}, false},
		{"a move cut short is redone from the record", func(t *testing.T, sid nfs4.Stateid4, fh []byte, ino uint64) []byte {
			// What a crash after the map and some bytes reached the data
			// servers, before the record was dropped, leaves behind:
			// longer, different data there.
			f, err := c.MDS.Striped.Open(ino, true)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(bytes.Repeat([]byte{'j'}, 20000), 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if got, err := readMDS(t, cl, sid, fh); err != nil || !bytes.Equal(got, a4) {
				t.Fatalf("with a leftover map: read %d bytes, %v; the record must win", len(got), err)
			}
			layoutOf(t, cl, sid, fh)
			return a4
		}, false},
		{"allocate moves the data", func(t *testing.T, sid nfs4.Stateid4, fh []byte, _ uint64) []byte {
			res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_ALLOCATE, Opallocate: &nfs4.ALLOCATE4args{
				AaStateid: sid, AaOffset: 0, AaLength: 8192}}))
			if st := status(t, res, err); st != nfs4.NFS4_OK && st != nfs4.NFS4ERR_NOTSUPP {
				t.Fatalf("ALLOCATE: %v", st)
			}
			return cat(a4, zeros(4096))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sid, fh, ino := openOnMDS(t, cl, "f-"+tc.name)
			writeMDS(t, cl, sid, fh, 0, a4)
			want := tc.do(t, sid, fh, ino)
			got, err := readMDS(t, cl, sid, fh)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(want))
			}
			st := stateOf(t, c, ino)
			if inline := st.inline != nil; inline != tc.inline || !inline && !st.placed {
				t.Fatalf("inline %v (%d bytes), placed %v; want inline %v", inline, len(st.inline), st.placed, tc.inline)
			}
			if st.inline != nil && st.placed {
				t.Fatal("both an inline record and a stripe map")
			}
			if !tc.inline {
				// The data servers hold every byte of the data written.
				ds := onDataServers(t, c, ino, len(want))
				if !bytes.Equal(ds, want[:len(ds)]) || len(bytes.TrimRight(want[len(ds):], "\x00")) != 0 {
					t.Fatalf("data servers hold %d bytes that differ from the file's %d", len(ds), len(want))
				}
			}
		})
	}

	t.Run("remove frees the record", func(t *testing.T) {
		sid, fh, ino := openOnMDS(t, cl, "removed")
		writeMDS(t, cl, sid, fh, 0, a4)
		res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_CLOSE, Opclose: &nfs4.CLOSE4args{OpenStateid: sid}}))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatal(wiretest.Check(res))
		}
		res, err = cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
			op(nfs4.NfsArgop4{Argop: nfs4.OP_REMOVE, Opremove: &nfs4.REMOVE4args{Target: nfs4.Component4("removed")}}))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatal(wiretest.Check(res))
		}
		waitFor(t, "the removed file's inode to be freed", func() bool {
			_, _, err := c.MDS.Server.Meta().InlineData(context.Background(), meta.Ino(ino))
			return errors.Is(err, meta.ErrStale)
		})
	})
}

// TestInlineDataOff: with InlineMax negative every byte goes to the data
// servers, as before inline data.
func TestInlineDataOff(t *testing.T) {
	f := false
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{
		Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0", InlineMax: -1,
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Lease:   10 * time.Second, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte("inline-off"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sid, fh, ino := openOnMDS(t, cl, "f")
	data := randomBytes(t, 4096)
	writeMDS(t, cl, sid, fh, 0, data)
	if st := stateOf(t, c, ino); st.inline != nil || !st.placed {
		t.Fatalf("inline off: inline %d bytes, placed %v", len(st.inline), st.placed)
	}
	if got := onDataServers(t, c, ino, len(data)); !bytes.Equal(got, data) {
		t.Fatal("data servers do not hold the file's bytes")
	}
}

// mdsThresholdOf reads the mdsthreshold attribute of fh at the MDS.
func mdsThresholdOf(t *testing.T, cl *wiretest.Client, fh []byte) nfs4.Mdsthreshold4 {
	t.Helper()
	mask := nfs4.Bitmap4{0, 0, 1 << (nfs4.FATTR4_MDSTHRESHOLD - 64)}
	res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: mask}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("GETATTR mdsthreshold: %v", wiretest.Check(res))
	}
	var th nfs4.Mdsthreshold4
	if err := xdr.Unmarshal(res.Resarray[2].Opgetattr.Resok4.ObjAttributes.AttrVals, &th); err != nil {
		t.Fatal(err)
	}
	return th
}

// openLayout sends OPEN (existing file, by name from the root) and
// LAYOUTGET in one COMPOUND, as Linux does, and returns the LAYOUTGET's
// status; the OPEN must succeed.
func openLayout(t *testing.T, cl *wiretest.Client, name string, mode nfs4.Layoutiomode4) nfs4.Nfsstat4 {
	t.Helper()
	access := uint32(nfs4.OPEN4_SHARE_ACCESS_READ)
	if mode == nfs4.LAYOUTIOMODE4_RW {
		access = nfs4.OPEN4_SHARE_ACCESS_BOTH
	}
	res, err := cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
		openOp(cl.ClientID, access|nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
			nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(name))}, false),
		layoutGet(currentStateid, mode))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Resarray) < 4 || res.Resarray[2].Opopen == nil || res.Resarray[2].Opopen.Status != nfs4.NFS4_OK {
		t.Fatalf("OPEN %s: %v", name, wiretest.Check(res))
	}
	return res.Status
}

// TestMDSThreshold: with inline data, the MDS tells clients (the
// mdsthreshold attribute) to read and write files up to the inline limit
// through it, and declines the layout a client asks for in the COMPOUND
// of its OPEN while the file's data is at the MDS: a layout would move the
// data to the data servers before the first byte. A file on the data
// servers gets its layout in the OPEN as before. Without inline data
// there is no threshold and nothing is declined.
func TestMDSThreshold(t *testing.T) {
	f := false
	for _, tc := range []struct {
		name      string
		inlineMax int
		hints     bool
	}{
		{"inline", 0, true},
		{"inline-off", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			c, err := Start(ctx, Config{
				Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0", InlineMax: tc.inlineMax,
				Exports: []*server.Export{{Path: "/", RootSquash: &f}},
				Lease:   10 * time.Second, Logger: slog.New(slog.DiscardHandler),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte("threshold-"+tc.name))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			sid, fh, ino := openOnMDS(t, cl, "small")
			writeMDS(t, cl, sid, fh, 0, randomBytes(t, 4096))

			th := mdsThresholdOf(t, cl, fh)
			if !tc.hints {
				if len(th.MthHints) != 0 {
					t.Fatalf("mdsthreshold without inline data: %+v, want no hints", th)
				}
			} else {
				// read size, write size, write I/O size (bits 0, 1, 3)
				want := make([]byte, 24)
				for i := 0; i < len(want); i += 8 {
					binary.BigEndian.PutUint64(want[i:], server.DefaultInlineMax+1)
				}
				if len(th.MthHints) != 1 || th.MthHints[0].ThiLayoutType != nfs4.LAYOUT4_NFSV4_1_FILES ||
					len(th.MthHints[0].ThiHintset) != 1 || th.MthHints[0].ThiHintset[0] != 0b1011 ||
					!bytes.Equal(th.MthHints[0].ThiHintlist, want) {
					t.Fatalf("mdsthreshold: %+v, want read size, write size and write I/O size %d for the files layout", th, server.DefaultInlineMax+1)
				}
			}

			wantSmall := nfs4.NFS4_OK
			if tc.hints {
				wantSmall = nfs4.NFS4ERR_LAYOUTUNAVAILABLE
			}
			for _, mode := range []nfs4.Layoutiomode4{nfs4.LAYOUTIOMODE4_READ, nfs4.LAYOUTIOMODE4_RW} {
				if st := openLayout(t, cl, "small", mode); st != wantSmall {
					t.Fatalf("OPEN+LAYOUTGET(%v) of a 4 KiB file: %v, want %v", mode, st, wantSmall)
				}
			}
			if st := stateOf(t, c, ino); tc.hints && (st.inline == nil || st.placed) {
				t.Fatalf("after OPEN+LAYOUTGET: inline %d bytes, placed %v; want it left inline", len(st.inline), st.placed)
			}

			// A file past the limit is on the data servers: its layout
			// comes with the OPEN.
			sid, fh, _ = openOnMDS(t, cl, "large")
			writeMDS(t, cl, sid, fh, 0, randomBytes(t, server.DefaultInlineMax+4096))
			if st := openLayout(t, cl, "large", nfs4.LAYOUTIOMODE4_READ); st != nfs4.NFS4_OK {
				t.Fatalf("OPEN+LAYOUTGET of a file on the data servers: %v", st)
			}
		})
	}
}
