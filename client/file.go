package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"

	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// File is an open regular file: an NFSv4 open stateid plus a file offset
// for the io.Reader/io.Writer/io.Seeker methods. ReadAt and WriteAt may be
// called concurrently; Read, Write and Seek share the offset and should
// not be.
type File struct {
	c         *Client
	path      string
	fh        []byte
	flag      int
	access    uint32
	openOwner []byte

	mu      sync.Mutex
	stateid nfs4.Stateid4
	lk      lockState // byte-range locks (lock.go)
	off     int64
	dirty   bool // UNSTABLE data written through the MDS not yet committed
	closed  bool

	// sgen is the state generation (session.state) that stateid (and
	// lockStateid) belong to, 0 if unknown (opened under a delegation);
	// guarded by mu. A recovery that reclaims the File moves it on; a
	// stateid of an earlier generation is one the server instance found
	// by the recovery does not know (see recoverOpen). A new session on
	// a client ID the server kept keeps the generation.
	sgen uint64

	// Data written UNSTABLE, kept until a COMMIT vouches for it
	// (unstable.go). Writes hold resendMu shared while they are in
	// flight, a resend holds it exclusively; mdsMu serializes commits
	// through the MDS.
	unst     unstable
	resendMu sync.RWMutex
	mdsMu    sync.Mutex

	// pNFS state, guarded by mu except layMu.
	layMu       sync.Mutex    // serializes LAYOUTGET
	lay         *fileLayout   // the layout in use, if any
	retiring    []*fileLayout // layouts being committed and returned
	layRetryAt  time.Time     // no LAYOUTGET before this
	layBackoff  time.Duration
	layOff      bool   // the server will not give this file a layout
	layGetting  bool   // a LAYOUTGET is in flight
	layRecalled bool   // ... and a CB_LAYOUTRECALL arrived meanwhile
	layErr      error  // a background commit failed; reported by Sync
	layRefused  error  // why the last LAYOUTGET failed, if it did
	size        uint64 // the file size as far as this File knows
	sizeKnown   bool
	openAttr    Attr // the attributes OPEN's COMPOUND returned
	// Where the last large read and write ended (see large).
	readEnd, writeEnd atomic.Int64

	// A File opened read-only by handle under a read delegation of the
	// Client is local: it has no open on the server and reads with the
	// delegation stateid until a recall (or a Lock) opens it on the
	// server (deleg.go). local is guarded by mu; convMu serializes the
	// conversion with Close.
	local  *delegation
	convMu sync.Mutex

	// Access methods (cache.go). ino is set at open and never changes.
	ino        *inode
	acc        atomic.Int32 // Access; never AccessDefault
	cacheWrote atomic.Bool  // written through the cache or gather buffer
}

var (
	_ io.ReaderAt        = (*File)(nil)
	_ io.WriterAt        = (*File)(nil)
	_ io.ReadWriteSeeker = (*File)(nil)
	_ io.Closer          = (*File)(nil)
)

// Open opens path with os.O_* flags. O_CREATE creates the file with
// permission bits perm (EXCLUSIVE4_1 with O_EXCL, so an existing file fails
// with fs.ErrExist; UNCHECKED4 otherwise). O_TRUNC truncates it, O_APPEND
// makes Write append (the size is read before each Write, so appends from
// several clients may overlap). O_SYNC makes every WRITE FILE_SYNC instead
// of UNSTABLE plus COMMIT at Sync/Close.
func (c *Client) Open(ctx context.Context, path string, flag int, perm uint32) (*File, error) {
	return c.open(ctx, path, flag, perm, AccessDefault)
}

func (c *Client) open(ctx context.Context, path string, flag int, perm uint32, access Access) (*File, error) {
	parent, name := splitParent(path)
	if name == "" {
		return nil, pathErr("open", path, syscall.EISDIR)
	}
	return c.openIn(ctx, path, c.walk(parent), name, flag, perm, access)
}

