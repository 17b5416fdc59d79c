package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
)

// These tests cover the background freer of doomed orphans (orphans.go)
// from inside the package, where a test can hold the freer and so keep a
// doomed orphan around for as long as it needs. Their servers grant no
// delegations: the writer's would make each REMOVE from another client
// wait for a recall, which is not what they test.

// holdFreer makes the freer of ts's server wait before each free until
// the returned release is called (or the server stops). entered receives
// the inode of each free that waits.
func holdFreer(t *testing.T, ts *testServer) (entered <-chan meta.Ino, release func()) {
	t.Helper()
	in := make(chan meta.Ino, 1024)
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	stopped := ts.srv.st.ctx.Done()
	hook := func(ino meta.Ino) {
		in <- ino
		select {
		case <-gate:
		case <-stopped:
		}
	}
	ts.srv.st.orphans.testHookBeforeFree.Store(&hook)
	// Before the server stops (cleanups run last in, first out).
	t.Cleanup(release)
	return in, release
}

// dataPath is where a single server keeps ino's data.
func (ts *testServer) dataPath(ino meta.Ino) string {
	return filepath.Join(ts.cfg.Dir, "data", fmt.Sprintf("%02x", uint64(ino)&0xff), strconv.FormatUint(uint64(ino), 10))
}

func (ts *testServer) hasData(t *testing.T, ino meta.Ino) bool {
	t.Helper()
	_, err := os.Stat(ts.dataPath(ino))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func (ts *testServer) isOrphan(t *testing.T, ino meta.Ino) bool {
	t.Helper()
	inos, err := ts.srv.meta.Orphans(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(inos, ino)
}

// waitFreed polls until ino's inode and data are gone and the server
// forgot it; the bound only keeps a broken freer from hanging the test.
func (ts *testServer) waitFreed(t *testing.T, ino meta.Ino, what string) {
	t.Helper()
	var err error
	freed := pollUntil(3000, 10*time.Millisecond, func() bool {
		_, err = ts.srv.meta.GetAttr(testCtx(t), ino)
		return errors.Is(err, meta.ErrStale) && !ts.hasData(t, ino) && !ts.srv.st.orphans.isPending(ino)
	})
	if !freed {
		t.Fatalf("%s: ino %d not freed: getattr %v, data %v, pending %v", what, ino, err, ts.hasData(t, ino), ts.srv.st.orphans.isPending(ino))
	}
	if ts.isOrphan(t, ino) {
		t.Fatalf("%s: ino %d freed but still in the engine's orphan set", what, ino)
	}
	if ts.srv.st.orphans.isDoomed(ino) {
		t.Fatalf("%s: ino %d freed but still doomed", what, ino)
	}
}

// writtenFile creates name in the root with some data through c, closes
// it, and returns its handle and inode.
func writtenFile(t *testing.T, ts *testServer, name string) ([]byte, meta.Ino) {
	t.Helper()
	c := ts.client()
	sid, fh := openFile(t, c, name, nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "w")
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, fill(4096, 1)), opClose(sid)))
	h, err := ts.srv.fh.decode(fh)
	if err != nil {
		t.Fatal(err)
	}
	if !ts.hasData(t, h.ino) {
		t.Fatalf("no data for %s (ino %d) at %s", name, h.ino, ts.dataPath(h.ino))
	}
	return fh, h.ino
}

func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i) ^ seed
	}
	return b
}

