package server

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestReadBufDirtyPool: READ buffers come from the pool as their last user
// left them (readBuf no longer clears them), so every byte a READ or
// READ_PLUS sends must be the file's: data, zeros for the part of the file
// past its data file's end (a data server's object ends before the file
// does), and nothing of an earlier reply. Before each read the pool is given a buffer full of 0xee; a
// reply that carries one of those bytes fails.
func TestReadBufDirtyPool(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "tail", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	const mib = 1 << 20
	const keep = 4096
	data := bytes.Repeat([]byte{7}, mib)
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, data)))
	// The data file loses all but its first 4 KiB behind the server's
	// back, as a data server's object ends before the file does: the
	// server must send zeros for the rest of the 1 MiB file.
	var obj string
	if err := filepath.WalkDir(ts.cfg.Dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil && fi.Size() == mib {
				obj = p
			}
		}
		return err
	}); err != nil || obj == "" {
		t.Fatalf("no 1 MiB data file under %s (%v)", ts.cfg.Dir, err)
	}
	if err := os.Truncate(obj, keep); err != nil {
		t.Fatal(err)
	}
	want := append(bytes.Clone(data[:keep]), make([]byte, mib-keep)...)
	dirty := func() {
		b := bytes.Repeat([]byte{0xee}, mib)
		readPool.Put(&b)
	}
	readPlus := nfs4.NfsArgop4{Argop: nfs4.OP_READ_PLUS, OpreadPlus: &nfs4.READPLUS4args{RpaStateid: sid, RpaCount: mib}}
	for i := range 8 {
		dirty()
		res := must(t)(c.Compound(opPutFH(fh), opRead(sid, 0, mib)))
		if got := find(t, res, nfs4.OP_READ).Opread.Resok4.Data; !bytes.Equal(got, want) {
			t.Fatalf("READ %d: %d bytes, first difference at %d", i, len(got), firstDiff(got, want))
		}
		dirty()
		res = must(t)(c.Compound(opPutFH(fh), readPlus))
		var got []byte
		for _, s := range find(t, res, nfs4.OP_READ_PLUS).OpreadPlus.RpResok4.RprContents {
			switch {
			case s.RpcContent == nfs4.NFS4_CONTENT_DATA && s.RpcData != nil:
				got = append(got, s.RpcData.DData...)
			case s.RpcContent == nfs4.NFS4_CONTENT_HOLE && s.RpcHole != nil:
				got = append(got, make([]byte, s.RpcHole.DiLength)...)
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("READ_PLUS %d: %d bytes, first difference at %d", i, len(got), firstDiff(got, want))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
