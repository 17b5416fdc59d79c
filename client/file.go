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
	lockOwner []byte

	mu          sync.Mutex
	stateid     nfs4.Stateid4
	lockStateid *nfs4.Stateid4
	locks       []lockRange
	off         int64
	dirty       bool // UNSTABLE data written through the MDS not yet committed
	closed      bool

	// sgen is the generation of the session that stateid (and
	// lockStateid) belong to, 0 if unknown (opened under a delegation);
	// guarded by mu. A recovery that reclaims the File moves it on; a
	// stateid of an earlier session is one the server instance found by
	// the recovery does not know (see recoverOpen).
	sgen uint64
	// lockLost wraps ErrLockLost once a recovery could not reclaim a
	// lock of the File; guarded by mu. I/O reports it; Unlock and Close
	// report it and clear it.
	lockLost error

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

type lockRange struct {
	off, length uint64
	write       bool
}

var (
	_ io.ReaderAt        = (*File)(nil)
	_ io.WriterAt        = (*File)(nil)
	_ io.ReadWriteSeeker = (*File)(nil)
	_ io.Closer          = (*File)(nil)
)

// maxIOInFlight bounds the RPCs one ReadAt or WriteAt keeps outstanding.
const maxIOInFlight = 16

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
	f := &File{c: c, path: path, flag: flag, openOwner: c.newOwner("open"), lockOwner: c.newOwner("lock"), access: shareAccess(flag)}
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
		f.stateid, f.sgen = ok.Stateid, used.gen
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
		f.stateid, f.sgen = ok.Stateid, used.gen
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
	c.mu.Lock()
	c.files[f] = struct{}{}
	// A recovery that installs a session after this sees f among the
	// files to reclaim; one that installed the current session may have
	// looked before f was there, while the OPEN's answer from the
	// server instance it replaced was still on its way.
	stale := f.sgen != 0 && c.sess != nil && c.sess.gen != f.sgen
	c.mu.Unlock()
	if stale {
		if _, err := f.recoverOpen(ctx, f.sgen); err != nil {
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
				f.releaseLayout(l)
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
	c.mu.Lock()
	defer c.mu.Unlock()
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
		g.dropHeldPast(size)
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
		openOwner: c.newOwner("open"), lockOwner: c.newOwner("lock"), access: shareAccess(flag)}
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
	f.stateid, f.sgen = ok.Stateid, used.gen
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

func (f *File) ioStateid() (nfs4.Stateid4, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nfs4.Stateid4{}, ErrClosed
	}
	sid := f.stateid
	sid.Seqid = 0 // "the current one": immune to seqid races with LOCK/OPEN
	return sid, f.lockLost
}

// openGen returns the generation of the session f's open stateid belongs
// to (0: unknown), for recoverOpen.
func (f *File) openGen() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sgen
}

// maxReopens bounds how often one READ or WRITE re-establishes its open
// (recoverOpen) and tries again.
const maxReopens = 3

// staleState reports whether err is the server's refusal of a stateid it
// does not know: one of an earlier server instance (NFS4ERR_STALE_STATEID)
// or of an earlier client ID of this Client (NFS4ERR_BAD_STATEID).
func staleState(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.NFSStatus == nfs4.NFS4ERR_STALE_STATEID || se.NFSStatus == nfs4.NFS4ERR_BAD_STATEID)
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
// reclaiming in (NFS4ERR_GRACE is retried).
func (f *File) recoverOpen(ctx context.Context, gen uint64) (bool, error) {
	// A recovery in progress (it holds recMu) may be about to reclaim f
	// on the new session, during the grace period, and with its locks.
	f.c.recMu.Lock()
	f.c.recMu.Unlock()
	_, cur, err := f.c.current()
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
	case now == cur.gen:
		return false, nil
	}
	var used *session
	res, err := f.c.call(ctx, func() []nfs4.NfsArgop4 {
		_, s, _ := f.c.current()
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
		return false, fmt.Errorf("reopening after the server's state was lost: %w", err)
	}
	ok := res[1].Opopen.Resok4
	var locks []lockRange
	f.mu.Lock()
	if used.gen > f.sgen {
		// Not reclaimed by a recovery meanwhile (the same open owner's
		// open of the file: the same open, whichever answer wins).
		f.stateid, f.sgen = ok.Stateid, used.gen
		f.lockStateid = nil // of the lost session, like the locks
		locks = append(locks, f.locks...)
	}
	f.mu.Unlock()
	if len(locks) > 0 {
		f.loseLocks(locks, errors.New("the open was not reclaimed in the grace period"))
	}
	f.c.dropDelegation(f.fh, &ok.Delegation)
	f.c.log.Info("re-established an open the server had lost", "path", f.path)
	return true, nil
}

