package server

import (
	"errors"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
)

// TestRemoveFreesAtOnce: on a single server, the REMOVE of the last link
// of a file that never had data and that nobody holds open deletes the
// inode in its own transaction (orphans_remove.go): with the freer held,
// the inode is gone and no orphan is recorded when the REMOVE answers.
// A file with data, an open file and a file with another link take the
// orphan way (or none) as before.
func TestRemoveFreesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		write    bool // write data before the REMOVE
		keepOpen bool // another open of the file stays during the REMOVE
		link     bool // a second link, "g", stays
		wantGone bool // inode deleted by the REMOVE itself
	}{
		{name: "empty, not open", wantGone: true},
		{name: "written, not open", write: true},
		{name: "empty, open", keepOpen: true},
		{name: "empty, second link", link: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Config{NoDelegations: true})
			entered, release := holdFreer(t, ts)
			c := ts.client()
			sid, fh := openFile(t, c, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "w")
			if tc.write {
				must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, fill(4096, 1))))
			}
			if !tc.keepOpen {
				must(t)(c.Compound(opPutFH(fh), opClose(sid)))
			}
			if tc.link {
				must(t)(c.Compound(opPutFH(fh), opSaveFH(), opPutRoot(), opLink("g")))
			}
			h, err := ts.srv.fh.decode(fh)
			if err != nil {
				t.Fatal(err)
			}
			ino := h.ino
			before, err := ts.srv.meta.StatFS(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			must(t)(c.Compound(opPutRoot(), opRemove("f")))

			_, err = ts.srv.meta.GetAttr(testCtx(t), ino)
			gone := errors.Is(err, meta.ErrStale)
			if gone != tc.wantGone {
				t.Fatalf("inode gone when the REMOVE answered: %v (getattr %v), want %v", gone, err, tc.wantGone)
			}
			after, err := ts.srv.meta.StatFS(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantGone {
				if ts.isOrphan(t, ino) || ts.srv.st.orphans.isPending(ino) {
					t.Fatalf("freed at the REMOVE, yet an orphan (recorded %v, pending %v)", ts.isOrphan(t, ino), ts.srv.st.orphans.isPending(ino))
				}
				if after.Files != before.Files-1 {
					t.Fatalf("files %d after the REMOVE, want %d", after.Files, before.Files-1)
				}
				want(t, nfs4.NFS4ERR_STALE)(c.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE)))
				return
			}
			if tc.link {
				if ts.isOrphan(t, ino) {
					t.Fatal("a file with another link became an orphan")
				}
				return
			}
			if !ts.isOrphan(t, ino) {
				t.Fatal("not recorded as an orphan")
			}
			if tc.keepOpen {
				must(t)(c.Compound(opPutFH(fh), opClose(sid)))
			} else {
				<-entered // the freer has it, held
			}
			release()
			ts.waitFreed(t, ino, "after the REMOVE")
		})
	}
}
