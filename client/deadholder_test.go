package client_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/localcluster"
	"github.com/shoalfs/shoal/server"
)

// TestRemoveWaitsOutDeadLayoutHolder is the regression test for rm failing
// with EIO when another client died holding a layout of the file: the
// MDS recalls the layout before removing the last link and answers
// NFS4ERR_DELAY until the holder returns it or, if the holder is dead,
// until its lease runs out and the server revokes it. The remover must
// keep retrying for that long (the budget follows the server's lease; see
// TestDelayBudget for its size) and then succeed.
//
// The dead client reaches the MDS through a cutProxy whose kill resets
// the connection and refuses new ones, so it never sees the recall and
// sends no LAYOUTRETURN, CLOSE or DESTROY_SESSION: to the server it is a
// crashed client.
func TestRemoveWaitsOutDeadLayoutHolder(t *testing.T) {
	const (
		size = 4 << 20
		path = "/held"
	)
	noSquash := false
	sctx, scancel := context.WithTimeout(t.Context(), time.Minute)
	defer scancel()
	cl, err := localcluster.Start(sctx, localcluster.Config{
		Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
		// Short, so the server revokes the dead holder soon; the client's
		// DELAY budget is derived from it.
		Lease:  3 * time.Second,
		Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("localcluster.Start: %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	mdsAddr := cl.MDS.Addr.String()

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	b := dialer(mdsAddr, client.Options{})(t)
	defer b.Close()
	want := make([]byte, size)
	pattern(want, 0)
	f, err := b.Open(ctx, path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := f.Write(want); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close after write: %v", err)
	}

	// Client A, through the proxy, opens and reads the file and so holds
	// a layout of it.
	proxy := newCutProxy(t)
	proxy.target.Store(&mdsAddr)
	a := dialer(proxy.ln.Addr().String(), client.Options{})(t)
	defer a.Close() // after the kill: it cannot reach the server any more
	af, err := a.Open(ctx, path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("A open: %v", err)
	}
	got := make([]byte, size)
	if _, err := io.ReadFull(af, got); err != nil {
		t.Fatalf("A read: %v", err)
	}
	if string(got) != string(want) {
		t.Fatal("A read wrong data")
	}
	if st := a.Stats(); st.LayoutGets == 0 || st.LayoutReturns != 0 || st.DSReadBytes == 0 {
		t.Fatalf("A holds no layout after reading through data servers: %+v", st)
	}

	// A dies: its MDS connection is reset, it cannot come back, and af is
	// never closed.
	proxy.kill()

	// The server waits for A's layout: a remove that does not retry
	// NFS4ERR_DELAY sees it at once.
	err = client.RemoveNoDelayRetry(ctx, b, path)
	var se *client.StatusError
	if !errors.As(err, &se) || se.NFSStatus != nfs4.NFS4ERR_DELAY {
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
	err = b.Remove(cctx, path)
	ccancel()
	<-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("remove with a cancelled context: %v, want context.Canceled", err)
	}

	// The regression: the remove waits until the server revokes A and
	// then succeeds.
	retries = b.Stats().Retries
	if err := b.Remove(ctx, path); err != nil {
		t.Fatalf("remove while a dead client held a layout: %v", err)
	}
	if n := b.Stats().Retries - retries; n == 0 {
		t.Fatal("remove succeeded without a single NFS4ERR_DELAY: the dead client's layout was not waited for")
	}
	if _, err := b.Stat(ctx, path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat after remove: %v, want not exist", err)
	}
	if st := a.Stats(); st.LayoutRecalls != 0 || st.LayoutReturns != 0 {
		t.Fatalf("the dead client answered a recall or returned its layout: %+v", st)
	}
	t.Logf("B %+v", b.Stats())
}