// ReadAt implements io.ReaderAt. Reads larger than Client.MaxRead are split
// into several READs that are in flight at once.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	return f.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt with a context.
func (f *File) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("read", f.path, syscall.EINVAL)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := f.ioStateid(); err != nil {
		return 0, pathErr("read", f.path, err)
	}
	var n int
	var err error
	if f.mode() == AccessCached {
		n, err = f.c.cache.read(ctx, f, p, off)
	} else {
		// Whatever the cache or a gather buffer holds for the file goes
		// to the server first (read-your-writes across Files).
		if f.c.cache.pending(f.ino) {
			if err := f.c.cache.flushAll(ctx, f, f.ino); err != nil {
				return 0, pathErr("read", f.path, err)
			}
		}
		n, err = f.readDirect(ctx, p, off)
	}
	if err != nil && err != io.EOF {
		return n, pathErr("read", f.path, err)
	}
	return n, err
}

// readDirect reads p at off from the data servers or the MDS, as asked.
func (f *File) readDirect(ctx context.Context, p []byte, off int64) (int, error) {
	if f.large(&f.readEnd, len(p), off) {
		if l := f.layoutFor(ctx); l != nil {
			n, err := f.pnfsRead(ctx, l, p, off)
			f.releaseLayout(l)
			return n, err
		}
	}
	chunk := int(f.c.maxRead)
	n, err := f.parallel(ctx, len(p), chunk, func(i, lo, hi int) (int, bool, error) {
		return f.readChunk(ctx, p[lo:hi], off+int64(lo))
	})
	if err != nil {
		return n, f.blameDataServer(ctx, off+int64(n), err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// readChunk fills b from off with READs until b is full or the server
// reports EOF.
func (f *File) readChunk(ctx context.Context, b []byte, off int64) (int, bool, error) {
	n := 0
	reopened := 0
	for n < len(b) {
		if _, err := f.ioStateid(); err != nil {
			return n, false, err
		}
		want := uint32(len(b) - n)
		gen := f.openGen()
		res, release, err := f.c.callIORelease(ctx, f.c.ioBudget(), func() []nfs4.NfsArgop4 {
			sid, _ := f.ioStateid()
			return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
				Stateid: sid, Offset: uint64(off) + uint64(n), Count: want,
			}}}
		})
		if err != nil {
			if reopened < maxReopens && staleState(err) {
				if ok, rerr := f.recoverOpen(ctx, gen); ok {
					reopened++
					continue
				} else if rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return n, false, err
		}
		ok := res[1].Opread.Resok4
		got := copy(b[n:], ok.Data)
		eof := ok.Eof
		release() // the data is copied out; nothing else aliases the reply
		f.c.stats.mdsIOBytes.Add(uint64(got))
		n += got
		if eof {
			return n, true, nil
		}
		if got == 0 {
			return n, true, nil // no progress and no EOF: treat as EOF rather than spin
		}
	}
	return n, false, nil
}

// parallel splits [0,total) into chunks of size chunk and runs do on them
// with at most maxIOInFlight at once. It returns the number of bytes done
// contiguously from the start and the first error within them. do returns
// (bytes done, short-by-design, error); a chunk done short ends the run.
func (f *File) parallel(ctx context.Context, total, chunk int, do func(i, lo, hi int) (int, bool, error)) (int, error) {
	if chunk <= 0 {
		chunk = 1 << 20
	}
	nchunks := (total + chunk - 1) / chunk
	if nchunks == 1 {
		n, _, err := do(0, 0, total)
		return n, err
	}
	type result struct {
		n   int
		err error
	}
	results := make([]result, nchunks)
	sem := make(chan struct{}, maxIOInFlight)
	var wg sync.WaitGroup
	for i := range nchunks {
		lo := i * chunk
		hi := min(lo+chunk, total)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			n, _, err := do(i, lo, hi)
			results[i] = result{n, err}
		}()
	}
	wg.Wait()
	done := 0
	for i, r := range results {
		if r.err != nil {
			return done + r.n, r.err
		}
		done += r.n
		if lo, hi := i*chunk, min((i+1)*chunk, total); r.n < hi-lo {
			break
		}
	}
	return done, nil
}

