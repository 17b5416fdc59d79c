package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// deadHolder is a pNFS cluster with a file that client A, reaching the MDS
// through a cutProxy, has read through the data servers and so holds a
// layout of. Killing the proxy resets A's connection and refuses new ones,
// so A never sees a recall and sends no LAYOUTRETURN, CLOSE or
// DESTROY_SESSION: to the server it is a crashed client.
type deadHolder struct {
	dir   string // the cluster's directory
	ino   uint64
	b     *client.Client // a live client
	a     *client.Client
	af    *client.File // A's open file; closed already with keepLayout
	proxy *cutProxy
}

const (
	deadHolderSize = 4 << 20
	deadHolderPath = "/held"
)

// startDeadHolder sets up the cluster and A's layout. With keepLayout, A
// closes its file but keeps the layout (Policy.KeepLayouts): A then holds
// a layout and no open.
func startDeadHolder(t *testing.T, ctx context.Context, keepLayout bool) *deadHolder {
	noSquash := false
	sctx, scancel := context.WithTimeout(t.Context(), time.Minute)
	defer scancel()
	d := &deadHolder{dir: t.TempDir()}
	cl, err := wiring.Start(sctx, wiring.Config{
		Dir: d.dir, DataServers: 2, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
		// Short, so the server revokes the dead holder soon; the client's
		// DELAY budget is derived from it.
		Lease:  3 * time.Second,
		Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("wiring.Start: %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	mdsAddr := cl.MDS.Addr.String()

	d.b = dialer(mdsAddr, client.Options{})(t)
	t.Cleanup(func() { d.b.Close() })
	want := make([]byte, deadHolderSize)
	pattern(want, 0)
	f, err := d.b.Open(ctx, deadHolderPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := f.Write(want); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close after write: %v", err)
	}
	at, err := d.b.Stat(ctx, deadHolderPath)
	if err != nil {
		t.Fatal(err)
	}
	d.ino = at.Fileid

	// Client A, through the proxy, opens and reads the file and so holds
	// a layout of it.
	d.proxy = newCutProxy(t)
	d.proxy.target.Store(&mdsAddr)
	// No delegation: a REMOVE must recall a read delegation and wait
	// (NFS4ERR_DELAY) for a dead holder's lease to run out, which is not
	// what these tests are about (TestDelegationRevoked is).
	d.a = dialer(d.proxy.ln.Addr().String(), client.Options{NoDelegations: true,
		Policy: client.Policy{KeepLayouts: keepLayout}})(t)
	// Closed after the kill: it cannot reach the server any more.
	t.Cleanup(func() { d.a.Close() })
	d.af, err = d.a.Open(ctx, deadHolderPath, os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("A open: %v", err)
	}
	got := make([]byte, deadHolderSize)
	if _, err := io.ReadFull(d.af, got); err != nil {
		t.Fatalf("A read: %v", err)
	}
	if string(got) != string(want) {
		t.Fatal("A read wrong data")
	}
	if keepLayout {
		if err := d.af.Close(); err != nil {
			t.Fatalf("A close: %v", err)
		}
	}
	if st := d.a.Stats(); st.LayoutGets == 0 || st.LayoutReturns != 0 || st.DSReadBytes == 0 {
		t.Fatalf("A holds no layout after reading through data servers: %+v", st)
	}
	return d
}

// dataObjects counts the data servers' objects of the file.
func (d *deadHolder) dataObjects(t *testing.T) int {
	n := 0
	for i := range 2 {
		p := filepath.Join(d.dir, fmt.Sprintf("ds%d", i), "data", fmt.Sprintf("%02x", d.ino&0xff), strconv.FormatUint(d.ino, 10))
		if _, err := os.Stat(p); err == nil {
			n++
		} else if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	return n
}

// TestRemoveDoesNotWaitForDeadOpenHolder: rm of a file that a dead client
// held open, with a layout, succeeds at once. The server keeps an open
// file's data after its last link goes (an orphan: POSIX unlink semantics
// across clients), so the layout stays valid and needs no recall; the
// data goes when the dead client's lease expires and its state is purged.
// (Before orphans, the server recalled the layout and answered
// NFS4ERR_DELAY until the lease ran out, up to 90 s of a hanging rm.)
func TestRemoveDoesNotWaitForDeadOpenHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	d := startDeadHolder(t, ctx, false)
	if n := d.dataObjects(t); n != 2 {
		t.Fatalf("file has %d data server objects, want 2", n)
	}

	// A dies: its MDS connection is reset, it cannot come back, and af is
	// never closed.
	d.proxy.kill()

	// Not a single NFS4ERR_DELAY.
	if err := client.RemoveNoDelayRetry(ctx, d.b, deadHolderPath); err != nil {
		t.Fatalf("remove of a file a dead client holds open: %v", err)
	}
	if _, err := d.b.Stat(ctx, deadHolderPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat after remove: %v, want not exist", err)
	}
	// Once A's lease is over, its open goes, and the file with it.
	deadline := time.Now().Add(2 * time.Minute)
	for d.dataObjects(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("data server objects of the removed file still there %v after the remove", 2*time.Minute)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := d.a.Stats(); st.LayoutRecalls != 0 || st.LayoutReturns != 0 {
		t.Fatalf("the dead client answered a recall or returned its layout: %+v", st)
	}
}

// TestRemoveWaitsOutDeadLayoutHolder is the regression test for rm failing
// with EIO when another client died holding a layout of the file, and no
// open (it closed the file and kept the layout, Policy.KeepLayouts): the
// MDS recalls the layout before removing the last link, since the file
// and its data server objects go with it, and answers NFS4ERR_DELAY until
// the holder returns it or, if the holder is dead, until its lease runs
// out and the server revokes it. The remover must keep retrying for that
// long (the budget follows the server's lease; see TestDelayBudget for its
// size) and then succeed.
func TestRemoveWaitsOutDeadLayoutHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	d := startDeadHolder(t, ctx, true)
	b, a := d.b, d.a

	// A dies: its MDS connection is reset and it cannot come back.
	d.proxy.kill()

	// The server waits for A's layout: a remove that does not retry
	// NFS4ERR_DELAY sees it at once.
	err := client.RemoveNoDelayRetry(ctx, b, deadHolderPath)
	var se *client.StatusError
	if !errors.As(err, &se) || nfs4.Nfsstat4(se.NFSStatus) != nfs4.NFS4ERR_DELAY {
		t.Fatalf("remove with no DELAY retries: %v, want NFS4ERR_DELAY", err)
	}
	// Cancelling the caller's context ends the wait (the FUSE mount relies
	// on it for an interrupted rm). The cancel comes once the client has
	// retried a DELAY, seconds before the server can revoke A.
	retries := b.Stats().Retries
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 10000 && b.Stats().Retries == retries; i++ {
			time.Sleep(time.Millisecond)
		}
		ccancel()
	}()
	err = b.Remove(cctx, deadHolderPath)
	ccancel()
	<-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("remove with a cancelled context: %v, want context.Canceled", err)
	}

	// The regression: the remove waits until the server revokes A and
	// then succeeds.
	retries = b.Stats().Retries
	if err := b.Remove(ctx, deadHolderPath); err != nil {
		t.Fatalf("remove while a dead client held a layout: %v", err)
	}
	if n := b.Stats().Retries - retries; n == 0 {
		t.Fatal("remove succeeded without a single NFS4ERR_DELAY: the dead client's layout was not waited for")
	}
	if _, err := b.Stat(ctx, deadHolderPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat after remove: %v, want not exist", err)
	}
	// Nobody holds the file open: the MDS frees it in the background
	// right after the REMOVE answered (server/orphans.go).
	deadline := time.Now().Add(time.Minute)
	for n := d.dataObjects(t); n != 0; n = d.dataObjects(t) {
		if time.Now().After(deadline) {
			t.Fatalf("%d data server objects left %v after the remove", n, time.Minute)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := a.Stats(); st.LayoutRecalls != 0 || st.LayoutReturns != 0 {
		t.Fatalf("the dead client answered a recall or returned its layout: %+v", st)
	}
	t.Logf("B %+v", b.Stats())
}