// openIn opens name in the directory that start (a walk or a PUTFH)
// makes current: one COMPOUND of start, OPEN, GETFH and GETATTR. path is
// the File's name.
func (c *Client) openIn(ctx context.Context, path string, start []nfs4.NfsArgop4, name string, flag int, perm uint32, access Access) (*File, error) {
	f := &File{c: c, path: path, flag: flag, openOwner: c.newOwner("open"), lk: lockState{owner: c.newOwner("lock")}, access: shareAccess(flag)}
	how := nfs4.Openflag4{Opentype: nfs4.OPEN4_NOCREATE}
	if flag&os.O_CREATE != 0 {
		attrs := modeAttr(perm)
		how = nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: &nfs4.Createhow4{Mode: nfs4.UNCHECKED4, Createattrs: &attrs}}
		if flag&os.O_EXCL != 0 {
			// EXCLUSIVE4_1, not GUARDED4: the server keeps the verifier
			// with the file, so this OPEN sent again (its reply lost to
			// a broken connection, or to a failover to another MDS,
			// which has no reply cache of the first) finds its own file
			// instead of failing with EEXIST (RFC 8881 §18.16.3).
			var verf nfs4.Verifier4
			_, _ = crand.Read(verf[:])
			how.How = &nfs4.Createhow4{Mode: nfs4.EXCLUSIVE4_1, ChCreateboth: &nfs4.Creatverfattr{CvaVerf: verf, CvaAttrs: attrs}}
		}
	}
	file := []byte(name)
	snap := c.beginOpen()
	defer c.endOpen()
	var used *session // the session of the last attempt, which answered
	res, done, err := c.callCreating(ctx, len(start), func() []nfs4.NfsArgop4 {
		_, s, _ := c.current()
		used = s
		var cid nfs4.Clientid4
		if s != nil {
			cid = s.clientID
		}
		ops := append(start[:len(start):len(start)], nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
			ShareAccess: f.access | c.wantDeleg(f.access),
			ShareDeny:   nfs4.OPEN4_SHARE_DENY_NONE,
			Owner:       nfs4.OpenOwner4{Clientid: cid, Owner: f.openOwner},
			Openhow:     how,
			Claim:       nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: &file},
		}}, getfh, getattr(statBits))
		return ops
	})
	var a Attr
	if done {
		// OPEN succeeded, what followed it did not: ask for the handle
		// and attributes instead of opening again.
		ok := res[len(start)].Opopen.Resok4
		f.stateid, f.sgen = ok.Stateid, used.state
		if f.fh, a, err = c.lookupIn(ctx, start, name); err != nil {
			// Without the handle there is nothing to CLOSE: the open
			// ends with the Client's lease.
			c.dropDelegation(nil, &ok.Delegation)
			return nil, pathErr("open", path, err)
		}
		c.gotDelegation(f.fh, c.grantOf(&ok.Delegation, used), &a, snap)
	} else {
		if err != nil {
			return nil, pathErr("open", path, err)
		}
		n := len(res)
		ok := res[n-3].Opopen.Resok4
		f.stateid, f.sgen = ok.Stateid, used.state
		f.fh = append([]byte(nil), res[n-2].Opgetfh.Resok4.Object...)
		if a, err = lastAttr(res); err != nil {
			c.dropDelegation(f.fh, &ok.Delegation)
			return nil, pathErr("open", path, err)
		}
		c.gotDelegation(f.fh, c.grantOf(&ok.Delegation, used), &a, snap)
	}
	f.size, f.sizeKnown = a.Size, true
	f.openAttr = a
	if a.Type != TypeRegular {
		f.layOff = true
	}
	return c.opened(ctx, f, &a, access)
}

// opened finishes Open and OpenHandle: registers the File with the Client
// and its cache, truncates for O_TRUNC and applies the layout policy.
func (c *Client) opened(ctx context.Context, f *File, a *Attr, access Access) (*File, error) {
	if access == AccessDefault {
		access = c.pol.Access
	}
	f.acc.Store(int32(access))
	gen := f.sgen // f is not shared yet: no recovery has reclaimed it
	c.filesMu.Lock()
	c.files[f] = struct{}{}
	c.filesMu.Unlock()
	// A recovery that installs a session after this sees f among the
	// files to reclaim; one that installed the current session may have
	// looked before f was there (it installs the session before it
	// collects the files), while the OPEN's answer from the server
	// instance it replaced was still on its way.
	if _, cur, err := c.current(); err == nil && gen != 0 && cur.state != gen {
		if _, err := c.recoverOpen(ctx, f, gen); err != nil {
			// The File's I/O tries again (recoverOpen) when the
			// server refuses the stale stateid.
			c.log.Warn("re-establishing an open answered by a replaced server instance failed", "path", f.path, "err", err)
		}
	}
	c.cache.register(f, a)
	if f.flag&os.O_TRUNC != 0 && f.writable() && (a == nil || a.Size != 0) {
		if err := f.truncate(ctx, 0); err != nil {
			f.Close()
			return nil, err
		}
	}
	if c.pnfs != nil {
		c.pnfs.adoptKept(f)
		if c.pol.LayoutFetch == LayoutOnOpen {
			if l := f.layoutFor(ctx); l != nil {
				l.release(f)
			}
		}
	}
	return f, nil
}