// WriteAt implements io.WriterAt. Writes larger than Client.MaxWrite are
// split into several WRITEs in flight at once. p is sent without copying
// and is not retained after WriteAt returns. Data is written UNSTABLE
// (unless the file was opened O_SYNC) and made durable by Sync or Close;
// until then the File keeps a copy of what the server took UNSTABLE, to
// write it again if the server loses it (Policy.UnstableLimit).
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	return f.WriteAtContext(context.Background(), p, off)
}

// WriteAtContext is WriteAt with a context. If ctx ends while WRITEs are
// in flight, they complete in the background and may still read p until
// they do; keep p unchanged until the File is closed in that case.
func (f *File) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("write", f.path, syscall.EINVAL)
	}
	if f.access&nfs4.OPEN4_SHARE_ACCESS_WRITE == 0 {
		return 0, pathErr("write", f.path, syscall.EBADF)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := f.ioStateid(); err != nil {
		return 0, pathErr("write", f.path, err)
	}
	var n int
	var err error
	switch f.mode() {
	case AccessCached:
		f.cacheWrote.Store(true)
		n, err = f.c.cache.write(ctx, f, p, off)
	case AccessODirect:
		f.cacheWrote.Store(true)
		n, err = f.c.cache.gather(ctx, f, p, off, f.c.pol.BlockSize)
	default:
		n, err = f.c.cache.writeThrough(ctx, f, p, off)
	}
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, pathErr("write", f.path, err)
}

// large decides whether a request of n bytes at off is large enough for
// the data servers (Policy.SmallIOThreshold). It judges the application's
// request, not the pieces it reaches the library in: a short request that
// starts where a large one ended is taken for the tail of the same
// request. The kernel cuts a request whose buffer is not page aligned at
// the FUSE request size, so that fio's 1 MiB buffers reach a direct_io
// mount as 1 MiB - 16 B and then 16 B; without this the 16 bytes made a
// synchronous trip through the MDS after every large WRITE or READ. end
// holds where the last large request ended, plus one (0: none).
func (f *File) large(end *atomic.Int64, n int, off int64) bool {
	if n >= f.c.pol.SmallIOThreshold {
		end.Store(off + int64(n) + 1)
		return true
	}
	return end.CompareAndSwap(off+1, 0)
}

// WriteAtSync is WriteAt with p on stable storage when it returns, for
// data that would be committed right away anyway: a small file written
// whole just before its close. A request under Policy.SmallIOThreshold
// goes to the metadata server as FILE_SYNC WRITEs, so the close that
// follows has nothing to COMMIT: one round trip fewer, and the same one
// disk flush on the server (the kernel NFS client writes a flush that
// fits in one WRITE with FILE_SYNC for the same reason). Anything else is
// WriteAt followed by Sync. Data the File's cache or gather buffer holds
// is written back first.
func (f *File) WriteAtSync(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 || len(p) == 0 || !f.writable() || len(p) >= f.c.pol.SmallIOThreshold || f.writeEnd.Load() == off+1 {
		n, err := f.WriteAtContext(ctx, p, off)
		if err != nil || len(p) == 0 {
			return n, err
		}
		return n, f.SyncContext(ctx)
	}
	if _, err := f.ioStateid(); err != nil {
		return 0, pathErr("write", f.path, err)
	}
	if f.ino != nil && f.c.cache.pending(f.ino) {
		if err := f.c.cache.flushAll(ctx, f, f.ino); err != nil {
			return 0, pathErr("write", f.path, err)
		}
	}
	f.resendMu.RLock()
	n, err := f.parallel(ctx, len(p), int(f.c.maxWrite), func(i, lo, hi int) (int, bool, error) {
		// keep: a server that answers less than FILE_SYNC gets its
		// COMMIT at the next Sync, as for any UNSTABLE write.
		n, _, _, err := f.mdsWrite(ctx, p[lo:hi], off+int64(lo), nfs4.FILE_SYNC4, true)
		return n, false, err
	})
	f.resendMu.RUnlock()
	if err != nil {
		err = f.blameDataServer(ctx, off+int64(n), err)
	}
	f.grewTo(uint64(off) + uint64(n))
	if f.ino != nil {
		f.c.cache.update(f.ino, p[:n], off)
	}
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, pathErr("write", f.path, err)
}

