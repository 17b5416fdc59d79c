package meta

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	bolt "go.etcd.io/bbolt"
)

// walKV implements kvStore as a write-ahead log in front of bbolt (see
// "Durability" in doc.go). Committed changes not yet checkpointed live in
// an in-memory overlay, in two layers: active (written since the last
// checkpoint began) over frozen (being applied to bbolt by a checkpoint).
//
// Locks, in order: syncMu, then mu, then stateMu. The commit loop (one
// goroutine at a time, marked by running) owns wal, seq, master and
// ckptDone; Close takes them over once the loop has stopped. Nothing holds
// a bbolt read transaction while waiting for stateMu, because a bbolt
// commit that grows the file waits for every read transaction to end, and
// snapshot begins one under stateMu. Nothing holds syncMu during an
// fdatasync (cur marks one in progress; wal_sync.go).
type walKV struct {
	db        *bolt.DB
	path      string
	maxBatch  int
	ckptBytes int64
	prealloc  int64
	sync      bool
	// interval bounds how long a written record waits for its fdatasync
	// (BoltOptions.CommitInterval).
	interval time.Duration
	log      *slog.Logger
	// hook, if set (tests), runs after each step of a checkpoint; an
	// error stops the checkpoint there, as a crash would.
	hook func(step string) error
	// syncHook, if set (tests), runs before each fdatasync of the log
	// (synced false) and after each that succeeded, before its callers
	// are answered (synced true); w is the last record it covers.
	syncHook func(f *walFile, w uint64, synced bool)

	mu      sync.Mutex
	idle    *sync.Cond // signalled when running turns false
	pending []*boltCall
	running bool
	closed  bool
	failed  error // a log write or checkpoint failed: no more updates

	// unclean: log files were found at open, so the last run did not
	// Close, and changes it answered under Deferred may be lost
	// (OpenBolt then skips inode numbers: inoGap).
	unclean bool

	// Owned by the commit loop.
	wal      *walFile
	seq      uint64
	master   *ovTree       // the mutable copy of active
	recentM  *ovTree       // the mutable copy of recent
	ckptDone chan struct{} // closed when the running checkpoint ends
	// prewrite: log files are written full of zeros before use, and
	// spare is the next one, being prepared or ready (wal_spare.go).
	prewrite bool
	spare    *walSpare
	// cold: the current log file was not pre-written (an open that
	// found no spare, or a switch whose spare was not ready); the log
	// switches to a spare as soon as one is ready (maybeCheckpoint).
	cold bool

	stateMu sync.RWMutex
	recent  *ovTree // immutable once published; nil when empty
	active  *ovTree // immutable once published
	frozen  *ovTree // immutable; nil when no checkpoint runs

	// written is the sequence number of the last record written to the
	// log (write(2) done: a killed process loses nothing up to it), and
	// durable of the last one known to be on stable storage. written is
	// raised before a record's writes are published, so whatever a reader
	// can see is covered by a sync to written.
	written, durable atomic.Uint64
	syncs, appends   atomic.Uint64 // for LogStats
	appendBytes      atomic.Uint64 // for LogStats
	syncHist         syncHist

	// The group commit of fdatasyncs (wal_sync.go).
	syncMu     sync.Mutex
	syncCond   *sync.Cond        // signalled when an fdatasync ends (cur turns nil)
	cur, next  *syncRound        // the fdatasync running, and the one after it
	syncFile   *walFile          // the file a sync makes durable
	runnable   [1]metrics.Sample // the running round's (othersRunnable)
	syncClosed bool              // Close or a failure: no more syncs
	flushTimer *time.Timer
	flushArmed atomic.Bool // set under syncMu; read without it by armFlush
}

var (
	_ kvStore    = (*walKV)(nil)
	_ kvDeferrer = (*walKV)(nil)
)

// ovEntry is an overlay entry: a value, or a tombstone hiding the key in
// the layers beneath.
type ovEntry struct {
	key, val []byte
	del      bool
}

// A round's writes go to recent, a small layer over active, which is
// folded into active once it holds recentFold entries. Publishing a round
// clones the tree it changed, and the next round's inserts copy every
// node on their paths that the clone shares: in the small tree that is a
// node or two per round, in active (tens of thousands of entries between
// checkpoints) three levels for every key, which were about a fifth of
// the MDS's allocations per create, stat and remove
// (server.BenchmarkSmallFileOps). A fold copies each path once for
// recentFold entries.
const recentFold = 256

