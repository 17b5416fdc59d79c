package server

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// TestConcurrentClients runs several clients against one directory at
// once, and several slots of one session at once, so the race detector
// sees the server's shared state under real contention.
func TestConcurrentClients(t *testing.T) {
	ts := startServer(t, Config{})
	setup := ts.client()
	dir := fhOf(t, must(t)(setup.Compound(opPutRoot(), opMkdir("shared"), opGetFH())))
	const (
		workers = 6
		rounds  = 15
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers*2)
	for w := range workers {
		c := ts.client()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- clientWorker(c, dir, w, rounds)
		}()
	}
	// One session, several slots in parallel.
	shared := ts.client()
	for slot := uint32(1); slot <= 4; slot++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- slotWorker(t, shared, dir, slot, rounds)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	res := must(t)(setup.Compound(opPutFH(dir), opReaddir(0, nfs4.Verifier4{}, 1<<16)))
	if names := readdirNames(t, res); len(names) != workers {
		t.Errorf("directory holds %q, want one file per client worker", names)
	}
}

func clientWorker(c *wiretest.Client, dir []byte, w, rounds int) error {
	name := fmt.Sprintf("w%d", w)
	data := bytes.Repeat([]byte{byte('a' + w)}, 3000)
	for i := range rounds {
		res, err := c.Compound(opPutFH(dir), opOpen(c.ClientID, openArgs{name: name, owner: name,
			access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: nfs4.UNCHECKED4}),
			opWrite(currentSid, uint64(i)*100, nfs4.UNSTABLE4, data),
			opRead(currentSid, 0, 1<<16), opGetattr(nfs4.FATTR4_SIZE, nfs4.FATTR4_CHANGE),
			opLockNew(nfs4.WRITE_LT, 0, 10, currentSid, c.ClientID, name),
			opPutFH(dir), opReaddir(0, nfs4.Verifier4{}, 4096, nfs4.FATTR4_SIZE))
		if err != nil {
			return err
		}
		if res.Status != nfs4.NFS4_OK {
			return fmt.Errorf("worker %d round %d: %s", w, i, summary(res))
		}
		sid := res.Resarray[2].Opopen.Resok4.Stateid
		lsid := res.Resarray[6].Oplock.Resok4.LockStateid
		res, err = c.Compound(opPutFH(dir), opLookup(name), opLockU(nfs4.WRITE_LT, 0, 10, lsid),
			opClose(sid), opPutFH(dir), opSaveFH(), opRename(name, name+"-tmp"), opRename(name+"-tmp", name))
		if err != nil {
			return err
		}
		if res.Status != nfs4.NFS4_OK {
			return fmt.Errorf("worker %d round %d: %s", w, i, summary(res))
		}
	}
	return nil
}

func slotWorker(t *testing.T, c *wiretest.Client, dir []byte, slot uint32, rounds int) error {
	ctx := testCtx(t)
	for i := range rounds {
		res, _, err := c.Send(ctx, &nfs4.COMPOUND4args{Minorversion: 2, Argarray: []nfs4.NfsArgop4{
			wiretest.Seq(c.SessionID, slot, uint32(i+1), false), opPutFH(dir),
			opCreate("tmp", nfs4.Createtype4{Type: nfs4.NF4SOCK}, nfs4.Fattr4{}), opGetattr(nfs4.FATTR4_TYPE),
			opPutFH(dir), opRemove("tmp")}})
		if err != nil {
			return err
		}
		// Slots race for the name; EXIST and NOENT are expected outcomes.
		switch res.Status {
		case nfs4.NFS4_OK, nfs4.NFS4ERR_EXIST, nfs4.NFS4ERR_NOENT:
		default:
			return fmt.Errorf("slot %d round %d: %s", slot, i, summary(res))
		}
		if opStatus(&res.Resarray[0]) != nfs4.NFS4_OK {
			return fmt.Errorf("slot %d round %d: %s", slot, i, summary(res))
		}
	}
	return nil
}

// TestConcurrentWritesKeepSize: parallel WRITEs to one file, some
// FILE_SYNC (which persists the size) and some UNSTABLE, must leave the
// size at the highest end written. Nothing here depends on timing; the
// test can only fail if an interleaving loses a size update.
func TestConcurrentWritesKeepSize(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	ctx := testCtx(t)
	const (
		files   = 40
		writers = 4
	)
	seq := make([]uint32, writers+1)
	for f := range files {
		sid, fh := openFile(t, c, fmt.Sprintf("f%d", f), nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := 1; w <= writers; w++ {
			seq[w]++
			s := seq[w]
			wg.Add(1)
			go func() {
				defer wg.Done()
				stable := nfs4.UNSTABLE4
				if w%2 == 0 {
					stable = nfs4.FILE_SYNC4
				}
				res, _, err := c.Send(ctx, &nfs4.COMPOUND4args{Minorversion: 2, Argarray: []nfs4.NfsArgop4{
					wiretest.Seq(c.SessionID, uint32(w), s, false), opPutFH(fh),
					opWrite(sid, uint64(w-1)*1000, stable, bytes.Repeat([]byte{byte(w)}, 1000))}})
				if err == nil && res.Status != nfs4.NFS4_OK {
					err = fmt.Errorf("%s", summary(res))
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		res := must(t)(c.Compound(opPutFH(fh), opCommit(), opGetattr(nfs4.FATTR4_SIZE)))
		if got := attrsOf(t, res)[nfs4.FATTR4_SIZE]; got != uint64(writers*1000) {
			t.Fatalf("file %d: size %v after parallel writes, want %d", f, got, writers*1000)
		}
	}
}