// writeDirect writes p at off to the data servers or the MDS, as asked.
// Unless the File is O_SYNC, what the servers take UNSTABLE is kept until
// a COMMIT vouches for it (unstable.go); a write larger than a quarter of
// Policy.UnstableLimit goes out in parts of that size, and before each the
// File commits what it holds if the part would take it past the limit.
func (f *File) writeDirect(ctx context.Context, p []byte, off int64) (int, error) {
	if f.flag&os.O_SYNC != 0 {
		return f.writeOut(ctx, p, off)
	}
	part := max(int(f.c.pol.UnstableLimit/4), maxIOSize)
	done := 0
	for done < len(p) {
		k := min(part, len(p)-done)
		f.makeRoom(ctx, k)
		n, err := f.writeOut(ctx, p[done:done+k], off+int64(done))
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// writeOut is writeDirect for one part.
func (f *File) writeOut(ctx context.Context, p []byte, off int64) (int, error) {
	var n int
	var err error
	var l *fileLayout
	if f.large(&f.writeEnd, len(p), off) {
		l = f.layoutFor(ctx)
	}
	f.resendMu.RLock()
	if l != nil {
		n, err = f.pnfsRun(ctx, l, p, off, true)
	} else {
		n, err = f.parallel(ctx, len(p), int(f.c.maxWrite), func(i, lo, hi int) (int, bool, error) {
			return f.writeChunk(ctx, p[lo:hi], off+int64(lo))
		})
	}
	f.resendMu.RUnlock()
	if l != nil {
		f.releaseLayout(l)
		if err == nil && f.flag&os.O_SYNC != 0 {
			// Data servers answer DATA_SYNC: the size and mtime need a
			// LAYOUTCOMMIT to be stable too.
			err = f.syncLayout(ctx, l)
		}
	} else if err != nil {
		err = f.blameDataServer(ctx, off+int64(n), err)
	}
	f.grewTo(uint64(off) + uint64(n))
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}

// writeChunk writes b at off through the MDS: UNSTABLE, kept until
// committed, unless the File is O_SYNC.
func (f *File) writeChunk(ctx context.Context, b []byte, off int64) (int, bool, error) {
	stable := nfs4.UNSTABLE4
	if f.flag&os.O_SYNC != 0 {
		stable = nfs4.FILE_SYNC4
	}
	n, _, _, err := f.mdsWrite(ctx, b, off, stable, stable == nfs4.UNSTABLE4)
	return n, false, err
}

// mdsWrite writes b at off through the MDS with WRITEs of the given
// stability until it is all written. With keep, what the MDS answers
// UNSTABLE is kept for the File's next commit through the MDS. It returns
// the weakest stability the MDS answered and its last write verifier.
func (f *File) mdsWrite(ctx context.Context, b []byte, off int64, stable nfs4.StableHow4, keep bool) (int, nfs4.StableHow4, nfs4.Verifier4, error) {
	n := 0
	committed := nfs4.FILE_SYNC4
	var verf nfs4.Verifier4
	reopened := 0
	for n < len(b) {
		if _, err := f.ioStateid(); err != nil {
			return n, committed, verf, err
		}
		gen := f.openGen()
		res, err := f.c.callIO(ctx, func() []nfs4.NfsArgop4 {
			sid, _ := f.ioStateid()
			return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: sid, Offset: uint64(off) + uint64(n), Stable: stable, Data: b[n:],
			}}}
		})
		if err != nil {
			if reopened < maxReopens && staleState(err) {
				if ok, rerr := f.recoverOpen(ctx, gen); ok {
					reopened++
					continue
				} else if rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return n, committed, verf, err
		}
		ok := res[1].Opwrite.Resok4
		cnt := int(min(ok.Count, uint32(len(b)-n)))
		f.c.stats.mdsIOBytes.Add(uint64(cnt))
		verf = ok.Writeverf
		committed = min(committed, ok.Committed)
		if keep {
			f.noteWrite(ok.Committed)
			if ok.Committed == nfs4.UNSTABLE4 && cnt > 0 {
				f.unst.insert(newHeld(uint64(off)+uint64(n), b[n:n+cnt], ok.Writeverf))
			}
		}
		if ok.Count == 0 {
			return n, committed, verf, io.ErrShortWrite
		}
		n += cnt
	}
	return n, committed, verf, nil
}

// noteWrite records a WRITE through the MDS for the commit that follows.
func (f *File) noteWrite(committed nfs4.StableHow4) {
	if committed == nfs4.FILE_SYNC4 {
		return
	}
	f.mu.Lock()
	f.dirty = true
	f.mu.Unlock()
}

