package fusemount

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shoalfs/shoal/client"
)

// ident is an NFS AUTH_SYS identity.
type ident struct{ uid, gid uint32 }

// clientSlot holds one identity's client; ready is closed once c or err is
// set, so concurrent first requests from one identity dial only once.
type clientSlot struct {
	ready chan struct{}
	c     *client.Client
	err   error
}

// fsys is the state shared by every node of one mount.
type fsys struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	clients map[ident]*clientSlot
	closed  bool

	// fileTTL and dirTTL are the kernel's cache lifetimes (Config's
	// AttrTimeout and DirTimeout with their defaults applied).
	fileTTL, dirTTL time.Duration
	// entries is the mount's name and attribute cache (entrycache.go),
	// nil without one.
	entries *entryCache

	sillySeq atomic.Uint64 // names silly-renamed files uniquely
	// kernelRA is the kernel readahead window of the mount in bytes, as
	// set by New (0: not raised, the kernel's 128 KiB default).
	kernelRA atomic.Int64
}

// identity returns the NFS identity for a FUSE request.
func (f *fsys) identity(ctx context.Context) ident {
	if f.cfg.PerCaller {
		if caller, ok := fuse.FromContext(ctx); ok {
			return ident{caller.Uid, caller.Gid}
		}
	}
	return ident{f.cfg.UID, f.cfg.GID}
}

// client returns the client for the request's identity, dialling it on
// first use. Failures are not cached: the next request dials again.
func (f *fsys) client(ctx context.Context) (*client.Client, syscall.Errno) {
	c, err := f.clientFor(ctx, f.identity(ctx))
	if err != nil {
		f.log.Warn("nfs client unavailable", "err", err)
		return nil, toErrno(err)
	}
	return c, 0
}

func (f *fsys) clientFor(ctx context.Context, id ident) (*client.Client, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, client.ErrClosed
	}
	s, ok := f.clients[id]
	if !ok {
		s = &clientSlot{ready: make(chan struct{})}
		f.clients[id] = s
	}
	f.mu.Unlock()
	if ok {
		select {
		case <-s.ready:
			return s.c, s.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}

	opts := f.cfg.Client
	opts.UID, opts.GID, opts.Root = id.uid, id.gid, f.cfg.Root
	if opts.Policy.Access == client.AccessDefault {
		opts.Policy.Access = f.cfg.Access.client()
	}
	if opts.Logger == nil {
		opts.Logger = f.log
	}
	// The dial outlives the request that triggered it: other requests of
	// the same identity wait for it.
	c, err := client.Dial(context.WithoutCancel(ctx), f.cfg.Addr, opts)
	if err != nil {
		err = fmt.Errorf("dial %s as uid %d gid %d: %w", f.cfg.Addr, id.uid, id.gid, err)
	} else {
		f.log.Debug("nfs client connected", "uid", id.uid, "gid", id.gid, "minor", c.MinorVersion())
	}
	f.mu.Lock()
	closed := f.closed
	s.c, s.err = c, err
	if closed {
		s.c, s.err = nil, client.ErrClosed
	}
	if err != nil || closed {
		delete(f.clients, id)
	}
	f.mu.Unlock()
	close(s.ready)
	if closed && c != nil {
		c.Close()
		return nil, client.ErrClosed
	}
	return c, err
}

// close closes every client connection. It is idempotent.
func (f *fsys) close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	slots := f.clients
	f.clients = nil
	f.mu.Unlock()
	for id, s := range slots {
		<-s.ready
		if s.c != nil {
			if err := s.c.Close(); err != nil {
				f.log.Debug("closing nfs client", "uid", id.uid, "gid", id.gid, "err", err)
			}
		}
	}
}