// ovTree holds pointers, not entries: a round's inserts copy the nodes
// on their paths that the published clone shares (copy-on-write), and a
// node of pointers is a seventh of the bytes to copy and to scan for the
// garbage collector (BenchmarkCreate/bolt-wal-nosync/par1 on a 2-core VM:
// 38 µs and 59 KB per create with entries in the nodes, 20 µs and 15 KB
// with pointers).
type ovTree = btree.BTreeG[*ovEntry]

func newOvTree() *ovTree {
	return btree.NewG(32, func(a, b *ovEntry) bool { return bytes.Compare(a.key, b.key) < 0 })
}

const (
	defaultCheckpointBytes = 16 << 20
	walPreallocSlack       = 4 << 20
)

// openWALKV opens the bbolt database at path and recovers its log: the
// records of every log file are applied to bbolt in one synced
// transaction, the files removed, and a fresh log started.
func openWALKV(path string, opts BoltOptions, hook func(string) error) (*walKV, error) {
	db, err := openBoltDB(path, opts)
	if err != nil {
		return nil, err
	}
	s := &walKV{db: db, path: path, maxBatch: opts.MaxBatch, ckptBytes: opts.WALCheckpointBytes,
		sync: !opts.NoSync, interval: opts.CommitInterval, log: slog.Default().With("db", path), hook: hook,
		prewrite: !opts.NoSync && !opts.fallocateLog}
	if s.maxBatch <= 0 {
		s.maxBatch = 128
	}
	if s.interval <= 0 {
		s.interval = DefaultCommitInterval
	}
	if s.ckptBytes <= 0 {
		s.ckptBytes = defaultCheckpointBytes
	}
	s.prealloc = s.ckptBytes + min(s.ckptBytes, walPreallocSlack)
	s.idle = sync.NewCond(&s.mu)
	s.syncCond = sync.NewCond(&s.syncMu)
	s.runnable[0].Name = "/sched/goroutines/runnable:goroutines"
	if err := s.recover(); err != nil {
		db.Close()
		return nil, err
	}
	s.syncFile = s.wal
	s.written.Store(s.seq)
	s.durable.Store(s.seq)
	s.flushTimer = time.AfterFunc(time.Hour, s.flush)
	s.flushTimer.Stop()
	s.master, s.recentM = newOvTree(), newOvTree()
	s.active = s.master.Clone()
	return s, nil
}

func (s *walKV) recover() error {
	l, err := replayWAL(s.db, s.path, s.sync, s.log)
	if err != nil {
		return err
	}
	s.seq = l.lastSeq
	s.unclean = l.lastGen != 0
	s.wal, err = s.firstWALFile(l.lastGen + 1)
	return err
}

// firstWALFile starts the log at open: from the spare the last run left
// ready, or else a preallocated file, cold until a spare replaces it
// (wal_spare.go: an open does not wait for 20 MiB of zeros, and a store
// that writes little never writes them).
func (s *walKV) firstWALFile(gen uint64) (*walFile, error) {
	if !s.prewrite {
		return createWALFile(s.path, gen, s.prealloc, s.sync, false)
	}
	f, err := openReadySpare(s.path, s.prealloc)
	if err != nil {
		return nil, err
	}
	if f != nil {
		return useSpare(s.path, f, gen, s.sync)
	}
	s.cold = true
	return createWALFile(s.path, gen, s.prealloc, s.sync, false)
}

// nextWALFile makes log file gen at a checkpoint's switch: the spare if
// it is ready, else a preallocated file, so the switch never waits for
// zeros to be written.
func (s *walKV) nextWALFile(gen uint64) (*walFile, error) {
	if sp := s.spare; sp != nil {
		f, spent, err := sp.take()
		if spent {
			s.spare = nil
			if err == nil {
				s.cold = false
				return useSpare(s.path, f, gen, s.sync)
			}
			s.log.Warn("meta: preparing the next log file failed; using a preallocated one", "err", err)
		}
	}
	s.cold = s.prewrite
	return createWALFile(s.path, gen, s.prealloc, s.sync, false)
}

// releaseSpare stops or closes the spare (Close, or a crash in tests);
// a ready one stays on disk for the next open.
func (s *walKV) releaseSpare() {
	if s.spare != nil {
		s.spare.release()
		s.spare = nil
	}
}

