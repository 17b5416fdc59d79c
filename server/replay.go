package server

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server/internal/state"
)

// Durable replay records: exactly-once namespace changes across a failover.
//
// The session reply cache (state.Slot) makes a retransmitted request get
// the reply of its first execution, but it lives in the server's memory.
// When the metadata server dies (kill -9, or a leader that stops without
// Quiesce) after committing a REMOVE, RENAME, LINK, CREATE or GUARDED4
// OPEN create but before its reply left, the client sends the request
// again on its new session with the next server instance, which executes
// it again: a RENAME answers NFS4ERR_NOENT (its source is gone), a REMOVE
// NOENT, a CREATE or LINK NFS4ERR_EXIST. The Linux client reports that to
// the application ("mv: No such file or directory" although the move
// happened).
//
// So every such change writes, in its own metadata transaction (atomic
// with the change, meta.WithReplay), a replay record keyed by a digest of
// the client owner (co_ownerid, which a client keeps across its
// recovery) and a digest of the operation and its arguments, holding the
// boot epoch of the server instance that wrote it (a takeover or restart
// always takes a new epoch, nextEpoch), the time and the inode the reply
// is about. A later instance answers a request from a record only when
// all of these hold:
//
//   - the request failed with exactly the status a second execution of it
//     produces (RENAME: NOENT, and the target name now holds the inode the
//     record says was moved; REMOVE: NOENT; CREATE, LINK, OPEN GUARDED4:
//     EXIST, and the name holds the inode the record names);
//   - the record is under the requester's owner and the same digest;
//   - another server instance wrote it: within one instance the session
//     reply cache answers true retransmissions, so a request that matches
//     a record of this instance is a new one and gets its real answer;
//   - the request arrives within replayWindow after the client came back
//     to this instance: two leases after its RECLAIM_COMPLETE, or after
//     its CREATE_SESSION while it has not sent one. A client resends its
//     outstanding requests as soon as its session is back; the grace
//     period (one lease) bounds how long recovery takes, and one lease
//     more leaves room for a request queued behind the reclaim.
//
// It then answers success as the original reply would have, except that
// change_info4 is not atomic (before and after are the directory's
// change attribute now: the original values are gone), deletes the
// record and counts it (shoal_mds_replays_answered_total).
//
// Narrowing false positives. A record whose reply the client provably
// received is obsolete: an NFSv4.1 client reuses a slot with the next
// sequence ID only after it got the reply of the slot's previous request.
// The server notes the records each slot's request wrote; the next
// SEQUENCE on that slot retires them, and their deletes ride along in the
// next namespace change's transaction (up to meta.MaxReplayDrop each), or
// in a small transaction of their own at most every replayFlushEvery. So
// what survives a crash is nearly only the changes whose replies may not
// have reached their client. Records also expire after replayMaxAge; the
// server sweeps them at start and every lease.
//
// Residual hazard. A record can outlive the proof that its reply arrived:
// when the slot was never used again before the crash, or was reused
// within the last replayFlushEvery before it (the delete was pending).
// If, within replayWindow after recovering, the same client sends an
// identical request again (same operation, directories and names) and it
// fails with the replay status while the names still say what the record
// says (the target of a RENAME still holds the moved file, the name of a
// CREATE still holds the created one), it is answered success instead of
// its real error. A program that repeats a completed "mv a b" right after
// a failover gets success instead of ENOENT; nothing in the namespace
// changes either way.
const (
	replayFlushEvery = 200 * time.Millisecond
	// maxRetired bounds the deletes waiting in memory while the engine
	// fails; records dropped from the list expire instead.
	maxRetired = 1 << 16
)

// replayWindow is how long after a client came back to this instance a
// record of another instance may answer its request (see above).
func replayWindow(lease time.Duration) time.Duration { return 2 * lease }

// replayMaxAge is how long records are kept: longer than a takeover
// (at most about a lease to notice, a lease of grace) plus the window.
func replayMaxAge(lease time.Duration) time.Duration { return 4 * lease }

// replayBook writes, retires and answers from this server's replay
// records. A nil book (a data server, which has no namespace) does
// nothing.
type replayBook struct {
	s      *Server
	writer uint32 // this instance's boot epoch
	seq    atomic.Uint64
	// window is replayWindow of the lease, in nanoseconds (tests
	// change it while serving); maxAge is replayMaxAge.
	window atomic.Int64
	maxAge time.Duration

	// mu guards the maps below. It is never held while calling the
	// engine; it may be held while calling into the state Manager
	// (which never calls back with its locks held), never the other way
	// round.
	mu sync.Mutex
	// bySlot are the records written by the last request of each slot:
	// retired when the slot's next request arrives.
	bySlot map[slotRef][]meta.ReplayID
	// retired are confirmed obsolete and wait to be deleted.
	retired []meta.ReplayID
	// owners caches the owner digest of each session's client, so that
	// a change costs no state lookup and no hash of the owner.
	owners map[state.SessionID][16]byte

	answered, written, dropped, expired atomic.Uint64
	// failing: flush's last attempt failed (it logs a failure once
	// until it succeeds again); only run touches it.
	failing bool
}

