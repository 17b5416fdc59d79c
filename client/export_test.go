package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// SetMaxBackground gives c's cache n background slots (write-backs and
// readaheads in flight at once) instead of maxBackground, so that tests can
// exercise concurrent write-backs of one file. Call it before any I/O.
func SetMaxBackground(c *Client, n int) {
	if c.cache != nil {
		c.cache.bg = make(chan struct{}, n)
	}
}

// RemoveNoDelayRetry is Remove with a zero NFS4ERR_DELAY budget: it returns
// the server's first DELAY, so tests can see that the server is waiting
// (for example for a recalled layout) without waiting themselves.
func RemoveNoDelayRetry(ctx context.Context, c *Client, path string) error {
	parent, name := splitParent(path)
	ops := append(c.walk(parent), nfs4.NfsArgop4{Argop: nfs4.OP_REMOVE, Opremove: &nfs4.REMOVE4args{Target: []byte(name)}})
	_, err := c.callRetry(ctx, 0, fixed(ops))
	return pathErr("remove", path, err)
}

// StripeOf returns where f's layout puts file offset off: the data
// server's address and its stripe index in the layout, of how many. It
// fetches a layout if f holds none, and fails if the server gives none.
func StripeOf(ctx context.Context, f *File, off int64) (addr string, stripe, stripes int, err error) {
	l := f.layoutFor(ctx)
	if l == nil {
		f.mu.Lock()
		err = f.layRefused
		f.mu.Unlock()
		if err == nil {
			err = errors.New("none held (recalled, or being returned)")
		}
		return "", 0, 0, fmt.Errorf("no layout for %s: %w", f.path, err)
	}
	defer l.release(f)
	pcs, err := l.plan(uint64(off), 1)
	if err != nil {
		return "", 0, 0, err
	}
	if len(pcs) != 1 || len(pcs[0].Copies) == 0 {
		return "", 0, 0, fmt.Errorf("offset %d of %s: not in the layout", off, f.path)
	}
	c := pcs[0].Copies[0]
	return c.Addrs[0], c.Stripe, c.Stripes, nil
}

// CopiesOf returns the addresses of the data servers that hold file
// offset off in f's layout, one per mirror, in the order reads try them.
func CopiesOf(ctx context.Context, f *File, off int64) ([]string, error) {
	l := f.layoutFor(ctx)
	if l == nil {
		return nil, fmt.Errorf("no layout for %s", f.path)
	}
	defer l.release(f)
	pcs, err := l.plan(uint64(off), 1)
	if err != nil {
		return nil, err
	}
	if len(pcs) != 1 {
		return nil, fmt.Errorf("offset %d of %s: %d pieces", off, f.path, len(pcs))
	}
	var addrs []string
	for _, c := range pcs[0].Copies {
		addrs = append(addrs, c.Addrs[0])
	}
	return addrs, nil
}

// HeldBytes returns the memory f uses for copies of its unstable writes
// (Policy.UnstableLimit bounds it).
func HeldBytes(f *File) int64 { return f.unst.heldBytes() }

// IgnoreRecalls makes c answer CB_RECALL with NFS4_OK and then do nothing,
// as a client that hangs would, so that tests see the server revoke the
// delegation.
func IgnoreRecalls(c *Client) { c.ignoreRecalls.Store(true) }

// HideFromRecovery takes f out of the Files a recovery of c reclaims, as
// if its OPEN had been answered by the old server instance only after a
// recovery had collected them; the returned function puts it back, as
// the registration that came too late would.
func HideFromRecovery(c *Client, f *File) (restore func()) {
	c.filesMu.Lock()
	delete(c.files, f)
	c.filesMu.Unlock()
	return func() {
		c.filesMu.Lock()
		c.files[f] = struct{}{}
		c.filesMu.Unlock()
	}
}

// WaitRetired waits until the layouts f is returning in the background
// (after a recall or a failure) are returned.
func WaitRetired(ctx context.Context, f *File) { f.waitRetired(ctx) }

// SetLayoutCommitEvery sets how often background commit rounds send
// LAYOUTCOMMIT (fileLayout.syncRound) and returns a func that restores
// the default.
func SetLayoutCommitEvery(d time.Duration) (restore func()) {
	old := layoutCommitEvery.Swap(int64(d))
	return func() { layoutCommitEvery.Store(old) }
}

// WaitCommit waits for the commit round makeRoom started for f, if one
// runs.
func WaitCommit(ctx context.Context, f *File) { f.unst.waitCommit(ctx) }

// BackgroundCommit runs the commit round makeRoom starts past half the
// limit (one that is running already, if any) and waits for it.
func BackgroundCommit(ctx context.Context, f *File) {
	f.unst.mu.Lock()
	wait := f.unst.room
	if wait == nil {
		wait = f.unst.startCommitLocked(f)
	}
	f.unst.mu.Unlock()
	select {
	case <-wait:
	case <-ctx.Done():
	}
}