// grantOf returns the delegation d that an OPEN answered on session used
// grants, or none if a recovery has replaced used since: d is of a server
// instance that is gone, and the recovery has dropped the Client's
// delegations already. Kept, it would let later opens of the file go
// without OPEN and read with a stateid the new instance refuses.
func (c *Client) grantOf(d *nfs4.OpenDelegation4, used *session) *nfs4.OpenDelegation4 {
	if _, cur, _ := c.current(); cur != used {
		return &nfs4.OpenDelegation4{DelegationType: nfs4.OPEN_DELEGATE_NONE}
	}
	return d
}

// OpenAccess is Open with the access method for this File (AccessDefault:
// the Client's, from Options.Policy.Access).
func (c *Client) OpenAccess(ctx context.Context, path string, flag int, perm uint32, access Access) (*File, error) {
	return c.open(ctx, path, flag, perm, access)
}

// filesOf returns the open Files with handle fh.
func (c *Client) filesOf(fh []byte) []*File {
	c.filesMu.Lock()
	defer c.filesMu.Unlock()
	var fs []*File
	for g := range c.files {
		if bytes.Equal(g.fh, fh) {
			fs = append(fs, g)
		}
	}
	return fs
}

// setSize tells every open File of the file with handle fh its new size
// after a truncate.
func (c *Client) setSize(fh []byte, size uint64) {
	for _, g := range c.filesOf(fh) {
		g.mu.Lock()
		g.size, g.sizeKnown = size, true
		g.mu.Unlock()
		g.unst.dropHeldPast(g, size)
	}
}

// writable reports whether the File was opened for writing.
func (f *File) writable() bool { return f.access&nfs4.OPEN4_SHARE_ACCESS_WRITE != 0 }

// Access returns the File's access method. O_SYNC Files always behave as
// AccessDirect, whatever this says.
func (f *File) Access() Access { return Access(f.acc.Load()) }

// SetAccess switches the File's access method (AccessDefault: back to the
// Client's). Data the File's old method holds for the file is written back
// first; an error doing so is returned and the method is left unchanged.
// It may be called at any time, but I/O racing with it may use either
// method.
func (f *File) SetAccess(ctx context.Context, a Access) error {
	if a == AccessDefault {
		a = f.c.pol.Access
	}
	if a < AccessDirect || a > AccessCached {
		return pathErr("setaccess", f.path, syscall.EINVAL)
	}
	if Access(f.acc.Load()) != a && f.c.cache.pending(f.ino) {
		if err := f.c.cache.flushAll(ctx, f, f.ino); err != nil {
			return pathErr("setaccess", f.path, err)
		}
	}
	f.acc.Store(int32(a))
	return nil
}

// mode is the access method in effect for the next I/O.
func (f *File) mode() Access {
	if f.flag&os.O_SYNC != 0 {
		return AccessDirect
	}
	return Access(f.acc.Load())
}

