package client

import (
	"context"

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
