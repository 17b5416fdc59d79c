package meta

import (
	"context"
	"fmt"
	"time"
)

// Replay records let a metadata server that took over from another answer
// a non-idempotent namespace request (REMOVE, RENAME, LINK, CREATE, an
// exclusive OPEN create) that the previous server carried out but whose
// reply died with it. The client, which never saw the reply, sends the
// request again on its new session; executing it a second time fails
// (the source of a RENAME is gone, the name of a CREATE exists), and the
// session reply cache that would have caught the retransmission lived in
// the dead server's memory.
//
// The server asks for a record by carrying a ReplayWrite in the context
// of Create, Link, Remove or Rename (WithReplay). The engine then puts the
// record in the same transaction as the change: the record exists if and
// only if the change was committed. The engine fills in what the reply
// needs (ReplayRecord.Ino) and the time; the key and what makes it unique
// are the caller's. The same transaction also deletes ReplayWrite.Drop,
// records the caller knows to be obsolete, so that retiring records costs
// no transaction of its own in the common case.
//
// The engine attaches no meaning to the key: which requests it names,
// when a record may answer one, and when it is obsolete, are the server's
// rules (see the server package's documentation).

// pReplay prefixes replay records:
//
//	'R' owner(16) digest(16) writer(4) seq(8)
//
// so that the records of one request of one client are adjacent (Replays).
const pReplay = 'R'

// replayKeyLen is the length of a replay record's key.
const replayKeyLen = 1 + 16 + 16 + 4 + 8

// ReplayKey names a request of a client: Owner is a digest of the client
// owner (co_ownerid, stable across the client's recovery), Digest one of
// the operation and its arguments.
type ReplayKey struct {
	Owner, Digest [16]byte
}

// ReplayID names one stored record: several may exist under one key (the
// same request sent twice, both times carried out).
type ReplayID struct {
	Key ReplayKey
	// Writer identifies the server instance that wrote the record (the
	// NFS server's boot epoch); Seq makes the ID unique within it.
	Writer uint32
	Seq    uint64
}

// ReplayRecord is one replay record.
type ReplayRecord struct {
	ReplayID
	// Time is when the change was made (the operation's now).
	Time time.Time
	// Op is the caller's code of the operation (the NFS operation number).
	Op uint32
	// Ino is set by the engine: the inode created (Create), linked
	// (Link), removed (Remove) or moved (Rename).
	Ino Ino
}

// ReplayWrite asks Create, Link, Remove and Rename to write Record (when
// Record.Op is not zero) and to delete Drop, in the transaction of the
// change. See WithReplay.
type ReplayWrite struct {
	Record ReplayRecord
	Drop   []ReplayID
}

// MaxReplayDrop bounds ReplayWrite.Drop, so that the deletes never make a
// change's transaction exceed etcd's limit on its operations (a RENAME
// over a file writes about 15 keys; tests run etcd with 32). Longer lists
// are cut: the rest is not deleted.
const MaxReplayDrop = 8

type replayCtxKey struct{}

// WithReplay returns a context that makes the next Create, Link, Remove or
// Rename called with it write w.Record and delete w.Drop in its
// transaction, if the change is committed; after such a call, w.Record.Ino
// and w.Record.Time hold what was written. A failed change writes and
// deletes nothing. Other methods ignore it.
func WithReplay(ctx context.Context, w *ReplayWrite) context.Context {
	return context.WithValue(ctx, replayCtxKey{}, w)
}

func replayFrom(ctx context.Context) *ReplayWrite {
	if ctx == nil {
		return nil
	}
	w, _ := ctx.Value(replayCtxKey{}).(*ReplayWrite)
	return w
}

func replayPrefix(k ReplayKey) []byte {
	b := make([]byte, 0, replayKeyLen)
	b = append(b, pReplay)
	b = append(b, k.Owner[:]...)
	return append(b, k.Digest[:]...)
}

func replayKey(id ReplayID) []byte {
	b := be.AppendUint32(replayPrefix(id.Key), id.Writer)
	return be.AppendUint64(b, id.Seq)
}

// encodeReplay encodes a record's value: version(1) time(8) op(4) ino(8).
func encodeReplay(r *ReplayRecord) []byte {
	b := make([]byte, 0, 21)
	b = append(b, 1)
	b = be.AppendUint64(b, uint64(r.Time.UnixNano()))
	b = be.AppendUint32(b, r.Op)
	return be.AppendUint64(b, uint64(r.Ino))
}