// OpenHandle opens an existing file by its file handle (from Lookup or
// File.Handle) with OPEN's CLAIM_FH, without a path walk. flag is as for
// Open, except that O_CREATE and O_EXCL are meaningless and ignored.
func (c *Client) OpenHandle(ctx context.Context, fh []byte, flag int) (*File, error) {
	name := fmt.Sprintf("handle:%x", fh)
	f := &File{c: c, path: name, fh: append([]byte(nil), fh...), flag: flag,
		openOwner: c.newOwner("open"), lk: lockState{owner: c.newOwner("lock")}, access: shareAccess(flag)}
	if flag&os.O_TRUNC == 0 {
		if a, ok := c.openLocal(ctx, f); ok {
			f.size, f.sizeKnown = a.Size, true
			f.openAttr = a
			if a.Type != TypeRegular {
				f.layOff = true
			}
			return c.opened(ctx, f, &a, AccessDefault)
		}
	}
	snap := c.beginOpen()
	defer c.endOpen()
	var used *session // the session of the last attempt, which answered
	res, err := c.call(ctx, func() []nfs4.NfsArgop4 {
		_, s, _ := c.current()
		used = s
		var cid nfs4.Clientid4
		if s != nil {
			cid = s.clientID
		}
		return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
			ShareAccess: f.access | c.wantDeleg(f.access),
			ShareDeny:   nfs4.OPEN4_SHARE_DENY_NONE,
			Owner:       nfs4.OpenOwner4{Clientid: cid, Owner: f.openOwner},
			Openhow:     nfs4.Openflag4{Opentype: nfs4.OPEN4_NOCREATE},
			Claim:       nfs4.OpenClaim4{Claim: nfs4.CLAIM_FH},
		}}, getattr(statBits)}
	})
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	ok := res[1].Opopen.Resok4
	f.stateid, f.sgen = ok.Stateid, used.state
	var ap *Attr
	if a, err := lastAttr(res); err == nil {
		ap = &a
		f.size, f.sizeKnown = a.Size, true
		f.openAttr = a
		if a.Type != TypeRegular {
			f.layOff = true
		}
	}
	c.gotDelegation(f.fh, c.grantOf(&ok.Delegation, used), ap, snap)
	return c.opened(ctx, f, ap, AccessDefault)
}

func shareAccess(flag int) uint32 {
	switch flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR) {
	case os.O_WRONLY:
		return nfs4.OPEN4_SHARE_ACCESS_WRITE
	case os.O_RDWR:
		return nfs4.OPEN4_SHARE_ACCESS_BOTH
	}
	return nfs4.OPEN4_SHARE_ACCESS_READ
}

// OpenAttr returns the attributes the server returned with the OPEN, in
// the same COMPOUND: for an open that created the file, its attributes
// right after the create, with no GETATTR of its own.
func (f *File) OpenAttr() Attr { return f.openAttr }

// Name returns the path the file was opened with.
func (f *File) Name() string { return f.path }

// Handle returns the file's NFS file handle.
func (f *File) Handle() []byte { return f.fh }

// Stat returns the file's current attributes. While the File's cache or
// gather buffer holds data not yet written back, the size includes it.
func (f *File) Stat(ctx context.Context) (Attr, error) {
	gen := f.c.cache.flushGen()
	a, err := f.statServer(ctx)
	if err != nil {
		return Attr{}, pathErr("stat", f.path, err)
	}
	a.Size = f.c.cache.statSize(f.ino, a.Size, gen)
	return a, nil
}

func (f *File) statServer(ctx context.Context) (Attr, error) {
	if a, ok := f.c.cachedDelegAttr(f.fh); ok {
		return a, nil // no other client changed the file meanwhile
	}
	res, err := f.c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(f.fh), getattr(statBits)}))
	if err != nil {
		return Attr{}, err
	}
	return lastAttr(res)
}

// Truncate changes the file's size. Cached data of the file is written
// back first and cached data past the new size dropped.
func (f *File) Truncate(ctx context.Context, size uint64) error { return f.truncate(ctx, size) }