type slotRef struct {
	sess state.SessionID
	slot uint32
}

func newReplayBook(s *Server, writer uint32) *replayBook {
	b := &replayBook{s: s, writer: writer, maxAge: replayMaxAge(s.cfg.Lease),
		bySlot: map[slotRef][]meta.ReplayID{}, owners: map[state.SessionID][16]byte{}}
	b.window.Store(int64(replayWindow(s.cfg.Lease)))
	return b
}

// replayDigest is the digest of a request: the operation and its
// arguments that name the change.
func replayDigest(op nfs4.NfsOpnum4, inos []meta.Ino, names ...[]byte) [16]byte {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint32(b[:4], uint32(op))
	h.Write(b[:4])
	for _, ino := range inos {
		binary.BigEndian.PutUint64(b[:], uint64(ino))
		h.Write(b[:])
	}
	for _, n := range names {
		binary.BigEndian.PutUint32(b[:4], uint32(len(n)))
		h.Write(b[:4])
		h.Write(n)
	}
	var d [16]byte
	copy(d[:], h.Sum(nil))
	return d
}

// ownerDigest is the digest of a client owner (co_ownerid).
func ownerDigest(owner []byte) [16]byte {
	s := sha256.Sum256(append([]byte("shoal replay owner\x00"), owner...))
	var d [16]byte
	copy(d[:], s[:])
	return d
}

// replayStart returns the context for the engine call of a namespace
// change op with digest: it has the engine write a replay record (and
// delete retired ones) with the change. w is nil when no record is
// written (no session, a data server); pass it to replayEnd either way.
func (c *compound) replayStart(op nfs4.NfsOpnum4, digest [16]byte) (context.Context, *meta.ReplayWrite) {
	b := c.s.replays
	if b == nil || c.seq == nil {
		return c.ctx, nil
	}
	sid := c.seq.session.ID()
	b.mu.Lock()
	owner, ok := b.owners[sid]
	drop := b.takeRetiredLocked()
	b.mu.Unlock()
	if !ok {
		rec, err := c.s.st.m.Recovery(c.seq.clientID)
		if err != nil {
			b.mu.Lock()
			b.retireLocked(drop...)
			b.mu.Unlock()
			return c.ctx, nil
		}
		owner = ownerDigest(rec.Owner)
		b.mu.Lock()
		if _, err := c.s.st.m.Session(sid); err == nil {
			// Only for a live session: sessionsGone, which follows
			// the Manager's removal, must find what it is to forget.
			b.owners[sid] = owner
		}
		b.mu.Unlock()
	}
	w := &meta.ReplayWrite{Record: meta.ReplayRecord{
		ReplayID: meta.ReplayID{
			Key:    meta.ReplayKey{Owner: owner, Digest: digest},
			Writer: b.writer,
			Seq:    b.seq.Add(1),
		},
		Op: uint32(op),
	}, Drop: drop}
	return meta.WithReplay(c.ctx, w), w
}

// replayEnd notes the outcome of the engine call made with w: on success
// the record belongs to the request's slot; on failure the retired
// records it was to delete wait for the next change.
func (c *compound) replayEnd(w *meta.ReplayWrite, err error) {
	b := c.s.replays
	if w == nil || b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.retireLocked(w.Drop...)
		return
	}
	b.written.Add(1)
	b.dropped.Add(uint64(len(w.Drop)))
	ref := slotRef{c.seq.session.ID(), c.seq.slot.ID()}
	b.bySlot[ref] = append(b.bySlot[ref], w.Record.ReplayID)
}

// replayAnswer reports whether the failed request that made w is a
// retransmission of one another server instance carried out: a record of
// w's key, of op, written by another instance, for which match holds,
// with the client within the window after its recovery (see the comment
// at the top). It deletes the record it answers from.
func (c *compound) replayAnswer(w *meta.ReplayWrite, match func(meta.ReplayRecord) bool) (meta.ReplayRecord, bool) {
	b := c.s.replays
	if w == nil || b == nil {
		return meta.ReplayRecord{}, false
	}
	rec, err := c.s.st.m.Recovery(c.seq.clientID)
	if err != nil {
		return meta.ReplayRecord{}, false
	}
	since := rec.Reclaimed
	if since.IsZero() {
		since = rec.Confirmed
	}
	if since.IsZero() || time.Since(since) > time.Duration(b.window.Load()) {
		return meta.ReplayRecord{}, false
	}
	recs, err := c.s.meta.Replays(c.ctx, w.Record.Key)
	if err != nil {
		c.log.Warn("read replay records", "err", err)
		return meta.ReplayRecord{}, false
	}
	// The newest first: with several (the same request carried out
	// more than once), the last is the one whose reply was lost.
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		if r.Writer == b.writer || r.Op != w.Record.Op || !match(r) {
			continue
		}
		if err := c.s.meta.DeleteReplays(c.ctx, []meta.ReplayID{r.ReplayID}); err != nil {
			// Answering twice from one record is what deleting
			// prevents: without the delete, give the real answer.
			c.log.Warn("delete replay record", "err", err)
			return meta.ReplayRecord{}, false
		}
		b.answered.Add(1)
		c.log.Info("answered a retransmission from a replay record of another server instance",
			"op", nfs4.NfsOpnum4(r.Op), "ino", uint64(r.Ino), "writer", r.Writer, "age", time.Since(r.Time).Round(time.Millisecond))
		return r, true
	}
	return meta.ReplayRecord{}, false
}