// replayWAL applies the log files of the database at path to bbolt and
// removes them. Opening without the log runs it too, so that a database
// last written with the log neither loses its tail nor, worse, gets an
// old tail replayed over newer changes when the log is used again.
func replayWAL(db *bolt.DB, path string, sync bool, log *slog.Logger) (walLog, error) {
	gens, err := listWALFiles(path)
	if err != nil {
		return walLog{}, fmt.Errorf("meta: list WAL of %s: %w", path, err)
	}
	l, err := readWAL(path, gens)
	if err != nil {
		return walLog{}, err
	}
	if len(l.records) > 0 {
		err := db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketName)
			for _, r := range l.records {
				for _, op := range r.ops {
					if err := applyOp(b, op); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return walLog{}, fmt.Errorf("meta: replay WAL of %s: %w", path, err)
		}
		log.Info("meta: replayed write-ahead log", "records", len(l.records), "last_seq", l.lastSeq)
	}
	// bbolt now holds everything the log did. Remove the old files before
	// creating a new one, so a damaged tail in an old file can never be
	// followed by new records at the next open.
	if err := removeWALFiles(path, gens, sync); err != nil {
		return walLog{}, err
	}
	l.records = nil
	return l, nil
}

func applyOp(b *bolt.Bucket, op walOp) error {
	if op.del {
		return b.Delete(op.key)
	}
	return b.Put(op.key, op.val)
}

// walSnap is a consistent read view: overlay layers, newest first, over a
// bbolt read transaction.
type walSnap struct {
	layers []*ovTree
	lbuf   [3]*ovTree // layers' backing array
	tx     *bolt.Tx
	b      *bolt.Bucket
}

// snapshot pairs the published overlay with a bbolt read transaction begun
// under the same stateMu read lock. A checkpoint freezes active only under
// the write lock, so bbolt either lacks or already holds the frozen layer
// (which then shadows identical values); it never holds writes newer than
// the overlay taken.
func (s *walKV) snapshot() (*walSnap, error) {
	s.stateMu.RLock()
	defer s.stateMu.RUnlock()
	tx, err := s.db.Begin(false)
	if err != nil {
		return nil, err
	}
	sn := &walSnap{tx: tx, b: tx.Bucket(bucketName)}
	sn.layers = sn.lbuf[:0]
	if s.recent != nil {
		sn.layers = append(sn.layers, s.recent)
	}
	if s.active.Len() > 0 {
		sn.layers = append(sn.layers, s.active)
	}
	if s.frozen != nil {
		sn.layers = append(sn.layers, s.frozen)
	}
	return sn, nil
}

func (s *walKV) View(fn func(kvTxn) error) error {
	sn, err := s.snapshot()
	if err != nil {
		if errors.Is(err, bolt.ErrDatabaseNotOpen) {
			return errKVClosed
		}
		return err
	}
	defer sn.tx.Rollback()
	return fn(&walTxn{snap: sn})
}

func (s *walKV) Update(fn func(kvTxn) error) error {
	seq, err := s.update(fn)
	if err != nil || seq == 0 {
		return err
	}
	return s.syncTo(seq)
}

// UpdateDeferred is Update that returns once the transaction's record is
// written to the log, before it is durable (see kvDeferrer). If more than
// maxPending records are waiting for an fdatasync (the disk is slower
// than the writers), it waits for one: what a machine crash can lose
// stays bounded even when the commit interval's timer cannot keep up.
func (s *walKV) UpdateDeferred(fn func(kvTxn) error) error {
	seq, err := s.update(fn)
	if err != nil || seq == 0 || seq-min(seq, s.durable.Load()) <= maxPending {
		return err
	}
	return s.syncTo(seq)
}

// coldSpareAt is how much a cold log file (not pre-written) holds before
// a spare is prepared to replace it early: enough that a store opened for
// a moment (a test, a command) never writes one, little enough that a
// busy server switches to a pre-written file within its first few
// hundred changes.
const coldSpareAt = 64 << 10

// maxPending bounds the log records written and not yet durable.
const maxPending = 1 << 12

// inoGap returns how many inode numbers OpenBolt skips after an unclean
// shutdown: more than the unsynced records a machine crash can have
// lost could have allocated (each transaction allocates at most one), so
// that no number a client may have been given before the crash is
// handed out again (file handles never alias). 0 after a clean Close.
func (s *walKV) inoGap() uint64 {
	if !s.unclean {
		return 0
	}
	return uint64(maxPending+1) * uint64(s.maxBatch) * 2
}