// TestRemoveUnopenedFreesInBackground: REMOVE of a file nobody holds
// open answers before the free; the freer then removes data and inode.
// While the freer is held, the doomed orphan is in the engine with its
// data, but every access by filehandle finds it gone (NFS4ERR_STALE, as
// after the free), an OPEN by name does not find it, and an OPEN that
// resolved it before the REMOVE backs out.
func TestRemoveUnopenedFreesInBackground(t *testing.T) {
	ts := startServer(t, Config{NoDelegations: true})
	entered, release := holdFreer(t, ts)
	fh, ino := writtenFile(t, ts, "f")
	c := ts.client()
	guard := ts.srv.st.orphans.guard() // an OPEN that resolved f before the REMOVE

	must(t)(c.Compound(opPutRoot(), opRemove("f")))
	if got := <-entered; got != ino {
		t.Fatalf("freer got ino %d, want %d", got, ino)
	}
	// Doomed, not freed yet.
	if a, err := ts.srv.meta.GetAttr(testCtx(t), ino); err != nil || a.Nlink != 0 {
		t.Fatalf("doomed orphan in the engine: %+v, %v; want nlink 0", a, err)
	}
	if !ts.isOrphan(t, ino) || !ts.hasData(t, ino) {
		t.Fatalf("doomed orphan: in the orphan set %v, data %v; want both", ts.isOrphan(t, ino), ts.hasData(t, ino))
	}

	tests := []struct {
		name string
		ops  []nfs4.NfsArgop4
		want nfs4.Nfsstat4
	}{
		{"OPEN CLAIM_FH", []nfs4.NfsArgop4{opPutFH(fh), opOpen(c.ClientID, openArgs{claim: nfs4.CLAIM_FH})}, nfs4.NFS4ERR_STALE},
		{"OPEN CLAIM_FH write", []nfs4.NfsArgop4{opPutFH(fh), opOpen(c.ClientID, openArgs{claim: nfs4.CLAIM_FH, access: nfs4.OPEN4_SHARE_ACCESS_WRITE})}, nfs4.NFS4ERR_STALE},
		{"OPEN by name", []nfs4.NfsArgop4{opPutRoot(), opOpen(c.ClientID, openArgs{name: "f"})}, nfs4.NFS4ERR_NOENT},
		{"GETATTR", []nfs4.NfsArgop4{opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE)}, nfs4.NFS4ERR_STALE},
		{"anonymous READ", []nfs4.NfsArgop4{opPutFH(fh), opRead(anonStateid, 0, 4096)}, nfs4.NFS4ERR_STALE},
		{"anonymous WRITE", []nfs4.NfsArgop4{opPutFH(fh), opWrite(anonStateid, 0, nfs4.FILE_SYNC4, []byte("resurrected"))}, nfs4.NFS4ERR_STALE},
		{"SETATTR size", []nfs4.NfsArgop4{opPutFH(fh), opSetattr(anonStateid, fattr(aSize(1<<20)))}, nfs4.NFS4ERR_STALE},
		{"LINK", []nfs4.NfsArgop4{opPutFH(fh), opSaveFH(), opPutRoot(), opLink("again")}, nfs4.NFS4ERR_STALE},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want(t, tc.want)(c.Compound(tc.ops...))
		})
	}
	// The race OPEN loses: it resolved the file before the REMOVE and
	// registers its open after the doom.
	registered := false
	alive, err := guard.open(ino, func() error { registered = true; return nil })
	if err != nil || alive || !registered {
		t.Fatalf("open of a doomed orphan resolved before the remove: alive %v, err %v, registered %v; want not alive", alive, err, registered)
	}

	release()
	ts.waitFreed(t, ino, "after the freer ran")
	want(t, nfs4.NFS4ERR_STALE)(c.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE)))
	if ts.hasData(t, ino) {
		t.Fatal("the refused WRITE left data behind")
	}
}

// TestOpenOrphanNotDoomed: a file open elsewhere when it is removed is
// not doomed: it stays usable by filehandle and is freed at the last
// CLOSE, by the closing request rather than the freer.
func TestOpenOrphanNotDoomed(t *testing.T) {
	ts := startServer(t, Config{NoDelegations: true})
	entered, _ := holdFreer(t, ts)
	a := ts.client()
	sid, fh := openFile(t, a, "held", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "a")
	h, err := ts.srv.fh.decode(fh)
	if err != nil {
		t.Fatal(err)
	}
	must(t)(a.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, fill(4096, 2))))
	b := ts.client()
	must(t)(b.Compound(opPutRoot(), opRemove("held")))
	if ts.srv.st.orphans.isDoomed(h.ino) {
		t.Fatal("an orphan held open is doomed")
	}
	res := must(t)(a.Compound(opPutFH(fh), opRead(sid, 0, 4096), opGetattr(nfs4.FATTR4_NUMLINKS)))
	if got := res.Resarray[2].Opread.Resok4.Data; len(got) != 4096 {
		t.Fatalf("read %d bytes of the open orphan, want 4096", len(got))
	}
	// Another open by filehandle keeps it too.
	res = must(t)(b.Compound(opPutFH(fh), opOpen(b.ClientID, openArgs{claim: nfs4.CLAIM_FH})))
	bsid := openSid(t, res)
	must(t)(a.Compound(opPutFH(fh), opClose(sid)))
	if !ts.isOrphan(t, h.ino) || !ts.hasData(t, h.ino) {
		t.Fatal("orphan freed while b holds it open")
	}
	must(t)(b.Compound(opPutFH(fh), opClose(bsid)))
	ts.waitFreed(t, h.ino, "after the last close")
	select {
	case ino := <-entered:
		t.Fatalf("the freer got ino %d, which was freed by its last close", ino)
	default:
	}
}

