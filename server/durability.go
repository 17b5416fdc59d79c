package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// Durability of metadata changes: a COMPOUND's operations change the
// metadata engine under a meta.Deferred context, so that each change is
// written to the engine's log (visible, and safe from a crash of the
// process) without waiting for its fdatasync; the COMPOUND then waits,
// once, at its end, for the log to be durable up to everything the
// engine holds (meta.Syncer.Sync) before its reply is encoded into the
// session's slot and sent. So a COMPOUND that makes several changes (the
// inline WRITE of a small file and the SETATTR of its mtime; OPEN with
// create, WRITE and CLOSE) costs one fdatasync instead of one per change,
// concurrent COMPOUNDs share them, and no reply ever tells a client of a
// change (its own, or one it read that another COMPOUND made) that a
// machine crash could take back. This is the one place replies wait for
// durability; operations do not sync on their own.
//
// With sync: false (Config.Async for the whole server, Export.Sync for
// one export), the knfsd convention's async export, a COMPOUND skips that
// wait if every export it touched is asynchronous (a COMPOUND that
// touched none, such as SEQUENCE alone, follows the server's setting);
// the engine's commit interval (Config.CommitInterval, default 100 ms)
// then bounds how long its changes wait for an fdatasync, which is what a
// machine crash can lose. A crash of the server process loses nothing.
// Operations that promise stability still wait, whatever the export
// says: COMMIT, WRITE answered FILE_SYNC4 (every stable WRITE, and every
// WRITE of inline data, which is metadata), LAYOUTCOMMIT, the pNFS
// commit of a file's size, and a truncation that cuts data off (its data
// goes first: applySetAttr). Their wait covers every change made before,
// the log being one sequence. The orphan freer syncs before it removes an
// unlinked file's data (orphans.go), and client records are stored
// durably (state.go), so a machine crash never brings back a name whose
// data is gone, nor forgets a client that holds state.
//
// Where it pays: a COMPOUND with several changes (OPEN that creates and
// truncates or sets attributes, SETATTR after cached WRITE attributes,
// an inline WRITE and a SETATTR sent together) costs one fdatasync. A
// client that sends a small file's WRITE and its mtime SETATTR in two
// COMPOUNDs, as Shoal's FUSE mount does at close today, still pays one
// for each in the default mode; in async mode only the FILE_SYNC WRITE
// pays.
//
// A failed fdatasync stops the engine's updates until restart (see meta);
// the COMPOUND's last result then becomes NFS4ERR_IO, so the client is
// not told its changes are safe, and every later change (and, on a sync
// export, every read, which could show a change the log may not hold)
// gets NFS4ERR_IO through meta.ErrStoreFailed until the server is
// restarted (TestFailedLogSyncAnswersIO, on a disk whose fdatasyncs fail).
// If the disk is slower than the writers in async mode, the engine makes
// a writer wait once 4,096 records wait for an fdatasync
// (TestWALBackPressureOnSlowDisk, on a disk whose fdatasyncs are held).

// needStable marks the COMPOUND as one whose reply must follow the
// durability of everything it changed, whatever its exports say: the
// operation promised stable storage.
func (c *compound) needStable() { c.durable = true }

// touched records that the COMPOUND used a file of export e.
func (c *compound) touched(e *Export) {
	if e.async {
		c.async = true
	} else {
		c.durable = true
	}
}

// waitDurable runs at the end of a COMPOUND, before its reply is encoded
// into the slot: it waits until what the COMPOUND changed or saw is
// durable, unless the COMPOUND may be answered early. It reports false if
// the log could not be made durable.
func (c *compound) waitDurable() bool {
	s := c.s
	if s.syncer == nil {
		return true
	}
	if !c.durable && (c.async || s.cfg.Async) {
		s.counters.earlyReplies.Add(1)
		return true
	}
	if err := s.syncer.Sync(c.ctx); err != nil {
		c.log.Error("metadata log not durable: failing the COMPOUND", "err", err)
		return false
	}
	s.counters.syncedReplies.Add(1)
	return true
}

// setDurability resolves each export's mode (Export.Sync, else the
// server's) and the COMPOUNDs' context.
func (s *Server) setDurability() {
	for _, e := range s.ns.exports {
		e.async = s.cfg.Async
		if e.Sync != nil {
			e.async = !*e.Sync
		}
	}
	s.cctx = s.life
	if sy, ok := s.meta.(meta.Syncer); ok && sy.Defers() {
		s.syncer = sy
		// Made once: a COMPOUND allocates nothing for it.
		s.cctx = meta.Deferred(s.life)
		return
	}
	// etcd: every change is committed to a quorum before its call
	// returns, so there is nothing to answer early.
	for _, e := range s.ns.exports {
		if e.async {
			s.log.Warn("sync: false has no effect with this metadata engine: every change is durable when answered", "export", e.Path)
			e.async = false
		}
	}
}

// commitInterval is the engine's commit interval as the server opened it.
func (s *Server) commitInterval() time.Duration {
	if s.cfg.CommitInterval > 0 {
		return s.cfg.CommitInterval
	}
	return meta.DefaultCommitInterval
}

// Durability describes how the server answers metadata changes, for
// status pages and logs.
type Durability struct {
	// Sync is the server's mode: true answers a change once durable.
	Sync bool
	// CommitInterval bounds how long an asynchronously answered change
	// waits for durability.
	CommitInterval time.Duration
	// Exports maps each export's path to whether it is answered early
	// (async).
	Exports map[string]bool
}

// Durability reports the server's durability settings.
func (s *Server) Durability() Durability {
	d := Durability{Sync: !s.cfg.Async || s.syncer == nil, CommitInterval: s.commitInterval(), Exports: map[string]bool{}}
	if s.ns != nil {
		for _, e := range s.ns.exports {
			d.Exports[e.Path] = e.async
		}
	}
	return d
}

// String is the mode as `shoal up` and logs say it.
func (d Durability) String() string {
	mode := "sync"
	if !d.Sync {
		mode = "async"
	}
	var async, sync []string
	for path, a := range d.Exports {
		if a && d.Sync {
			async = append(async, path)
		} else if !a && !d.Sync {
			sync = append(sync, path)
		}
	}
	slices.Sort(async)
	slices.Sort(sync)
	if len(async) > 0 {
		mode += "; async exports " + strings.Join(async, ",")
	}
	if len(sync) > 0 {
		mode += "; sync exports " + strings.Join(sync, ",")
	}
	if !d.Sync || len(async) > 0 {
		mode += fmt.Sprintf("; commit interval %v", d.CommitInterval)
	}
	return mode
}

// durableCtx is ctx for changes that must be durable when they return
// whatever the COMPOUND's mode (client records: a client that cannot
// reclaim after a crash loses its opens and locks).
func durableCtx(ctx context.Context) context.Context { return meta.Durable(ctx) }