func decodeReplay(k, v []byte) (ReplayRecord, error) {
	var r ReplayRecord
	if len(k) != replayKeyLen || len(v) != 21 || v[0] != 1 {
		return r, fmt.Errorf("meta: replay record %x: %w", k, ErrCorrupt)
	}
	copy(r.Key.Owner[:], k[1:17])
	copy(r.Key.Digest[:], k[17:33])
	r.Writer = be.Uint32(k[33:37])
	r.Seq = be.Uint64(k[37:45])
	r.Time = time.Unix(0, int64(be.Uint64(v[1:9])))
	r.Op = be.Uint32(v[9:13])
	r.Ino = Ino(be.Uint64(v[13:21]))
	return r, nil
}

// replayed writes the record ctx asks for, about ino, and deletes the
// records it retires. The operations call it last in their transaction,
// once the change is certain.
func (x *tx) replayed(ctx context.Context, ino Ino, now time.Time) error {
	w := replayFrom(ctx)
	if w == nil {
		return nil
	}
	if w.Record.Op != 0 {
		w.Record.Ino, w.Record.Time = ino, now
		if err := x.t.Put(replayKey(w.Record.ReplayID), encodeReplay(&w.Record)); err != nil {
			return err
		}
	}
	for i, id := range w.Drop {
		if i == MaxReplayDrop {
			break
		}
		if err := x.t.Delete(replayKey(id)); err != nil {
			return err
		}
	}
	return nil
}

// replayPage bounds the records one transaction reads or deletes.
const replayPage = 256

// Replays returns the records stored under key, in ID order.
func (e *kvEngine) Replays(ctx context.Context, key ReplayKey) ([]ReplayRecord, error) {
	var out []ReplayRecord
	err := e.view(ctx, func(x *tx) error {
		out = out[:0]
		var derr error
		err := x.t.Scan(replayPrefix(key), nil, func(k, v []byte) bool {
			r, err := decodeReplay(k, v)
			if err != nil {
				derr = err
				return false
			}
			out = append(out, r)
			return len(out) < replayPage
		})
		if err != nil {
			return err
		}
		return derr
	})
	return out, err
}

// ListReplays returns up to max records (capped at 256) whose IDs follow
// after (nil: from the first), in ID order.
func (e *kvEngine) ListReplays(ctx context.Context, after *ReplayID, max int) ([]ReplayRecord, error) {
	if max <= 0 {
		return nil, fmt.Errorf("list replays max %d: %w", max, ErrInval)
	}
	max = min(max, replayPage)
	var start []byte
	if after != nil {
		start = append(replayKey(*after), 0)
	}
	var out []ReplayRecord
	err := e.view(ctx, func(x *tx) error {
		out = out[:0]
		var derr error
		err := x.t.Scan([]byte{pReplay}, start, func(k, v []byte) bool {
			r, err := decodeReplay(k, v)
			if err != nil {
				derr = err
				return false
			}
			out = append(out, r)
			return len(out) < max
		})
		if err != nil {
			return err
		}
		return derr
	})
	return out, err
}

// DeleteReplays deletes the records ids, in transactions of at most
// MaxReplayDrop records; missing ones are no error.
func (e *kvEngine) DeleteReplays(ctx context.Context, ids []ReplayID) error {
	for len(ids) > 0 {
		n := min(len(ids), MaxReplayDrop)
		batch := ids[:n]
		ids = ids[n:]
		err := e.update(ctx, func(x *tx) error {
			for _, id := range batch {
				if err := x.t.Delete(replayKey(id)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("delete replay records: %w", err)
		}
	}
	return nil
}

// ExpireReplays deletes the records written before before and returns how
// many it deleted. It pages through all records, each page its own
// transaction.
func (e *kvEngine) ExpireReplays(ctx context.Context, before time.Time) (int, error) {
	n := 0
	var after *ReplayID
	for {
		page, err := e.ListReplays(ctx, after, replayPage)
		if err != nil {
			return n, err
		}
		var old []ReplayID
		for _, r := range page {
			if r.Time.Before(before) {
				old = append(old, r.ReplayID)
			}
		}
		if err := e.DeleteReplays(ctx, old); err != nil {
			return n, err
		}
		n += len(old)
		if len(page) < replayPage {
			return n, nil
		}
		after = &page[len(page)-1].ReplayID
	}
}
