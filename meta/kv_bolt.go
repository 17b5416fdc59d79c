package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// BoltOptions tunes the bbolt engine.
type BoltOptions struct {
	// GroupCommit coalesces concurrent mutations into one bbolt
	// transaction and one fsync. A mutation never waits for a timer: the
	// first caller commits at once and callers arriving meanwhile share
	// the next commit, so serial latency is unchanged.
	GroupCommit bool
	// MaxBatch bounds the mutations per group commit (default 128).
	MaxBatch int
	// OpenTimeout bounds waiting for the database file lock (default 5s).
	OpenTimeout time.Duration
	// NoSync disables fsync. Only for tests and benchmarks: metadata is
	// not durable when operations return.
	NoSync bool
	// WAL puts a write-ahead log in front of bbolt (see "Durability" in
	// the package doc): a commit is one append and one fdatasync of the
	// log instead of a bbolt commit, and bbolt is written in the
	// background in large checkpoints. Commits are grouped as with
	// GroupCommit (MaxBatch applies), whatever GroupCommit says.
	WAL bool
	// WALCheckpointBytes is the size of the log at which a checkpoint
	// starts (default 16 MiB). Log files are written full of zeros to a
	// little more than this before use (wal_spare.go), and one spare of
	// that size is kept beside them.
	WALCheckpointBytes int64
	// CommitInterval bounds how long a change made under a Deferred
	// context waits, at most, for the fdatasync that makes it durable
	// when nobody calls Sync (default DefaultCommitInterval). WAL only.
	CommitInterval time.Duration

	// fallocateLog (tests and benchmarks) gives log files their size
	// with fallocate instead of writing zeros: the way before spares.
	fallocateLog bool
}

var bucketName = []byte("shoal")

// boltKV implements kvStore on a single bbolt bucket.
type boltKV struct {
	db       *bolt.DB
	group    bool
	maxBatch int

	mu      sync.Mutex
	pending []*boltCall
	running bool
}

type boltCall struct {
	fn  func(kvTxn) error
	err chan error
	// seq (write-ahead log only) is set to the sequence number of the
	// record holding the call's writes (0 if none) before err is sent.
	seq uint64
}

var _ kvStore = (*boltKV)(nil)

func openBoltKV(path string, opts BoltOptions) (*boltKV, error) {
	db, err := openBoltDB(path, opts)
	if err != nil {
		return nil, err
	}
	if _, err := replayWAL(db, path, !opts.NoSync, slog.Default().With("db", path)); err != nil {
		db.Close()
		return nil, err
	}
	// A spare log file (wal_spare.go) is of no use without the log.
	if err := os.Remove(walSpareName(path)); err != nil && !errors.Is(err, os.ErrNotExist) {
		db.Close()
		return nil, fmt.Errorf("meta: remove spare log file: %w", err)
	}
	mb := opts.MaxBatch
	if mb <= 0 {
		mb = 128
	}
	return &boltKV{db: db, group: opts.GroupCommit, maxBatch: mb}, nil
}

// openBoltDB opens the database file and creates its bucket.
// boltInitialMmap is how much of the database bbolt maps at open (address
// space, not memory: the file grows as it is written). bbolt otherwise
// maps the file's size rounded up to a power of two and remaps whenever a
// commit outgrows it, and a remap in a write transaction first copies
// every node that transaction touched out of the old mapping
// (node.dereference) and waits for every read transaction to end. A
// store that grows from empty to a few hundred MiB remapped at each
// doubling: in issue 27's remove benchmark (`shoal bench --workloads
// small --streams 4`, 40,000 files) the checkpoints' remaps were about 6%
// of the MDS's CPU (docs/benchmarks.md, "Removes, fourth pass"). Only on
// 64-bit platforms, whose address space this hardly dents.
const boltInitialMmap = (256 << 20) * (strconv.IntSize / 64)