// Read implements io.Reader at the file offset.
func (f *File) Read(p []byte) (int, error) {
	f.mu.Lock()
	off := f.off
	f.mu.Unlock()
	n, err := f.ReadAt(p, off)
	f.mu.Lock()
	f.off = off + int64(n)
	f.mu.Unlock()
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Write implements io.Writer at the file offset (or at the end with
// O_APPEND).
func (f *File) Write(p []byte) (int, error) {
	f.mu.Lock()
	off := f.off
	f.mu.Unlock()
	if f.flag&os.O_APPEND != 0 {
		a, err := f.Stat(context.Background())
		if err != nil {
			return 0, err
		}
		off = int64(a.Size)
	}
	n, err := f.WriteAt(p, off)
	f.mu.Lock()
	f.off = off + int64(n)
	f.mu.Unlock()
	return n, err
}

// Seek implements io.Seeker. io.SeekEnd asks the server for the size.
func (f *File) Seek(offset int64, whence int) (int64, error) {
	var base int64
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		f.mu.Lock()
		base = f.off
		f.mu.Unlock()
	case io.SeekEnd:
		a, err := f.Stat(context.Background())
		if err != nil {
			return 0, err
		}
		base = int64(a.Size)
	default:
		return 0, pathErr("seek", f.path, syscall.EINVAL)
	}
	if base+offset < 0 {
		return 0, pathErr("seek", f.path, syscall.EINVAL)
	}
	f.mu.Lock()
	f.off = base + offset
	f.mu.Unlock()
	return base + offset, nil
}

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
				if err := g.syncLayout(ctx, l); err != nil {
					g.mu.Lock()
					g.layErr = errors.Join(g.layErr, err)
					g.mu.Unlock()
				}
			}
		}
		for _, g := range append(sibs, f) {
			g.mu.Lock()
			if l := g.lay; l != nil {
				g.startRetireLocked(l, 0)
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
		g.dropHeldPast(size)
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

// Sync commits UNSTABLE writes to stable storage with COMMIT. Data a
// COMMIT does not vouch for (the server restarted or could not be
// reached since the WRITE) is written again through the metadata server;
// Sync returns an error wrapping ErrVerifierChanged only if even that
// fails, meaning data written since the last successful Sync may be lost.
func (f *File) Sync() error { return f.SyncContext(context.Background()) }

// SyncContext is Sync with a context.
//
// With pNFS, data written to data servers is committed there (COMMIT to
// each of them, then LAYOUTCOMMIT to the MDS), and data written through
// the MDS with a COMMIT to the MDS.
//
// Data the Client caches or gathers for the file is written back first,
// and since any open File of the file may have carried it, every such
// File of the Client commits.
func (f *File) SyncContext(ctx context.Context) error {
	if f.ino == nil {
		return f.syncOwn(ctx)
	}
	errs := []error{pathErr("sync", f.path, f.c.cache.flushAll(ctx, f, f.ino))}
	f.c.cache.mu.Lock()
	ws := make([]*File, 0, len(f.ino.writers))
	for w := range f.ino.writers {
		if w != f {
			ws = append(ws, w)
		}
	}
	f.c.cache.mu.Unlock()
	errs = append(errs, f.syncOwn(ctx))
	for _, w := range ws {
		if err := w.syncOwn(ctx); err != nil && !errors.Is(err, ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncOwn commits what went out through this File.
func (f *File) syncOwn(ctx context.Context) error {
	if f.c.pnfs != nil {
		f.waitRetired(ctx)
	}
	errs := []error{f.commitHeld(ctx)}
	f.mu.Lock()
	errs = append(errs, f.layErr)
	f.layErr = nil
	f.mu.Unlock()
	return pathErr("sync", f.path, errors.Join(errs...))
}

// commitMDS sends COMMIT to the MDS. What was written UNSTABLE through it
// under another verifier than the COMMIT answers, or everything if the
// COMMIT fails, is written again with FILE_SYNC.
func (f *File) commitMDS(ctx context.Context) error {
	f.mdsMu.Lock()
	defer f.mdsMu.Unlock()
	f.mu.Lock()
	f.dirty = false
	f.mu.Unlock()
	cutoff := f.unst.seqNow()
	res, err := f.c.callIO(ctx, fixed([]nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_COMMIT, Opcommit: &nfs4.COMMIT4args{}}}))
	if err != nil && ctx.Err() != nil {
		f.mu.Lock()
		f.dirty = true // not committed: the next Sync tries again
		f.mu.Unlock()
		return err
	}
	var v nfs4.Verifier4
	if err == nil {
		v = res[1].Opcommit.Resok4.Writeverf
	}
	unvouched := func(h *held) bool { return h.lay == nil && h.seq <= cutoff && (err != nil || h.verf != v) }
	if f.unst.any(unvouched) {
		why := "the metadata server's write verifier changed"
		if err != nil {
			why = "COMMIT to the metadata server failed: " + err.Error()
		}
		return f.resendHeld(ctx, unvouched, why)
	}
	if err != nil {
		f.mu.Lock()
		f.dirty = true
		f.mu.Unlock()
		return err
	}
	f.unst.drop(func(h *held) bool { return h.lay == nil && h.seq <= cutoff && h.verf == v })
	return nil
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
	errs := []error{pathErr("close", f.path, f.lockLost)}
	f.lockLost = nil
	f.mu.Unlock()
	if f.writable() {
		errs = append(errs, f.SyncContext(ctx))
	}
	f.c.cache.unregister(f)
	f.mu.Lock()
	locks := append([]lockRange(nil), f.locks...)
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
		f.retire(ctx, lay)
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
	f.c.mu.Lock()
	delete(f.c.files, f)
	f.c.mu.Unlock()
	f.unst.reset() // committed, or reported lost above
	if f.noteLocalClose() {
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
		if _, cur, cerr := f.c.current(); cerr == nil && f.openGen() != 0 && f.openGen() != cur.gen {
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

// LockConflict describes a lock that blocks a requested one (LOCKT's and
// LOCK's LOCK4denied).
type LockConflict struct {
	Offset, Length uint64
	Write          bool
	ClientID       uint64
	Owner          []byte
}

func (l *LockConflict) String() string {
	kind := "read"
	if l.Write {
		kind = "write"
	}
	return fmt.Sprintf("%s lock [%d,+%d) held by client %#x owner %q", kind, l.Offset, l.Length, l.ClientID, l.Owner)
}

func lockType(write, wait bool) nfs4.NfsLockType4 {
	switch {
	case write && wait:
		return nfs4.WRITEW_LT
	case write:
		return nfs4.WRITE_LT
	case wait:
		return nfs4.READW_LT
	}
	return nfs4.READ_LT
}

// forgetCovered drops the held ranges an unlock of [off,+length) covers
// entirely. Partly covered ones are kept whole: after a server restart they
// are reclaimed as they were taken, which errs on the side of holding too
// much.
func forgetCovered(locks []lockRange, off, length uint64) []lockRange {
	kept := locks[:0]
	for _, l := range locks {
		if l.off < off || rangeEnd(l.off, l.length) > rangeEnd(off, length) {
			kept = append(kept, l)
		}
	}
	return kept
}

// rangeEnd is off+length, saturating at the largest offset.
func rangeEnd(off, length uint64) uint64 {
	if length > nfs4.NFS4_UINT64_MAX-off {
		return nfs4.NFS4_UINT64_MAX
	}
	return off + length
}

func lockLen(length uint64) uint64 {
	if length == 0 {
		return nfs4.NFS4_UINT64_MAX // to the end of the file, whatever its size
	}
	return length
}

// Lock takes a byte-range lock on [off, off+length); length 0 means to the
// end of the file. Locks belong to the File (one lock owner per open), so
// two Files conflict even within one Client. If the range is held by
// someone else, Lock fails with an error matching syscall.EAGAIN unless
// wait is set, in which case it polls until it gets the lock or ctx ends.
//
// Cached data of the file is written back and the clean part dropped once
// the lock is taken, since the previous holder may have changed the file.
func (f *File) Lock(ctx context.Context, off, length uint64, write, wait bool) error {
	err := f.lock(ctx, off, length, write, wait)
	if err == nil && f.mode() != AccessDirect {
		if f.c.cache.pending(f.ino) {
			err = pathErr("lock", f.path, f.c.cache.flushAll(ctx, f, f.ino))
		}
		f.c.cache.dropClean(f.ino)
	}
	return err
}

func (f *File) lock(ctx context.Context, off, length uint64, write, wait bool) error {
	length = lockLen(length)
	delay := 50 * time.Millisecond
	for {
		err := f.lockOnce(ctx, off, length, write, wait, false)
		var se *StatusError
		if !wait || !errors.As(err, &se) || se.NFSStatus != nfs4.NFS4ERR_DENIED {
			return pathErr("lock", f.path, err)
		}
		if werr := sleep(ctx, delay); werr != nil {
			return pathErr("lock", f.path, werr)
		}
		delay = min(2*delay, time.Second)
	}
}

func (f *File) lockOnce(ctx context.Context, off, length uint64, write, wait, reclaim bool) error {
	if !reclaim {
		// LOCK takes an open stateid (open_to_lock_owner4).
		if err := f.ensureServerOpen(ctx); err != nil {
			return err
		}
	}
	for attempt := 0; ; attempt++ {
		gen := f.openGen()
		var used *session // the session of the last attempt, which answered
		res, err := f.c.call(ctx, func() []nfs4.NfsArgop4 {
			_, s, _ := f.c.current()
			used = s
			var cid nfs4.Clientid4
			if s != nil {
				cid = s.clientID
			}
			return []nfs4.NfsArgop4{putfh(f.fh), f.lockOp(cid, off, length, write, wait, reclaim)}
		})
		if err != nil {
			if attempt < maxReopens && staleState(err) {
				// The open (or lock) stateid is of a server instance a
				// recovery replaced and did not reclaim it.
				if ok, rerr := f.recoverOpen(ctx, gen); ok {
					continue
				} else if rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return err
		}
		f.mu.Lock()
		if _, cur, _ := f.c.current(); cur != used && attempt < maxReopens {
			// Answered by the server instance a recovery has replaced
			// since, and the recovery may have collected the File's
			// locks before this one was recorded: the new instance
			// does not hold it for us. Ask it.
			f.mu.Unlock()
			continue
		}
		sid := res[1].Oplock.Resok4.LockStateid
		f.lockStateid = &sid
		if !reclaim {
			f.locks = append(f.locks, lockRange{off, length, write})
		}
		f.mu.Unlock()
		return nil
	}
}

func (f *File) lockOp(cid nfs4.Clientid4, off, length uint64, write, wait, reclaim bool) nfs4.NfsArgop4 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var locker nfs4.Locker4
	if f.lockStateid == nil {
		locker = nfs4.Locker4{NewLockOwner: true, OpenOwner: &nfs4.OpenToLockOwner4{
			OpenStateid: f.stateid,
			LockOwner:   nfs4.LockOwner4{Clientid: cid, Owner: f.lockOwner},
		}}
	} else {
		locker = nfs4.Locker4{LockOwner: &nfs4.ExistLockOwner4{LockStateid: *f.lockStateid}}
	}
	return nfs4.NfsArgop4{Argop: nfs4.OP_LOCK, Oplock: &nfs4.LOCK4args{
		Locktype: lockType(write, wait), Reclaim: reclaim, Offset: off, Length: length, Locker: locker,
	}}
}

// Unlock releases [off, off+length) (length 0: to the end of the file).
// Data the Client caches or gathers for the file is written back and
// committed first, for the next holder of the lock to see.
func (f *File) Unlock(ctx context.Context, off, length uint64) error {
	// A lock lost in a recovery is reported here once (and no longer by
	// the File's I/O).
	f.mu.Lock()
	lost := f.lockLost
	f.lockLost = nil
	f.mu.Unlock()
	if f.ino != nil && f.c.cache.pending(f.ino) {
		if err := f.SyncContext(ctx); err != nil {
			return pathErr("unlock", f.path, errors.Join(lost, err))
		}
	}
	length = lockLen(length)
	f.mu.Lock()
	if f.lockStateid == nil {
		f.mu.Unlock()
		return pathErr("unlock", f.path, lost)
	}
	f.mu.Unlock()
	res, err := f.c.call(ctx, func() []nfs4.NfsArgop4 {
		f.mu.Lock()
		defer f.mu.Unlock()
		var sid nfs4.Stateid4 // lost in a failed reclaim: the server will say BAD_STATEID
		if f.lockStateid != nil {
			sid = *f.lockStateid
		}
		return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_LOCKU, Oplocku: &nfs4.LOCKU4args{
			Locktype: nfs4.WRITE_LT, LockStateid: sid, Offset: off, Length: length,
		}}}
	})
	if err != nil {
		return pathErr("unlock", f.path, errors.Join(lost, err))
	}
	f.mu.Lock()
	if sid := res[1].Oplocku.LockStateid; sid != nil {
		f.lockStateid = sid
	}
	f.locks = forgetCovered(f.locks, off, length)
	f.mu.Unlock()
	return pathErr("unlock", f.path, lost)
}

// TestLock reports the lock that would block Lock(off, length, write), or
// nil if there is none. The File's own locks never conflict.
func (f *File) TestLock(ctx context.Context, off, length uint64, write bool) (*LockConflict, error) {
	length = lockLen(length)
	res, err := f.c.call(ctx, func() []nfs4.NfsArgop4 {
		_, s, _ := f.c.current()
		var cid nfs4.Clientid4
		if s != nil {
			cid = s.clientID
		}
		return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_LOCKT, Oplockt: &nfs4.LOCKT4args{
			Locktype: lockType(write, false), Offset: off, Length: length,
			Owner: nfs4.LockOwner4{Clientid: cid, Owner: f.lockOwner},
		}}}
	})
	var se *StatusError
	if errors.As(err, &se) && se.NFSStatus == nfs4.NFS4ERR_DENIED && len(res) > 1 && res[1].Oplockt != nil && res[1].Oplockt.Denied != nil {
		d := res[1].Oplockt.Denied
		return &LockConflict{
			Offset: d.Offset, Length: d.Length,
			Write:    d.Locktype == nfs4.WRITE_LT || d.Locktype == nfs4.WRITEW_LT,
			ClientID: uint64(d.Owner.Clientid), Owner: append([]byte(nil), d.Owner.Owner...),
		}, nil
	}
	if err != nil {
		return nil, pathErr("testlock", f.path, err)
	}
	return nil, nil
}

// reclaim re-opens the file and re-takes its locks on a new session after a
// server restart.
func (f *File) reclaim(ctx context.Context, s *session) error {
	f.mu.Lock()
	if f.closed || f.sgen == s.gen {
		// Closed, or reopened on s already (recoverOpen).
		f.mu.Unlock()
		return nil
	}
	locks := append([]lockRange(nil), f.locks...)
	f.lockStateid = nil
	if l := f.lay; l != nil {
		// The layout died with the old session; commit what went through
		// it and let the next I/O ask for a new one.
		f.startRetireLocked(l, 0)
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
	none := nfs4.OPEN_DELEGATE_NONE
	res, err := open(nfs4.OpenClaim4{Claim: nfs4.CLAIM_PREVIOUS, DelegateType: &none})
	grace := true
	var se *StatusError
	if errors.As(err, &se) && (se.NFSStatus == nfs4.NFS4ERR_NO_GRACE || se.NFSStatus == nfs4.NFS4ERR_RECLAIM_BAD ||
		se.NFSStatus == nfs4.NFS4ERR_NOTSUPP) {
		grace = false
		res, err = open(nfs4.OpenClaim4{Claim: nfs4.CLAIM_FH})
	}
	if err != nil {
		if len(locks) > 0 {
			f.loseLocks(locks, err)
		}
		return err
	}
	ok := res[1].Opopen.Resok4
	f.mu.Lock()
	f.stateid, f.sgen = ok.Stateid, s.gen
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
		lres, err := f.c.exec(ctx, s, false, []nfs4.NfsArgop4{putfh(f.fh), f.lockOp(s.clientID, l.off, l.length, l.write, false, true)})
		if err != nil {
			lost = append(lost, l)
			errs = append(errs, fmt.Errorf("reclaiming lock [%d,+%d): %w", l.off, l.length, err))
			continue
		}
		sid := lres[1].Oplock.Resok4.LockStateid
		f.mu.Lock()
		f.lockStateid = &sid
		f.mu.Unlock()
	}
	if len(lost) > 0 {
		if !grace {
			errs = append(errs, errors.New("the server had no grace period for reclaims"))
		}
		err := errors.Join(errs...)
		f.loseLocks(lost, err)
		return err
	}
	return nil
}

// loseLocks drops the ranges of lost, which a recovery could not reclaim,
// from the File's locks and keeps why for the File's I/O, Unlock and Close
// to report, wrapping ErrLockLost.
func (f *File) loseLocks(lost []lockRange, why error) {
	f.mu.Lock()
	for _, l := range lost {
		for i, h := range f.locks {
			if h == l {
				f.locks = append(f.locks[:i:i], f.locks[i+1:]...)
				break
			}
		}
	}
	if f.lockLost == nil {
		f.lockLost = fmt.Errorf("%w: %d lock(s): %w", ErrLockLost, len(lost), why)
	}
	f.mu.Unlock()
	f.c.log.Warn("byte-range lock lost: not reclaimed after the server lost its state", "path", f.path, "locks", len(lost), "err", why)
}
