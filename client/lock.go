package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// Byte-range locks: each File has its own lock owner (OFD-like
// semantics), and remembers what it holds to reclaim it after a server
// restart or failover (File.reclaim).

// lockState is a File's lock owner and what it holds, guarded by the
// File's mu.
type lockState struct {
	owner   []byte
	stateid *nfs4.Stateid4 // nil until the first LOCK
	held    []lockRange    // as taken, for reclaims
	// lost wraps ErrLockLost once a recovery could not reclaim a lock
	// of the File (lose). The File's I/O reports it; Unlock and Close
	// report it and clear it.
	lost error
}

type lockRange struct {
	off, length uint64
	write       bool
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
	err := f.lk.lock(ctx, f, off, length, write, wait)
	if err == nil && f.mode() != AccessDirect {
		if f.c.cache.pending(f.ino) {
			err = pathErr("lock", f.path, f.c.cache.flushAll(ctx, f, f.ino))
		}
		f.c.cache.dropClean(f.ino)
	}
	return err
}

func (lk *lockState) lock(ctx context.Context, f *File, off, length uint64, write, wait bool) error {
	length = lockLen(length)
	delay := 50 * time.Millisecond
	for {
		err := lk.lockOnce(ctx, f, off, length, write, wait, false)
		var se *StatusError
		if !wait || !errors.As(err, &se) || se.status() != nfs4.NFS4ERR_DENIED {
			return pathErr("lock", f.path, err)
		}
		if werr := sleep(ctx, delay); werr != nil {
			return pathErr("lock", f.path, werr)
		}
		delay = min(2*delay, time.Second)
	}
}

func (lk *lockState) lockOnce(ctx context.Context, f *File, off, length uint64, write, wait, reclaim bool) error {
	if !reclaim {
		// LOCK takes an open stateid (open_to_lock_owner4).
		if err := f.c.ensureServerOpen(ctx, f); err != nil {
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
			return []nfs4.NfsArgop4{putfh(f.fh), lk.lockOp(f, cid, off, length, write, wait, reclaim)}
		})
		if err != nil {
			if attempt < maxReopens && staleState(err) {
				// The open (or lock) stateid is of a server instance a
				// recovery replaced and did not reclaim it.
				if ok, rerr := f.c.recoverOpen(ctx, f, gen); ok {
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
		lk.stateid = &sid
		if !reclaim {
			lk.held = append(lk.held, lockRange{off, length, write})
		}
		f.mu.Unlock()
		return nil
	}
}

func (lk *lockState) lockOp(f *File, cid nfs4.Clientid4, off, length uint64, write, wait, reclaim bool) nfs4.NfsArgop4 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var locker nfs4.Locker4
	if lk.stateid == nil {
		locker = nfs4.Locker4{NewLockOwner: true, OpenOwner: &nfs4.OpenToLockOwner4{
			OpenStateid: f.stateid,
			LockOwner:   nfs4.LockOwner4{Clientid: cid, Owner: lk.owner},
		}}
	} else {
		locker = nfs4.Locker4{LockOwner: &nfs4.ExistLockOwner4{LockStateid: *lk.stateid}}
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
	lost := f.lk.lost
	f.lk.lost = nil
	f.mu.Unlock()
	if f.ino != nil && f.c.cache.pending(f.ino) {
		if err := f.SyncContext(ctx); err != nil {
			return pathErr("unlock", f.path, errors.Join(lost, err))
		}
	}
	length = lockLen(length)
	f.mu.Lock()
	if f.lk.stateid == nil {
		f.mu.Unlock()
		return pathErr("unlock", f.path, lost)
	}
	f.mu.Unlock()
	res, err := f.c.call(ctx, func() []nfs4.NfsArgop4 {
		f.mu.Lock()
		defer f.mu.Unlock()
		var sid nfs4.Stateid4 // lost in a failed reclaim: the server will say BAD_STATEID
		if f.lk.stateid != nil {
			sid = *f.lk.stateid
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
		f.lk.stateid = sid
	}
	f.lk.held = forgetCovered(f.lk.held, off, length)
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
			Owner: nfs4.LockOwner4{Clientid: cid, Owner: f.lk.owner},
		}}}
	})
	var se *StatusError
	if errors.As(err, &se) && se.status() == nfs4.NFS4ERR_DENIED && len(res) > 1 && res[1].Oplockt != nil && res[1].Oplockt.Denied != nil {
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

// lose drops the ranges of lost, which a recovery could not reclaim, from
// the locks f holds and keeps why for f's I/O, Unlock and Close to report,
// wrapping ErrLockLost.
func (lk *lockState) lose(f *File, lost []lockRange, why error) {
	f.mu.Lock()
	for _, l := range lost {
		for i, h := range lk.held {
			if h == l {
				lk.held = append(lk.held[:i:i], lk.held[i+1:]...)
				break
			}
		}
	}
	if lk.lost == nil {
		lk.lost = fmt.Errorf("%w: %d lock(s): %w", ErrLockLost, len(lost), why)
	}
	f.mu.Unlock()
	f.c.log.Warn("byte-range lock lost: not reclaimed after the server lost its state", "path", f.path, "locks", len(lost), "err", why)
}
