package wiring

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// TestPNFSCopy runs the server-side copy steps of server's TestCopy
// (COPY, CLONE, OFFLOAD_STATUS, OFFLOAD_CANCEL) against a pNFS metadata
// server, with one copy of each stripe unit and with two: it must answer
// as `shoal serve` does, and every copy's bytes must read back.
func TestPNFSCopy(t *testing.T) {
	for _, tc := range []struct {
		name             string
		dataServers, mir int
	}{
		{"3 data servers", 3, 1},
		{"2 data servers, 2 copies", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startSparseCluster(t, tc.dataServers, tc.mir, nil)
			cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte("copy-client"))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			wiretest.Copy(t, cl, func(name string) (nfs4.Stateid4, []byte) {
				sid, fh, _ := openOnMDS(t, cl, name)
				return sid, fh
			})
		})
	}
}

// TestPNFSCopyOnDataServers: a COPY or CLONE whose source and destination
// stripe maps line up (a whole file into a new one, whose map the MDS
// places like the source's; or whole units to the same positions) is done
// by the data servers, each copying its own units (OBJ_COPY): no byte is
// read from or written to a data server by the MDS, and every good copy of
// the destination takes it. Other copies go through the MDS, and still
// copy the right bytes.
func TestPNFSCopyOnDataServers(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name             string
		dataServers, mir int
		clone            bool
		srcOff, dstOff   uint64
		count            uint64 // 0: to the source's end
		// prep: what the destination has before the copy: nothing, a
		// layout (so a stripe map that does not line up), or data.
		prep string
		// onDS: the data servers copy every byte (and the MDS none);
		// otherwise every byte passes through the MDS.
		onDS bool
	}{
		{"COPY of a whole file into a new one", 3, 1, false, 0, 0, 0, "", true},
		{"CLONE of a whole file into a new one", 3, 1, true, 0, 0, 0, "", true},
		{"COPY with two copies of each unit", 3, 2, false, 0, 0, 0, "", true},
		{"COPY of units to the next stripe", 3, 1, false, mib, 4 * mib, 2 * mib, "", true},
		{"COPY to a unit of another position", 3, 1, false, 0, mib, 2 * mib, "", true},
		{"COPY into a new file the client holds a layout of", 3, 1, false, 0, 0, 0, "layout", true},
		{"COPY with two copies into a file with a layout", 3, 2, false, 0, 0, 0, "layout", true},
		{"COPY to an offset inside a unit", 3, 1, false, 0, mib + 7, 3 * mib, "", false},
		{"COPY into a file with data elsewhere", 3, 1, false, 0, 0, 3 * mib, "data", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startSparseCluster(t, tc.dataServers, tc.mir, nil)
			ctx := ctxT(t)
			cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte("copy-client"))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			srcSid, src, srcIno := openOnMDS(t, cl, "src")
			dstSid, dst, dstIno := openOnMDS(t, cl, "dst")
			const size = 8*mib + 12345
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i*31 + i>>16)
			}
			for off := 0; off < size; off += mib {
				res, err := cl.Compound(putFH(src), nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
					Stateid: srcSid, Offset: uint64(off), Stable: nfs4.FILE_SYNC4, Data: data[off:min(off+mib, size)]}})
				if status(t, res, err) != nfs4.NFS4_OK {
					t.Fatalf("WRITE at %d: %v", off, wiretest.Check(res))
				}
			}
			var before0 []byte // the destination's bytes before the copy
			switch tc.prep {
			case "layout":
				res, err := cl.Compound(putFH(dst), layoutGet(dstSid, nfs4.LAYOUTIOMODE4_RW))
				if status(t, res, err) != nfs4.NFS4_OK {
					t.Fatalf("LAYOUTGET of the destination: %v", wiretest.Check(res))
				}
			case "data":
				before0 = bytes.Repeat([]byte{'d'}, 5*mib)
				for off := 0; off < len(before0); off += mib {
					res, err := cl.Compound(putFH(dst), nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
						Stateid: dstSid, Offset: uint64(off), Stable: nfs4.FILE_SYNC4, Data: before0[off : off+mib]}})
					if status(t, res, err) != nfs4.NFS4_OK {
						t.Fatalf("WRITE of the destination: %v", wiretest.Check(res))
					}
				}
			}
			n := tc.count
			if n == 0 {
				n = size - tc.srcOff
			}
			type io struct{ mdsRead, mdsWrite, copied uint64 }
			snap := func() io {
				var s io
				for _, d := range c.DS {
					st := d.Agent.Stats()
					s.mdsRead += st.ReadBytes
					s.mdsWrite += st.WriteBytes
					s.copied += st.CopyBytes
				}
				return s
			}
			before := snap()
			mdsBefore := c.MDS.Server.Stats()
			op := nfs4.NfsArgop4{Argop: nfs4.OP_COPY, Opcopy: &nfs4.COPY4args{CaSrcStateid: srcSid, CaDstStateid: dstSid,
				CaSrcOffset: tc.srcOff, CaDstOffset: tc.dstOff, CaCount: tc.count, CaSynchronous: true}}
			if tc.clone {
				op = nfs4.NfsArgop4{Argop: nfs4.OP_CLONE, Opclone: &nfs4.CLONE4args{ClSrcStateid: srcSid, ClDstStateid: dstSid,
					ClSrcOffset: tc.srcOff, ClDstOffset: tc.dstOff, ClCount: tc.count}}
			}
			res, err := cl.Compound(putFH(src), nfs4.NfsArgop4{Argop: nfs4.OP_SAVEFH}, putFH(dst), op)
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("%v: %v", op.Argop, wiretest.Check(res))
			}
			after := snap()
			moved := fmt.Sprintf("data servers read %d and wrote %d bytes for the MDS and copied %d themselves",
				after.mdsRead-before.mdsRead, after.mdsWrite-before.mdsWrite, after.copied-before.copied)
			if tc.onDS {
				area := n
				if tc.clone {
					// CLONE copies whole blocks (clone_blksize, the stripe
					// unit): zeros past the source's end.
					area = (n + mib - 1) / mib * mib
				}
				if after.mdsRead != before.mdsRead || after.mdsWrite != before.mdsWrite || after.copied-before.copied != area*uint64(tc.mir) {
					t.Errorf("copy of %d bytes with %d copies: %s; want only %d copied", n, tc.mir, moved, area*uint64(tc.mir))
				}
				sm, _, err1 := c.MDS.Striped.Map(ctx, srcIno)
				dm, _, err2 := c.MDS.Striped.Map(ctx, dstIno)
				if err1 != nil || err2 != nil || dm.Degraded() || !slices.Equal(dm.DataServers, sm.DataServers) {
					t.Errorf("maps: source %+v (%v), destination %+v (%v)", sm, err1, dm, err2)
				}
				if tc.prep == "layout" && !slices.Contains(cl.Callbacks(), nfs4.CB_COMPOUND) {
					t.Errorf("the destination's map changed without a recall of the client's layout")
				}
			} else if after.mdsRead-before.mdsRead < n || after.mdsWrite-before.mdsWrite < n {
				t.Errorf("copy of %d bytes through the MDS: %s", n, moved)
			}
			if st := c.MDS.Server.Stats(); st.ReadBytes != mdsBefore.ReadBytes || st.WriteBytes != mdsBefore.WriteBytes {
				t.Errorf("the MDS counted READ/WRITE bytes for a COPY")
			}
			want := make([]byte, max(tc.dstOff+n, uint64(len(before0))))
			copy(want, before0)
			copy(want[tc.dstOff:], data[tc.srcOff:tc.srcOff+n])
			got, err := wiretest.ReadFile(cl, dst, dstSid)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("destination: %d bytes, want %d (equal: %v)", len(got), len(want), bytes.Equal(got, want))
			}
		})
	}
}