func (f *File) truncate(ctx context.Context, size uint64) error {
	if f.ino != nil && f.c.cache.pending(f.ino) {
		if err := f.c.cache.flushAll(ctx, f, f.ino); err != nil {
			return pathErr("truncate", f.path, err)
		}
	}
	if f.ino != nil {
		defer f.c.cache.truncated(f.ino, size)
	}
	// Writes through a layout must reach the MDS (LAYOUTCOMMIT) before
	// the size changes, or a later LAYOUTCOMMIT could extend it again. The
	// server recalls the layout for the SETATTR; returning it first saves
	// that round of NFS4ERR_DELAY.
	// Other Files of this Client share the server's layout state for the
	// file: commit theirs too before any of them returns it.
	if f.c.pnfs != nil {
		sibs := f.c.filesOf(f.fh)
		for _, g := range sibs {
			g.mu.Lock()
			l := g.lay
			g.mu.Unlock()
			if l != nil {
				if err := l.sync(ctx, g); err != nil {
					g.mu.Lock()
					g.layErr = errors.Join(g.layErr, err)
					g.mu.Unlock()
				}
			}
		}
		for _, g := range append(sibs, f) {
			g.mu.Lock()
			if l := g.lay; l != nil {
				l.startRetireLocked(g, 0)
			}
			g.mu.Unlock()
		}
		for _, g := range sibs {
			g.waitRetired(ctx)
		}
	}
	f.waitRetired(ctx)
	// What the Files keep of their unstable writes past the new end must
	// never be written again.
	for _, g := range f.c.filesOf(f.fh) {
		g.unst.dropHeldPast(g, size)
	}
	_, err := f.c.call(ctx, func() []nfs4.NfsArgop4 {
		sid, _ := f.ioStateid()
		return []nfs4.NfsArgop4{putfh(f.fh), setattrOp(sid, (&SetAttr{Size: &size}).encode())}
	})
	if err == nil {
		f.c.setSize(f.fh, size)
	}
	return pathErr("truncate", f.path, err)
}

// Close commits unstable data, releases the file's locks and closes the
// open. It returns the first error, including ErrVerifierChanged from the
// commit.
func (f *File) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return pathErr("close", f.path, ErrClosed)
	}
	// A lock lost in a recovery is reported here once (and no longer by
	// the commit's I/O).
	errs := []error{pathErr("close", f.path, f.lk.lost)}
	f.lk.lost = nil
	f.mu.Unlock()
	if f.writable() {
		errs = append(errs, f.SyncContext(ctx))
	}
	f.c.cache.unregister(f)
	f.mu.Lock()
	locks := append([]lockRange(nil), f.lk.held...)
	f.closed = true // no new layouts
	lay := f.lay
	f.mu.Unlock()
	if lay != nil && f.c.pol.KeepLayouts && f.c.pnfs.keep(f, lay) {
		lay = nil
	}
	if lay != nil {
		// Policy: a File returns its layout when it is closed (the server
		// would otherwise have to recall it later, for a truncate, a
		// remove, or a change of data servers).
		lay.retire(ctx, f)
	}
	if f.c.pnfs != nil {
		f.waitRetired(ctx)
		f.mu.Lock()
		errs = append(errs, pathErr("close", f.path, f.layErr))
		f.layErr = nil
		f.mu.Unlock()
	}
	for _, l := range locks {
		errs = append(errs, f.Unlock(ctx, l.off, l.length))
	}
	f.c.filesMu.Lock()
	delete(f.c.files, f)
	f.c.filesMu.Unlock()
	f.unst.waitCommit(ctx)
	f.unst.reset() // committed, or reported lost above
	if f.c.noteLocalClose(f) {
		// Opened under a delegation: there is no open on the server.
		return errors.Join(errs...)
	}
	// After writes through the cache, the change attribute the next open
	// compares with is the one after them.
	noteChange := f.cacheWrote.Load()
	res, err := f.c.call(ctx, func() []nfs4.NfsArgop4 {
		f.mu.Lock()
		sid := f.stateid
		f.mu.Unlock()
		ops := []nfs4.NfsArgop4{putfh(f.fh)}
		if noteChange {
			ops = append(ops, getattr(changeBits))
		}
		return append(ops, nfs4.NfsArgop4{Argop: nfs4.OP_CLOSE, Opclose: &nfs4.CLOSE4args{OpenStateid: sid}})
	})
	if staleState(err) {
		if _, cur, cerr := f.c.current(); cerr == nil && f.openGen() != 0 && f.openGen() != cur.state {
			// Opened at a server instance that a recovery replaced, and
			// not reopened since: the server has no open to close.
			err = nil
		}
	}
	if err == nil && noteChange && len(res) == 3 && res[1].Opgetattr != nil && res[1].Opgetattr.Resok4 != nil {
		var a Attr
		if decodeFattr(&res[1].Opgetattr.Resok4.ObjAttributes, &a, nil) == nil {
			f.c.cache.noteChange(f.ino, a.Change)
		}
	}
	errs = append(errs, pathErr("close", f.path, err))
	return errors.Join(errs...)
}

