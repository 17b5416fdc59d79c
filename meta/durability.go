package meta

import (
	"context"
	"errors"
	"time"
)

// DefaultCommitInterval is how long a change made under a Deferred
// context waits, at most, for the write-ahead log's fdatasync when no
// caller asks for it sooner (BoltOptions.CommitInterval).
const DefaultCommitInterval = 100 * time.Millisecond

type deferredKey struct{}

// Deferred returns a context under which mutating Engine calls may return
// as soon as their change is written to the engine's log, before it is
// durable: written (write(2) done), so a crash of the process loses
// nothing, and visible to every reader, but on stable storage only after
// a Sync, a mutating call made without Deferred (the log is one sequence,
// so making a change durable makes every earlier one durable too), or at
// most the engine's commit interval later. Engines without such a log
// (etcd, bbolt without the WAL) ignore it: their calls return durable.
//
// This lets a caller pay one fdatasync for several changes (the NFS server
// syncs once per COMPOUND, before its reply) or none while it waits (an
// export with sync: false). A caller that acts outside the engine on what
// it read or wrote (answers a client, deletes file data an orphan leaves)
// must Sync first, since what it saw may not survive a machine crash.
//
// Make the context once and keep it (the server derives it from its
// life's context): each call costs one allocation.
func Deferred(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferredKey{}, true)
}

func isDeferred(ctx context.Context) bool {
	if ctx == nil {
		return false
	}
	d, _ := ctx.Value(deferredKey{}).(bool)
	return d
}

// Syncer is implemented by engines whose changes can be visible before
// they are durable (Deferred). Every Engine of this package implements
// it; for engines without a log Sync has nothing to wait for.
type Syncer interface {
	// Sync returns once every change that any caller can see now is
	// durable. It costs nothing when nothing is pending, and concurrent
	// calls share fdatasyncs.
	Sync(ctx context.Context) error
	// Await is Sync without an fdatasync of its own: it returns once
	// the engine's next one (another caller's, or the commit
	// interval's) has made every change visible now durable, so work
	// that can wait that long adds no fdatasyncs.
	Await(ctx context.Context) error
	// LogStats reports the log's counters.
	LogStats() LogStats
	// Defers reports whether the engine honours Deferred at all; for
	// one that does not, every change is durable when its call returns.
	Defers() bool
}

// LogStats counts what the engine's write-ahead log did since it opened.
type LogStats struct {
	// Appends is the number of records written: one per commit round,
	// which holds the changes of every call that shared it.
	Appends uint64
	// Syncs is the number of fdatasyncs that made records durable.
	Syncs uint64
	// Bytes is the size of the records written, padding included.
	Bytes uint64
	// Pending is the number of records written but not yet durable.
	Pending uint64
	// SyncBuckets counts the fdatasyncs by duration: SyncBuckets[i]
	// those that took at most LogSyncBuckets[i] seconds and more than
	// the bound before, the last one those above every bound.
	// SyncTime is their total duration.
	SyncBuckets []uint64
	SyncTime    time.Duration
}

// kvDeferrer is a kvStore that can answer an update once it is written,
// before it is durable.
type kvDeferrer interface {
	// UpdateDeferred is Update that may return before the transaction
	// is durable; its writes are visible when it returns.
	UpdateDeferred(fn func(kvTxn) error) error
	// Sync makes every transaction committed so far durable.
	Sync() error
	// Await waits until every transaction committed so far is durable,
	// without starting an fdatasync.
	Await() error
	logStats() LogStats
}

var _ Syncer = (*kvEngine)(nil)

func (e *kvEngine) Sync(ctx context.Context) error {
	d, ok := e.kv.(kvDeferrer)
	if !ok {
		return nil
	}
	// Not cut short by ctx: an fdatasync is short and not to be
	// abandoned half way, and a caller that stops waiting would answer
	// before its changes are durable.
	if e.closed.Load() {
		return ErrClosed
	}
	if err := d.Sync(); err != nil {
		if errors.Is(err, errKVClosed) {
			return ErrClosed
		}
		return err
	}
	return nil
}

func (e *kvEngine) Await(ctx context.Context) error {
	d, ok := e.kv.(kvDeferrer)
	if !ok {
		return nil
	}
	if e.closed.Load() {
		return ErrClosed
	}
	if err := d.Await(); err != nil {
		if errors.Is(err, errKVClosed) {
			return ErrClosed
		}
		return err
	}
	return nil
}

func (e *kvEngine) Defers() bool {
	_, ok := e.kv.(kvDeferrer)
	return ok
}

func (e *kvEngine) LogStats() LogStats {
	if d, ok := e.kv.(kvDeferrer); ok {
		return d.logStats()
	}
	return LogStats{}
}

func (s *walKV) logStats() LogStats {
	l := LogStats{
		Appends: s.appends.Load(),
		Syncs:   s.syncs.Load(),
		Bytes:   s.appendBytes.Load(),
		Pending: s.written.Load() - min(s.durable.Load(), s.written.Load()),
	}
	l.SyncBuckets, l.SyncTime = s.syncHist.snapshot()
	return l
}

// Durable returns ctx with Deferred undone: mutating calls made with it
// return only once durable, whatever ctx said.
func Durable(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferredKey{}, false)
}
