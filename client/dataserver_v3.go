package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/shoalfs/shoal/client/layout"
	"github.com/shoalfs/shoal/internal/nfs3"
	"github.com/shoalfs/shoal/internal/nfs4"
)

// NFSv3 data servers: the loosely coupled flexfiles data servers (RFC
// 8435 with ffdv_version 3). The layout gives the data file's NFSv3
// handle and the AUTH_SYS ids to use (layout.Copy.Auth); there is no
// session and no stateid. A dataServer of version 3 keeps one NFSv3
// connection (internal/nfs3), dialled with those ids; reads, writes and
// commits on its copies go over it, and its status errors come back as
// the NFSv4 status of the same meaning, so that the flexfiles error
// handling (LAYOUTERROR, I/O through the MDS) treats them as it treats
// an NFSv4 data server's.

// v3client returns the NFSv3 connection to the data server, dialling it
// if needed.
func (d *dataServer) v3client(ctx context.Context) (*nfs3.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c3 != nil {
		select {
		case <-d.c3.Done():
			d.c3 = nil
		default:
			return d.c3, nil
		}
	}
	if now := time.Now(); now.Before(d.downUntil) {
		return nil, &dsDown{ago: now.Sub(d.failedAt), cause: d.lastErr}
	}
	opts := nfs3.Options{Machine: d.p.c.opts.MachineName, UID: d.p.c.opts.UID, GID: d.p.c.opts.GID}
	if d.p.c.opts.Dial != nil {
		opts.Dial = d.p.c.opts.Dial
	}
	if d.auth != nil {
		opts.UID, opts.GID = d.auth.UID, d.auth.GID
	}
	var err error
	for _, a := range d.addrs {
		dctx, cancel := context.WithTimeout(ctx, dsDialTimeout)
		var c *nfs3.Client
		c, err = nfs3.Dial(dctx, a, opts)
		if err == nil {
			err = c.Null(dctx)
			if err != nil {
				c.Close()
			}
		}
		cancel()
		if err == nil {
			d.c3 = c
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
	}
	d.markDownLocked(err)
	return nil, err
}

// v3done records the outcome of an NFSv3 call on c: a transport failure
// drops the connection and marks the data server down.
func (d *dataServer) v3done(c *nfs3.Client, ctx context.Context, err error) error {
	var se *nfs3.StatusError
	switch {
	case err == nil:
		d.succeeded()
		return nil
	case errors.As(err, &se):
		return &StatusError{Op: se.Proc, NFSStatus: uint32(v4status(se.Status))}
	case ctx.Err() != nil:
		return err
	}
	d.mu.Lock()
	if d.c3 == c {
		d.c3 = nil
		d.markDownLocked(err)
	}
	d.mu.Unlock()
	c.Close()
	return err
}

// v4status maps an NFSv3 status to the NFSv4 status of the same meaning.
func v4status(s nfs3.Nfsstat3) nfs4.Nfsstat4 {
	switch s {
	case nfs3.NFS3ERR_PERM:
		return nfs4.NFS4ERR_PERM
	case nfs3.NFS3ERR_ACCES:
		return nfs4.NFS4ERR_ACCESS
	case nfs3.NFS3ERR_NOENT, nfs3.NFS3ERR_STALE, nfs3.NFS3ERR_BADHANDLE:
		return nfs4.NFS4ERR_STALE
	case nfs3.NFS3ERR_NOSPC:
		return nfs4.NFS4ERR_NOSPC
	case nfs3.NFS3ERR_DQUOT:
		return nfs4.NFS4ERR_DQUOT
	case nfs3.NFS3ERR_FBIG:
		return nfs4.NFS4ERR_FBIG
	case nfs3.NFS3ERR_ROFS:
		return nfs4.NFS4ERR_ROFS
	case nfs3.NFS3ERR_JUKEBOX:
		return nfs4.NFS4ERR_DELAY
	case nfs3.NFS3ERR_INVAL:
		return nfs4.NFS4ERR_INVAL
	}
	return nfs4.NFS4ERR_IO
}

// readV3 reads b from copy e over NFSv3.
func (ds *dataServer) readV3(ctx context.Context, f *File, e *layout.Copy, b []byte) error {
	if err := ds.acquire(ctx); err != nil {
		return err
	}
	defer ds.release()
	c, err := ds.v3client(ctx)
	if err != nil {
		return err
	}
	max := uint32(1 << 20)
	if e.RSize > 0 {
		max = min(max, e.RSize)
	}
	for n := 0; n < len(b); {
		cctx, cancel := context.WithTimeout(ctx, dsCallTimeout)
		data, eof, err := c.Read(cctx, e.FH, e.DSOff+uint64(n), min(uint32(len(b)-n), max))
		err = ds.v3done(c, cctx, err)
		cancel()
		if err != nil {
			return err
		}
		got := copy(b[n:], data)
		f.c.stats.dsReadBytes.Add(uint64(got))
		n += got
		if eof || got == 0 {
			clear(b[n:]) // below the file size, a hole
			return nil
		}
	}
	return nil
}

// writeV3 writes b to copy c over NFSv3.
func (l *fileLayout) writeV3(ctx context.Context, f *File, ds *dataServer, c *layout.Copy, b []byte) copyResult {
	r := copyResult{ds: ds, committed: nfs4.FILE_SYNC4}
	stable := nfs3.UNSTABLE
	if f.flag&os.O_SYNC != 0 {
		stable = nfs3.FILE_SYNC
	}
	if err := ds.acquire(ctx); err != nil {
		r.err = err
		return r
	}
	defer ds.release()
	cl, err := ds.v3client(ctx)
	if err != nil {
		r.err = err
		return r
	}
	max := 1 << 20
	if c.WSize > 0 {
		max = min(max, int(c.WSize))
	}
	haveVerf := false
	for n := 0; n < len(b); {
		cctx, cancel := context.WithTimeout(ctx, dsCallTimeout)
		res, err := cl.Write(cctx, c.FH, c.DSOff+uint64(n), b[n:min(len(b), n+max)], stable)
		err = ds.v3done(cl, cctx, err)
		cancel()
		if err != nil {
			r.err = err
			return r
		}
		if res.Count == 0 {
			r.err = io.ErrShortWrite
			return r
		}
		switch res.Committed {
		case nfs3.UNSTABLE:
			r.committed = nfs4.UNSTABLE4
			v := nfs4.Verifier4(res.Verf)
			if haveVerf && v != r.verf {
				r.mixed = true
			}
			r.verf, haveVerf = v, true
		case nfs3.DATA_SYNC:
			if r.committed == nfs4.FILE_SYNC4 {
				r.committed = nfs4.DATA_SYNC4
			}
		}
		f.c.stats.dsWriteBytes.Add(uint64(res.Count))
		n += int(res.Count)
	}
	return r
}

// commitV3 commits file fh on the data server and returns its verifier.
func (ds *dataServer) commitV3(ctx context.Context, fh []byte) (nfs4.Verifier4, error) {
	if err := ds.acquire(ctx); err != nil {
		return nfs4.Verifier4{}, err
	}
	defer ds.release()
	c, err := ds.v3client(ctx)
	if err != nil {
		return nfs4.Verifier4{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, dsCallTimeout)
	defer cancel()
	v, err := c.Commit(cctx, fh, 0, 0)
	if err = ds.v3done(c, cctx, err); err != nil {
		return nfs4.Verifier4{}, fmt.Errorf("COMMIT: %w", err)
	}
	return nfs4.Verifier4(v), nil
}