// TestManyConcurrentRemovesFreed: concurrent REMOVEs from several clients
// doom many orphans at once; the freer frees every one of them.
func TestManyConcurrentRemovesFreed(t *testing.T) {
	const clients, files = 4, 40
	ts := startServer(t, Config{NoDelegations: true})
	inos := make([][]meta.Ino, clients)
	for i := range clients {
		for j := range files {
			_, ino := writtenFile(t, ts, fmt.Sprintf("c%d.f%d", i, j))
			inos[i] = append(inos[i], ino)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, clients)
	for i := range clients {
		c := ts.client()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range files {
				res, err := c.Compound(opPutRoot(), opRemove(fmt.Sprintf("c%d.f%d", i, j)))
				if err == nil && res.Status != nfs4.NFS4_OK {
					err = fmt.Errorf("REMOVE c%d.f%d: %s", i, j, summary(res))
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i := range clients {
		for _, ino := range inos[i] {
			ts.waitFreed(t, ino, "after concurrent removes")
		}
	}
	if n := ts.srv.st.orphans.ndoomed.Load(); n != 0 {
		t.Fatalf("%d orphans still counted as doomed", n)
	}
}

// TestDoomedOrphanSurvivesShutdown: the server stops while doomed
// orphans wait for the freer. They are recorded in the engine, and the
// restarted server frees them.
func TestDoomedOrphanSurvivesShutdown(t *testing.T) {
	ts := startServer(t, Config{Lease: 2 * time.Second, NoDelegations: true})
	entered, _ := holdFreer(t, ts)
	var inos []meta.Ino
	for i := range 3 {
		_, ino := writtenFile(t, ts, fmt.Sprintf("f%d", i))
		inos = append(inos, ino)
	}
	c := ts.client()
	for i := range inos {
		must(t)(c.Compound(opPutRoot(), opRemove(fmt.Sprintf("f%d", i))))
	}
	<-entered // the freer holds one; the others wait in its queue
	for _, ino := range inos {
		if !ts.isOrphan(t, ino) {
			t.Fatalf("doomed ino %d not recorded as an orphan in the engine", ino)
		}
	}
	ts.restart()
	for _, ino := range inos {
		ts.waitFreed(t, ino, "after the restart")
	}
}

// TestOrphanFreeRetried: a doomed orphan whose free fails stays doomed
// and recorded, goes back to the freer through the sweeper after the
// backoff, and is freed then. The failure is real: the store cannot
// remove the file's data while a non-empty directory stands in its place.
func TestOrphanFreeRetried(t *testing.T) {
	ts := startServer(t, Config{NoDelegations: true})
	o := ts.srv.st.orphans
	fh, ino := writtenFile(t, ts, "f")
	path := ts.dataPath(ino)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(path, "blocker")
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := ts.client()
	must(t)(c.Compound(opPutRoot(), opRemove("f")))
	failed := pollUntil(3000, 10*time.Millisecond, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.pending[ino].backoff > 0
	})
	if !failed {
		t.Fatal("the free of an orphan whose data cannot be removed did not fail")
	}
	if !o.isDoomed(ino) || !ts.isOrphan(t, ino) {
		t.Fatalf("after a failed free: doomed %v, recorded %v; want both", o.isDoomed(ino), ts.isOrphan(t, ino))
	}
	want(t, nfs4.NFS4ERR_STALE)(c.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE)))
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	ts.waitFreed(t, ino, "after the retry")
}