// errNotReclaimed is File.reclaim's answer when the server refused a
// reclaim (NFS4ERR_NO_GRACE, RECLAIM_BAD, NOTSUPP): the file must be opened
// anew, which the server allows only after the client's RECLAIM_COMPLETE.
var errNotReclaimed = errors.New("nfs: server refused the reclaim")

// reclaim re-opens the file and re-takes its locks on a new session after a
// server restart: with grace, as reclaims (CLAIM_PREVIOUS, reclaim locks),
// answering errNotReclaimed if the server refuses them; without, as a new
// open (after RECLAIM_COMPLETE), whose locks are lost.
func (f *File) reclaim(ctx context.Context, s *session, grace bool) error {
	f.mu.Lock()
	if f.closed || f.sgen == s.state {
		// Closed, or reopened on s already (recoverOpen).
		f.mu.Unlock()
		return nil
	}
	locks := append([]lockRange(nil), f.lk.held...)
	f.lk.stateid = nil
	if l := f.lay; l != nil {
		// The layout died with the old session; commit what went through
		// it and let the next I/O ask for a new one.
		l.startRetireLocked(f, 0)
	}
	f.mu.Unlock()

	open := func(claim nfs4.OpenClaim4) ([]nfs4.NfsResop4, error) {
		return f.c.exec(ctx, s, false, []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
			ShareAccess: f.access | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
			ShareDeny:   nfs4.OPEN4_SHARE_DENY_NONE,
			Owner:       nfs4.OpenOwner4{Clientid: s.clientID, Owner: f.openOwner},
			Openhow:     nfs4.Openflag4{Opentype: nfs4.OPEN4_NOCREATE},
			Claim:       claim,
		}}})
	}
	claim := nfs4.OpenClaim4{Claim: nfs4.CLAIM_FH}
	if grace {
		none := nfs4.OPEN_DELEGATE_NONE
		claim = nfs4.OpenClaim4{Claim: nfs4.CLAIM_PREVIOUS, DelegateType: &none}
	}
	res, err := open(claim)
	var se *StatusError
	if grace && errors.As(err, &se) && (se.status() == nfs4.NFS4ERR_NO_GRACE || se.status() == nfs4.NFS4ERR_RECLAIM_BAD ||
		se.status() == nfs4.NFS4ERR_NOTSUPP) {
		// No reclaim: the file is opened anew once RECLAIM_COMPLETE
		// allows new state (RFC 8881 §18.51.3: before it, NFS4ERR_GRACE),
		// and its locks are lost.
		if len(locks) > 0 {
			f.lk.lose(f, locks, fmt.Errorf("the server had no grace period for reclaims: %w", err))
		}
		return errNotReclaimed
	}
	if err != nil {
		if len(locks) > 0 {
			f.lk.lose(f, locks, err)
		}
		return err
	}
	ok := res[1].Opopen.Resok4
	f.mu.Lock()
	f.stateid, f.sgen = ok.Stateid, s.state
	f.mu.Unlock()
	f.c.dropDelegation(f.fh, &ok.Delegation)
	// Locks are reclaimed, never taken anew: outside the grace period
	// another client may have held a lock meanwhile, and its holder must
	// learn that it lost it (ErrLockLost) rather than carry on as if
	// nothing happened.
	var lost []lockRange
	var errs []error
	for _, l := range locks {
		if !grace {
			lost = append(lost, l)
			continue
		}
		lres, err := f.c.exec(ctx, s, false, []nfs4.NfsArgop4{putfh(f.fh), f.lk.lockOp(f, s.clientID, l.off, l.length, l.write, false, true)})
		if err != nil {
			lost = append(lost, l)
			errs = append(errs, fmt.Errorf("reclaiming lock [%d,+%d): %w", l.off, l.length, err))
			continue
		}
		sid := lres[1].Oplock.Resok4.LockStateid
		f.mu.Lock()
		f.lk.stateid = &sid
		f.mu.Unlock()
	}
	if len(lost) > 0 {
		if !grace {
			errs = append(errs, errors.New("the server had no grace period for reclaims"))
		}
		err := errors.Join(errs...)
		f.lk.lose(f, lost, err)
		return err
	}
	return nil
}

// openGen returns the generation of the session f's open stateid belongs
// to (0: unknown), for recoverOpen.
func (f *File) openGen() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sgen
}