// update runs fn in a commit round and returns the sequence number of the
// record that holds its writes once that record is written (0 if the
// round wrote nothing).
func (s *walKV) update(fn func(kvTxn) error) (uint64, error) {
	c := &boltCall{fn: fn, err: make(chan error, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, errKVClosed
	}
	s.pending = append(s.pending, c)
	lead := !s.running
	s.running = true
	s.mu.Unlock()
	if lead {
		s.commitLoop()
	}
	err := <-c.err
	return c.seq, err
}

// commitLoop runs in the goroutine of the caller that found no round in
// progress; it commits rounds until no calls are pending.
func (s *walKV) commitLoop() {
	for {
		s.mu.Lock()
		n := min(len(s.pending), s.maxBatch)
		if n == 0 {
			s.running = false
			s.idle.Broadcast()
			s.mu.Unlock()
			return
		}
		batch := s.pending[:n:n]
		s.pending = append([]*boltCall(nil), s.pending[n:]...)
		failed := s.failed
		s.mu.Unlock()
		if failed != nil {
			for _, c := range batch {
				c.err <- failed
			}
			continue
		}
		s.commitRound(batch)
		s.maybeCheckpoint()
	}
}

// commitRound runs the calls of one round against the current snapshot,
// each seeing the writes of those before it, appends the round's writes to
// the log as one record with one fdatasync, publishes them, and answers
// the callers.
func (s *walKV) commitRound(batch []*boltCall) {
	results := make([]error, len(batch))
	sn, err := s.snapshot()
	if err != nil {
		for _, c := range batch {
			c.err <- err
		}
		return
	}
	buf := newOvTree()
	for i, c := range batch {
		// A call that fails leaves no writes: the buffer reverts to
		// its state before the call (a copy-on-write clone is cheap).
		// This gives each caller what running it alone after the
		// successful calls before it would, which is what bbolt's
		// group commit achieves by replaying.
		saved := buf.Clone()
		results[i] = c.fn(&walTxn{snap: sn, buf: buf})
		if results[i] != nil {
			buf = saved
		}
	}
	// End the read transaction before waiting for anything (see walKV).
	sn.tx.Rollback()
	var seq uint64
	if buf.Len() > 0 {
		if err := s.commitWrites(buf); err != nil {
			s.fail(err)
			for _, c := range batch {
				c.err <- err
			}
			return
		}
		seq = s.seq
		if s.wal.records == 1 {
			// A file's first record is synced before any other is
			// written, so that recovery always knows which record a
			// torn tail begins with (parseWALFile).
			if err := s.syncTo(seq); err != nil {
				for _, c := range batch {
					c.err <- err
				}
				return
			}
		} else {
			s.armFlush()
		}
	}
	// Callers that want their change durable sync themselves (syncTo),
	// so that the next round is written while the log is synced.
	for i, c := range batch {
		if results[i] == nil {
			c.seq = seq
		}
		c.err <- results[i]
	}
}

// commitWrites writes buf to the log and then makes it visible; the
// record is not synced yet (syncTo).
func (s *walKV) commitWrites(buf *ovTree) error {
	ops := make([]walOp, 0, buf.Len())
	buf.Ascend(func(e *ovEntry) bool {
		ops = append(ops, walOp{key: e.key, val: e.val, del: e.del})
		return true
	})
	off := s.wal.off
	if err := s.wal.append(s.seq+1, s.durable.Load(), ops); err != nil {
		return err
	}
	s.appendBytes.Add(uint64(s.wal.off - off))
	s.seq++
	s.appends.Add(1)
	s.written.Store(s.seq)
	buf.Ascend(func(e *ovEntry) bool {
		s.recentM.ReplaceOrInsert(e)
		return true
	})
	if s.recentM.Len() >= recentFold {
		s.foldRecent()
		return nil
	}
	pub := s.recentM.Clone()
	s.stateMu.Lock()
	s.recent = pub
	s.stateMu.Unlock()
	return nil
}

// foldRecent moves the recent layer into active and publishes both. The
// commit loop's (or Close's, once the loop has stopped).
func (s *walKV) foldRecent() {
	if s.recentM.Len() == 0 {
		return
	}
	s.recentM.Ascend(func(e *ovEntry) bool {
		s.master.ReplaceOrInsert(e)
		return true
	})
	pub := s.master.Clone()
	s.recentM = newOvTree()
	s.stateMu.Lock()
	s.active, s.recent = pub, nil
	s.stateMu.Unlock()
}

// fail stops all further updates after an error that leaves the log or
// the overlay in doubt (a failed write or fdatasync of the log may or may
// not have reached the disk). Reads go on; the next open recovers.
func (s *walKV) fail(err error) {
	s.mu.Lock()
	if s.failed == nil {
		s.failed = fmt.Errorf("%w: %w", ErrStoreFailed, err)
		s.log.Error("meta: write-ahead log failed; updates refused until restart", "err", err)
	}
	s.mu.Unlock()
}

// maybeCheckpoint starts a checkpoint when the log has grown past its
// limit and no checkpoint is running. The log switches to a new file here,
// between rounds; bbolt is written in the background.
func (s *walKV) maybeCheckpoint() {
	if s.prewrite && s.spare == nil && (s.wal.off >= s.ckptBytes/2 || s.cold && s.wal.off >= coldSpareAt) {
		s.spare = prepareSpare(s.path, s.prealloc)
	}
	if s.wal.off < s.ckptBytes && !(s.cold && s.spare.ready()) {
		return
	}
	if s.ckptDone != nil {
		select {
		case <-s.ckptDone:
			s.ckptDone = nil
		default:
			return // the log grows past its limit until that one ends
		}
	}
	s.mu.Lock()
	failed := s.failed
	s.mu.Unlock()
	if failed != nil {
		return
	}
	// Records of the new file must never be durable while some of the
	// old file's are not: recovery would find a gap in the sequence.
	if err := s.syncTo(s.seq); err != nil {
		return // failed already
	}
	old := s.wal
	nw, err := s.nextWALFile(old.gen + 1)
	if err != nil {
		s.fail(err)
		return
	}
	s.wal = nw
	s.syncMu.Lock()
	s.waitNoSync()
	s.syncFile = nw
	s.syncMu.Unlock()
	if err := s.step("created"); err != nil {
		old.f.Close()
		s.fail(err)
		return
	}
	s.foldRecent() // the frozen layer holds every record of the old file
	frozen := s.active
	s.master = newOvTree()
	pub := s.master.Clone()
	s.stateMu.Lock()
	s.frozen, s.active = frozen, pub
	s.stateMu.Unlock()
	done := make(chan struct{})
	s.ckptDone = done
	go func() {
		defer close(done)
		if err := s.checkpoint(frozen, old); err != nil {
			s.fail(err)
		}
	}()
}

func (s *walKV) step(name string) error {
	if s.hook == nil {
		return nil
	}
	return s.hook(name)
}

// checkpoint applies the frozen layer to bbolt in one synced transaction,
// then removes the log file that held it, then drops the layer. A crash
// before the bbolt commit replays the old file and the new one; after it,
// replaying the old file again rewrites identical values.
func (s *walKV) checkpoint(frozen *ovTree, old *walFile) error {
	if err := s.applyToBolt(frozen); err != nil {
		return err
	}
	if err := s.step("applied"); err != nil {
		return err
	}
	if err := old.f.Close(); err != nil {
		return fmt.Errorf("meta: close WAL: %w", err)
	}
	if err := removeWALFiles(s.path, []uint64{old.gen}, s.sync); err != nil {
		return err
	}
	if err := s.step("removed"); err != nil {
		return err
	}
	s.stateMu.Lock()
	s.frozen = nil
	s.stateMu.Unlock()
	return nil
}

func (s *walKV) applyToBolt(t *ovTree) error {
	if t == nil || t.Len() == 0 {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketName)
		var err error
		t.Ascend(func(e *ovEntry) bool {
			err = applyOp(b, walOp{key: e.key, val: e.val, del: e.del})
			return err == nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("meta: checkpoint %s: %w", s.path, err)
	}
	return nil
}

// Close waits for the round and checkpoint in progress, checkpoints what
// the overlay holds and removes the log.
func (s *walKV) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errKVClosed
	}
	s.closed = true
	for s.running {
		s.idle.Wait()
	}
	s.mu.Unlock()
	// Callers whose records are written but not yet synced get their
	// sync rather than an error (the checkpoint below would make their
	// changes durable anyway).
	s.Sync()
	s.stopSyncs()
	if s.ckptDone != nil {
		<-s.ckptDone
	}
	s.releaseSpare()
	s.mu.Lock()
	failed := s.failed
	s.mu.Unlock()
	var errs []error
	if failed == nil {
		s.foldRecent()
		if err := s.applyToBolt(s.active); err != nil {
			errs = append(errs, err)
		} else if err := s.wal.f.Close(); err != nil {
			errs = append(errs, err)
		} else if gens, err := listWALFiles(s.path); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, removeWALFiles(s.path, gens, s.sync))
		}
	} else {
		// The log stays for the next open to recover.
		s.wal.f.Close()
		errs = append(errs, failed)
	}
	errs = append(errs, s.db.Close())
	return errors.Join(errs...)
}