func openBoltDB(path string, opts BoltOptions) (*bolt.DB, error) {
	to := opts.OpenTimeout
	if to == 0 {
		to = 5 * time.Second
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: to, NoSync: opts.NoSync, NoFreelistSync: true, FreelistType: bolt.FreelistMapType,
		InitialMmapSize: boltInitialMmap})
	if err != nil {
		return nil, fmt.Errorf("meta: open bolt %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketName)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("meta: init bolt %s: %w", path, err)
	}
	return db, nil
}

func (s *boltKV) View(fn func(kvTxn) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		return fn(&boltTxn{b: tx.Bucket(bucketName)})
	})
}

func (s *boltKV) Update(fn func(kvTxn) error) error {
	if !s.group {
		return s.solo(fn)
	}
	c := &boltCall{fn: fn, err: make(chan error, 1)}
	s.mu.Lock()
	s.pending = append(s.pending, c)
	lead := !s.running
	s.running = true
	s.mu.Unlock()
	if lead {
		s.commitLoop()
	}
	return <-c.err
}

func (s *boltKV) solo(fn func(kvTxn) error) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return fn(&boltTxn{b: tx.Bucket(bucketName)})
	})
}

// commitLoop runs in the goroutine of the caller that found no commit in
// progress; it commits batches until no calls are pending.
func (s *boltKV) commitLoop() {
	for {
		s.mu.Lock()
		n := min(len(s.pending), s.maxBatch)
		if n == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		batch := s.pending[:n:n]
		s.pending = append([]*boltCall(nil), s.pending[n:]...)
		s.mu.Unlock()
		s.commitBatch(batch)
	}
}

// errReplay aborts a group transaction after a call failed part-way
// through its writes; every call is then replayed in its own transaction.
var errReplay = errors.New("meta: replay batch")

func (s *boltKV) commitBatch(batch []*boltCall) {
	results := make([]error, len(batch))
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketName)
		for i, c := range batch {
			t := &boltTxn{b: b}
			results[i] = c.fn(t)
			if results[i] != nil && t.writes > 0 {
				return errReplay
			}
		}
		return nil
	})
	if err == nil {
		for i, c := range batch {
			c.err <- results[i]
		}
		return
	}
	if !errors.Is(err, errReplay) && len(batch) == 1 {
		batch[0].err <- err
		return
	}
	for _, c := range batch {
		c.err <- s.solo(c.fn)
	}
}

func (s *boltKV) Close() error { return s.db.Close() }

type boltTxn struct {
	b      *bolt.Bucket
	writes int
}

func (t *boltTxn) Get(key []byte) ([]byte, error) { return t.b.Get(key), nil }

func (t *boltTxn) Put(key, val []byte) error {
	t.writes++
	return t.b.Put(key, val)
}

func (t *boltTxn) Delete(key []byte) error {
	t.writes++
	return t.b.Delete(key)
}

func (t *boltTxn) Scan(prefix, start []byte, fn func(k, v []byte) bool) error {
	c := t.b.Cursor()
	seek := prefix
	if bytes.Compare(start, prefix) > 0 {
		seek = start
	}
	for k, v := c.Seek(seek); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if !fn(k, v) {
			break
		}
	}
	return nil
}

// OpenBolt opens (creating if needed) a bbolt metadata database at path and
// initialises the root directory.
func OpenBolt(path string, opts BoltOptions) (Engine, error) {
	var kv kvStore
	var err error
	if opts.WAL {
		kv, err = openWALKV(path, opts, nil)
	} else {
		kv, err = openBoltKV(path, opts)
	}
	if err != nil {
		return nil, err
	}
	e := newKVEngine(kv)
	// Only this process writes the database (bbolt locks the file).
	e.cache = newReadCache(nil)
	if err := e.Init(context.Background()); err != nil {
		kv.Close()
		return nil, err
	}
	if w, ok := kv.(*walKV); ok {
		if gap := w.inoGap(); gap > 0 {
			if err := e.skipInodes(context.Background(), gap); err != nil {
				kv.Close()
				return nil, err
			}
		}
	}
	return e, nil
}