// maxReopens bounds how often one READ, WRITE or LOCK re-establishes its
// open (recoverOpen) and tries again.
const maxReopens = 3

// staleState reports whether err is the server's refusal of a stateid it
// does not know: one of an earlier server instance (NFS4ERR_STALE_STATEID)
// or of an earlier client ID of this Client (NFS4ERR_BAD_STATEID).
func staleState(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.status() == nfs4.NFS4ERR_STALE_STATEID || se.status() == nfs4.NFS4ERR_BAD_STATEID)
}

// recoverOpen re-establishes f's open on the current session if its
// stateid is still from an earlier one, that is, if no recovery reclaimed
// it: the OPEN was answered by the server instance a recovery replaced,
// after that recovery had collected the Files to reclaim, or the
// File's reclaim failed. gen is the generation of the stateid the server
// refused (openGen before the call). It reports whether f's open has
// moved on from gen since, so that the caller's operation is worth
// another try with the File's new stateid; it does not when the refused
// stateid was of the current session already, which no reopen mends.
//
// The Client sent RECLAIM_COMPLETE on the current session once its
// reclaims were done (newSession), so CLAIM_PREVIOUS would be refused
// (NFS4ERR_NO_GRACE, RFC 8881 §18.51.3): the file is opened again with
// CLAIM_FH, which waits out a grace period other clients are still
// reclaiming in (NFS4ERR_GRACE is retried). Locks the File held on the
// lost session are lost (lockState.lose).
func (c *Client) recoverOpen(ctx context.Context, f *File, gen uint64) (bool, error) {
	// A recovery in progress (it holds recMu) may be about to reclaim f
	// on the new session, during the grace period, and with its locks.
	c.recMu.Lock()
	c.recMu.Unlock()
	_, cur, err := c.current()
	if err != nil {
		return false, err
	}
	f.mu.Lock()
	closed, now, local := f.closed, f.sgen, f.local != nil
	f.mu.Unlock()
	switch {
	case closed:
		return false, ErrClosed
	case gen == 0 || local:
		return false, nil // not an open of this Client's on the server
	case now != gen:
		return true, nil // reclaimed or reopened meanwhile
	case now == cur.state:
		return false, nil
	}
	// Not reclaimed by a recovery meanwhile (the same open owner's open
	// of the file: the same open, whichever answer wins).
	notReclaimed := func(used *session) bool { return used.state > f.sgen }
	if err := c.reopenFH(ctx, f, notReclaimed, errors.New("the open was not reclaimed in the grace period")); err != nil {
		return false, fmt.Errorf("reopening after the server's state was lost: %w", err)
	}
	c.log.Info("re-established an open the server had lost", "path", f.path)
	return true, nil
}

// reopenFH opens f again by its file handle (CLAIM_FH) with its open
// owner and access, on the current session, and installs the new stateid
// if install (called with f.mu held and the session the OPEN went on)
// still says so; the locks f held under the old stateid are then lost
// (why). It is how an open the server lost or revoked comes back without
// a grace period.
func (c *Client) reopenFH(ctx context.Context, f *File, install func(used *session) bool, why error) error {
	var used *session
	res, err := c.call(ctx, func() []nfs4.NfsArgop4 {
		_, s, _ := c.current()
		used = s
		var cid nfs4.Clientid4
		if s != nil {
			cid = s.clientID
		}
		return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
			ShareAccess: f.access | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
			ShareDeny:   nfs4.OPEN4_SHARE_DENY_NONE,
			Owner:       nfs4.OpenOwner4{Clientid: cid, Owner: f.openOwner},
			Openhow:     nfs4.Openflag4{Opentype: nfs4.OPEN4_NOCREATE},
			Claim:       nfs4.OpenClaim4{Claim: nfs4.CLAIM_FH},
		}}}
	})
	if err != nil {
		return err
	}
	ok := res[1].Opopen.Resok4
	var locks []lockRange
	f.mu.Lock()
	if install(used) {
		f.stateid, f.sgen = ok.Stateid, used.state
		f.lk.stateid = nil // of the lost state, like the locks
		locks = append(locks, f.lk.held...)
	}
	f.mu.Unlock()
	if len(locks) > 0 {
		f.lk.lose(f, locks, why)
	}
	c.dropDelegation(f.fh, &ok.Delegation)
	return nil
}