// walTxn is a transaction over a snapshot; Update transactions (buf set)
// buffer their writes in buf, the round's own layer.
type walTxn struct {
	snap  *walSnap
	buf   *ovTree
	probe ovEntry // the key Get looks for, kept here so it does not escape
}

func (t *walTxn) Get(key []byte) ([]byte, error) {
	t.probe.key = key // read only during this call
	if t.buf != nil {
		if e, ok := t.buf.Get(&t.probe); ok {
			return liveVal(e), nil
		}
	}
	for _, l := range t.snap.layers {
		if e, ok := l.Get(&t.probe); ok {
			return liveVal(e), nil
		}
	}
	return t.snap.b.Get(key), nil
}

func liveVal(e *ovEntry) []byte {
	if e.del {
		return nil
	}
	if e.val == nil {
		return []byte{} // present and empty, as bbolt returns it
	}
	return e.val
}

func (t *walTxn) Put(key, val []byte) error {
	if t.buf == nil {
		return bolt.ErrTxNotWritable
	}
	if len(key) == 0 {
		return bolt.ErrKeyRequired
	}
	t.buf.ReplaceOrInsert(&ovEntry{key: bytes.Clone(key), val: append([]byte{}, val...)})
	return nil
}

func (t *walTxn) Delete(key []byte) error {
	if t.buf == nil {
		return bolt.ErrTxNotWritable
	}
	t.buf.ReplaceOrInsert(&ovEntry{key: bytes.Clone(key), del: true})
	return nil
}

