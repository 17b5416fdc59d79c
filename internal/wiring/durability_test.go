package wiring

import (
	"context"
	"encoding/binary"
	"log/slog"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/server"
)

// TestInlineCloseOneSync: the close of a small file, as Shoal's FUSE
// mount and the kernel client send it to a pNFS MDS, is an inline WRITE
// (data, size and mtime in the metadata engine) and a SETATTR of the
// mtime the writeback cache kept; sent in one COMPOUND, they cost one
// fdatasync of the metadata log, paid before the reply (which says
// FILE_SYNC4), in sync mode and in async mode alike (an inline WRITE
// answered FILE_SYNC4 promises stable storage). Without the COMPOUND's
// shared durability barrier each would cost its own.
func TestInlineCloseOneSync(t *testing.T) {
	for _, tc := range []struct {
		name  string
		async bool
	}{{"sync", false}, {"async", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := false
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := Start(ctx, Config{
				Dir: t.TempDir(), DataServers: 1, Listen: "127.0.0.1:0",
				Exports: []*server.Export{{Path: "/", RootSquash: &f}},
				Lease:   10 * time.Second, Logger: slog.New(slog.DiscardHandler),
				// No timed sync during the test: every fdatasync
				// counted is one a reply waited for.
				Async: tc.async, CommitInterval: time.Hour,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte("durability-client"))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			for i, name := range []string{"a", "b", "c"} {
				sid, fh, ino := openOnMDS(t, cl, name)
				before := c.MDS.Server.Stats()
				mtime := binary.BigEndian.AppendUint32(nil, uint32(nfs4.SET_TO_CLIENT_TIME4))
				mtime = binary.BigEndian.AppendUint64(mtime, 1_700_000_000)
				mtime = binary.BigEndian.AppendUint32(mtime, 0)
				res, err := cl.Compound(putFH(fh),
					op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{Stateid: sid, Stable: nfs4.UNSTABLE4, Data: []byte("4 KiB or so")}}),
					op(nfs4.NfsArgop4{Argop: nfs4.OP_SETATTR, Opsetattr: &nfs4.SETATTR4args{Stateid: sid,
						ObjAttributes: nfs4.Fattr4{Attrmask: nfs4.Bitmap4{0, 1 << (nfs4.FATTR4_TIME_MODIFY_SET - 32)}, AttrVals: mtime}}}))
				if st := status(t, res, err); st != nfs4.NFS4_OK {
					t.Fatalf("WRITE+SETATTR: %v", wiretest.Check(res))
				}
				after := c.MDS.Server.Stats()
				if got := res.Resarray[2].Opwrite.Resok4.Committed; got != nfs4.FILE_SYNC4 {
					t.Fatalf("inline WRITE answered %v, want FILE_SYNC4", got)
				}
				if st := stateOf(t, c, ino); string(st.inline) != "4 KiB or so" {
					t.Fatalf("file %d not inline: %+v", i, st)
				}
				appends, syncs := after.Log.Appends-before.Log.Appends, after.Log.Syncs-before.Log.Syncs
				if appends < 2 || syncs != 1 || after.Log.Pending != 0 {
					t.Fatalf("file %d: %d log records, %d fdatasyncs, %d pending after the reply; want 2 or more, 1, 0",
						i, appends, syncs, after.Log.Pending)
				}
			}
		})
	}
}