// confirm retires the records of the slot's previous request: the
// client sent the slot's next one, so it had the reply.
func (b *replayBook) confirm(sess state.SessionID, slot uint32) {
	if b == nil {
		return
	}
	ref := slotRef{sess, slot}
	b.mu.Lock()
	if ids, ok := b.bySlot[ref]; ok {
		delete(b.bySlot, ref)
		b.retireLocked(ids...)
	}
	b.mu.Unlock()
}

// sessionsGone retires the records of the sessions' slots: a session is
// destroyed by a client that has its replies, or purged with a client
// that cannot send on it again.
func (b *replayBook) sessionsGone(ids ...state.SessionID) {
	if b == nil || len(ids) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		delete(b.owners, id)
	}
	for ref, recs := range b.bySlot {
		for _, id := range ids {
			if ref.sess == id {
				delete(b.bySlot, ref)
				b.retireLocked(recs...)
			}
		}
	}
}

func (b *replayBook) retireLocked(ids ...meta.ReplayID) {
	n := min(len(ids), maxRetired-len(b.retired))
	b.retired = append(b.retired, ids[:max(n, 0)]...)
}

// takeRetiredLocked takes up to meta.MaxReplayDrop retired records for a
// transaction to delete.
func (b *replayBook) takeRetiredLocked() []meta.ReplayID {
	n := min(len(b.retired), meta.MaxReplayDrop)
	if n == 0 {
		return nil
	}
	out := make([]meta.ReplayID, n)
	copy(out, b.retired[len(b.retired)-n:])
	b.retired = b.retired[:len(b.retired)-n]
	return out
}

// run deletes retired records that no change took along, every
// replayFlushEvery, and expired ones at start and every lease, until ctx
// ends.
func (b *replayBook) run(ctx context.Context) {
	if b == nil {
		return
	}
	b.expire(ctx)
	flush := time.NewTicker(replayFlushEvery)
	defer flush.Stop()
	sweep := time.NewTicker(b.s.cfg.Lease)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			// A server stopping in order deletes what it knows to be
			// obsolete, so that the next instance starts with only the
			// records of requests whose replies may have been lost.
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			b.flush(fctx)
			cancel()
			return
		case <-flush.C:
			b.flush(ctx)
		case <-sweep.C:
			b.expire(ctx)
		}
	}
}

// flush deletes the retired records in transactions of their own.
func (b *replayBook) flush(ctx context.Context) {
	n, err := b.deleteRetired(ctx)
	if err != nil {
		if !b.failing && ctx.Err() == nil && !errors.Is(err, meta.ErrClosed) && !errors.Is(err, meta.ErrFenced) {
			b.s.log.Warn("delete retired replay records; retrying every 200ms", "n", n, "err", err)
		}
		b.failing = true
		return
	}
	b.failing = false
}

// deleteRetired deletes the records retired so far; on failure they stay
// retired for the next attempt. It returns how many it tried.
func (b *replayBook) deleteRetired(ctx context.Context) (int, error) {
	if b == nil {
		return 0, nil
	}
	b.mu.Lock()
	ids := b.retired
	b.retired = nil
	b.mu.Unlock()
	if len(ids) == 0 {
		return 0, nil
	}
	if err := b.s.meta.DeleteReplays(ctx, ids); err != nil {
		b.mu.Lock()
		b.retireLocked(ids...)
		b.mu.Unlock()
		return len(ids), err
	}
	b.dropped.Add(uint64(len(ids)))
	return len(ids), nil
}

// expire deletes records older than maxAge.
func (b *replayBook) expire(ctx context.Context) {
	n, err := b.s.meta.ExpireReplays(ctx, time.Now().Add(-b.maxAge))
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, meta.ErrClosed) && !errors.Is(err, meta.ErrFenced) {
			b.s.log.Warn("expire replay records", "err", err)
		}
		return
	}
	b.expired.Add(uint64(n))
}