// Scan merges the overlay layers and a bbolt cursor in key order; the
// newest layer holding a key decides it, and a tombstone hides it.
func (t *walTxn) Scan(prefix, start []byte, fn func(k, v []byte) bool) error {
	seek := prefix
	if bytes.Compare(start, prefix) > 0 {
		seek = start
	}
	var its []*ovIter
	if t.buf != nil {
		its = append(its, newOvIter(t.buf, prefix, seek))
	}
	for _, l := range t.snap.layers {
		its = append(its, newOvIter(l, prefix, seek))
	}
	c := t.snap.b.Cursor()
	bk, bv := c.Seek(seek)
	if !bytes.HasPrefix(bk, prefix) {
		bk = nil
	}
	for {
		var k []byte
		for _, it := range its {
			if e, ok := it.cur(); ok && (k == nil || bytes.Compare(e.key, k) < 0) {
				k = e.key
			}
		}
		if bk != nil && (k == nil || bytes.Compare(bk, k) < 0) {
			k = bk
		}
		if k == nil {
			return nil
		}
		var val []byte
		found, del := false, false
		for _, it := range its {
			if e, ok := it.cur(); ok && bytes.Equal(e.key, k) {
				if !found {
					found, del, val = true, e.del, liveVal(e)
				}
				it.next()
			}
		}
		if bk != nil && bytes.Equal(bk, k) {
			if !found {
				val = bv
			}
			bk, bv = c.Next()
			if !bytes.HasPrefix(bk, prefix) {
				bk = nil
			}
		}
		if del {
			continue
		}
		if !fn(k, val) {
			return nil
		}
	}
}

// ovIter walks the keys of an overlay layer that have a prefix, from a
// key on, loading a chunk at a time so that a scan that stops early costs
// little however large the layer is.
type ovIter struct {
	t      *ovTree
	prefix []byte
	items  []*ovEntry
	i      int
	more   bool
}

const ovChunk = 64

func newOvIter(t *ovTree, prefix, from []byte) *ovIter {
	it := &ovIter{t: t, prefix: prefix}
	it.load(from, false)
	return it
}

func (it *ovIter) load(from []byte, after bool) {
	it.items, it.i, it.more = it.items[:0], 0, false
	it.t.AscendGreaterOrEqual(&ovEntry{key: from}, func(e *ovEntry) bool {
		if after && bytes.Equal(e.key, from) {
			return true
		}
		if !bytes.HasPrefix(e.key, it.prefix) {
			return false
		}
		it.items = append(it.items, e)
		if len(it.items) == ovChunk {
			it.more = true
			return false
		}
		return true
	})
}

func (it *ovIter) cur() (*ovEntry, bool) {
	if it.i < len(it.items) {
		return it.items[it.i], true
	}
	return nil, false
}

func (it *ovIter) next() {
	it.i++
	if it.i == len(it.items) && it.more {
		it.load(it.items[len(it.items)-1].key, true)
	}
}
