package client

import (
	"context"
	"errors"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// A server may revoke state without ending the client ID: a courteous
// server whose lease on this client expired keeps the client ID and tells
// it with SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED or
// EXPIRED_SOME_STATE_REVOKED, and an administrator's revocation shows as
// ADMIN_STATE_REVOKED (RFC 8881 §18.46.3, §8.2.4). The client then has to
// find the revoked stateids itself (TEST_STATEID), free them
// (FREE_STATEID) so the server can forget them, and open again what it
// still uses. A revoked open cannot be reclaimed (there is no grace
// period), so its byte-range locks are lost: another client may have
// taken them meanwhile, and pretending otherwise would let two writers
// believe they hold the same range. sweepRevoked (deleg.go) runs the
// sweep; this file adds the opens and locks of the Client's Files.

// heldStateid is one stateid a sweep tests: a delegation's, or the open
// or lock stateid of a File.
type heldStateid struct {
	sid   nfs4.Stateid4
	deleg *delegation // a delegation's stateid
	f     *File       // else an open (lock false) or lock stateid of f
	lock  bool
}

// openStateids appends the open and lock stateids of every File the
// Client has open on the server in its current state generation (Files
// opened under a delegation have none; stateids of an earlier generation
// are a recovery's business, recoverOpen).
func (c *Client) openStateids(dst []heldStateid) []heldStateid {
	_, cur, err := c.current()
	if err != nil {
		return dst
	}
	c.filesMu.Lock()
	files := make([]*File, 0, len(c.files))
	for f := range c.files {
		files = append(files, f)
	}
	c.filesMu.Unlock()
	for _, f := range files {
		f.mu.Lock()
		if !f.closed && f.local == nil && f.sgen == cur.state {
			dst = append(dst, heldStateid{sid: f.stateid, f: f})
			if f.lk.stateid != nil {
				dst = append(dst, heldStateid{sid: *f.lk.stateid, f: f, lock: true})
			}
		}
		f.mu.Unlock()
	}
	return dst
}

// revokedStatus reports whether TEST_STATEID's st says the server revoked
// the stateid or no longer knows it, and whether it is to be freed.
func revokedStatus(st nfs4.Nfsstat4) (revoked, free bool) {
	switch st {
	case nfs4.NFS4ERR_EXPIRED, nfs4.NFS4ERR_ADMIN_REVOKED, nfs4.NFS4ERR_DELEG_REVOKED:
		return true, true
	case nfs4.NFS4ERR_BAD_STATEID:
		return true, false
	}
	return false, false
}

var errStateRevoked = errors.New("the server revoked the open or lock")

// mendRevoked handles an open or lock stateid the sweep found revoked:
// it frees the stateid, reports the File's locks lost, and, for an open,
// opens the file again (CLAIM_FH, as recoverOpen does), so that the
// application's I/O and Close go on with a stateid the server honours.
func (c *Client) mendRevoked(ctx context.Context, h heldStateid, st nfs4.Nfsstat4) {
	revoked, free := revokedStatus(st)
	if !revoked {
		return
	}
	f := h.f
	c.log.Warn("open state revoked by the server", "path", f.path, "lock", h.lock, "status", st.String())
	if free {
		c.freeStateid(ctx, h.sid)
	}
	f.mu.Lock()
	var locks []lockRange
	still := f.stateid.Other == h.sid.Other
	if h.lock {
		still = f.lk.stateid != nil && f.lk.stateid.Other == h.sid.Other
	}
	if still {
		// A revoked open takes its locks with it; a revoked lock
		// stateid, its own.
		f.lk.stateid = nil
		locks = append(locks, f.lk.held...)
	}
	f.mu.Unlock()
	if len(locks) > 0 {
		f.lk.lose(f, locks, errStateRevoked)
	}
	if h.lock || !still {
		c.stats.deleg.opensRevoked.Add(1)
		return
	}
	// Not reopened by a recovery or another sweep meanwhile.
	unchanged := func(*session) bool { return f.stateid.Other == h.sid.Other }
	if err := c.reopenFH(ctx, f, unchanged, errStateRevoked); err != nil {
		c.log.Warn("reopening after the server revoked the open", "path", f.path, "err", err)
	}
	c.stats.deleg.opensRevoked.Add(1)
}
