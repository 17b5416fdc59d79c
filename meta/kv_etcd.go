package meta

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdOptions configures the etcd engine.
type EtcdOptions struct {
	// Endpoints of the etcd cluster ("host:port" or URLs). Ignored when
	// Client is set.
	Endpoints []string
	// Prefix under which all of this Shoal cluster's keys live, so several
	// Shoal clusters can share one etcd (default "/shoal"). A "/" is
	// appended if missing, so "/a" and "/ab" do not overlap.
	Prefix string
	// DialTimeout bounds connecting and the first request (default 5s).
	DialTimeout time.Duration
	// RequestTimeout bounds each etcd request (default 5s).
	RequestTimeout time.Duration
	// TLS, Username and Password authenticate to etcd (optional).
	TLS                *tls.Config
	Username, Password string
	// Client, if set, is used instead of dialing; the engine does not
	// close it.
	Client *clientv3.Client
	// MaxTxnOps is the etcd server's --max-txn-ops (default 128) and
	// MaxTxnBytes its --max-request-bytes (default 1.5 MiB). A
	// transaction that would exceed them fails with ErrTxnTooLarge
	// instead of being split, which would break its atomicity.
	MaxTxnOps   int
	MaxTxnBytes int
	// NoGroupCommit commits every Update in an etcd Txn of its own, one
	// after the other, instead of sharing one Txn between concurrent
	// Updates (see kv_etcd_group.go). For comparison in benchmarks.
	NoGroupCommit bool
	// MaxBatch bounds the Updates per group commit (default 128); etcd's
	// limits (MaxTxnOps, MaxTxnBytes) bound it too.
	MaxBatch int
	// MaxRetries bounds how often one transaction is rerun after a
	// conflict or a transient etcd error (default 20).
	MaxRetries int
	// ScanPage is the number of keys fetched per request by a scan
	// (default 512).
	ScanPage int
	// NoReadCache turns the read cache off even when Fence.Valid would
	// allow it: every GetAttr and Lookup asks etcd. For comparison in
	// benchmarks and tests.
	NoReadCache bool
	// Fence, if set, makes every commit conditional on a key still having
	// the create revision it had when the engine was opened: a metadata
	// server's election key and term (internal/leader). Once a commit is
	// refused for it, that commit and every later one fail with
	// ErrFenced, so a leader that was paused past its lease and woke up
	// cannot change anything the next leader owns.
	Fence *EtcdFence
}

// EtcdFence is the condition of EtcdOptions.Fence.
type EtcdFence struct {
	Key            string
	CreateRevision int64
	// OnFenced, if set, is called (from the committing goroutine) for
	// every commit the fence refused.
	OnFenced func()
	// Valid, if set, is asked before every attempt of a transaction: an
	// error (the leader's lease ran out locally) fails it with ErrFenced
	// without asking etcd, so a leader cut off from etcd stops retrying
	// as soon as it knows it may no longer lead.
	//
	// Valid is also the engine's proof of ownership for its read cache
	// (readCache, "The read cache" in the package doc): it must return
	// nil only while Key is known to still stand with CreateRevision in
	// etcd, so that nobody else can commit under the prefix. A leader's
	// term does that (internal/leader: the lease is alive until the send
	// time of its last answered keepalive plus the TTL, less a margin,
	// measured on a clock that does not go back). Without Valid there is
	// no read cache.
	Valid func() error
}

// ErrTxnTooLarge is returned when one metadata transaction would exceed
// etcd's per-transaction limits.
var ErrTxnTooLarge = errors.New("meta: transaction exceeds etcd limits")

// errConflict reports that a concurrent transaction committed first.
var errConflict = errors.New("meta: etcd transaction conflict")

// etcdKV implements kvStore on etcd v3.
//
// Keys live under prefix+"d/"; prefix+"gen" is the store's generation
// key, rewritten with a fresh nonce by every committing Update. An Update
// reads gen (which fixes its snapshot revision R and gen's mod revision
// M), runs fn against the snapshot at R with writes buffered, and commits
// with one etcd Txn: If(mod_revision(gen) == M) Then(writes, put gen).
// The condition holds only if no other Update committed since R, so the
// snapshot fn saw is exactly the state the writes apply to: every
// committed Update is equivalent to running alone at its commit revision.
// A per-key or range compare would miss keys deleted after R (a deleted
// key has no mod revision left to compare); the generation key does not.
// The price is that any two concurrent Updates conflict, which costs
// nothing here: Shoal runs one active metadata server, and this process
// serialises its own Updates (group commit, or mu with NoGroupCommit), so
// conflicts only arise between processes.
type etcdKV struct {
	cli       *clientv3.Client
	own       bool
	data, gen string
	opts      EtcdOptions
	mu        sync.Mutex
	closed    atomic.Bool
	// commitTimeout bounds the commit Txn (RequestTimeout; tests shorten
	// it to lose replies). resolved counts commits whose outcome had to be
	// resolved.
	commitTimeout time.Duration
	resolved      atomic.Int64
	// fenced is set once the fence (opts.Fence) failed; it never holds
	// again, since a create revision cannot come back.
	fenced atomic.Bool
	// doubt is set while a commit's outcome is unknown (its reply was
	// lost and resolve gave up, or etcd refused the request in a way
	// that does not prove it was not applied): that commit could still
	// land, under the reads the cache would keep. The next commit that
	// succeeds clears it, since it moved the generation key the doubtful
	// one is conditional on (so it landed before, or never will).
	doubt atomic.Bool

	// Group commit (kv_etcd_group.go): calls waiting for a round, and
	// whether a caller is committing rounds. rounds, roundCalls and
	// fallbacks count what it did.
	gmu                           sync.Mutex
	pending                       []*etcdCall
	running                       bool
	rounds, roundCalls, fallbacks atomic.Int64

	// seen is the highest revision this engine committed or read; no
	// read is answered from an older one (see etcdTxn.get).
	seen atomic.Int64
	// snapRev and snapGen, if snapRev is not 0, are a snapshot revision
	// the next round may start from without reading gen, and gen's mod
	// revision in it: the engine's own last commit (tryBatch). Only the
	// committer (running, or mu with NoGroupCommit) uses them.
	snapRev, snapGen int64
	// known holds values of the store as they are while gen's mod
	// revision is knownGen (kv_etcd_known.go); committer only.
	known    *snapReads
	knownGen int64

	// pinner sends requests to the leader (kv_etcd_pin.go); nil with a
	// single endpoint.
	pinner *etcdPinner
	// hints say which inode an entry led to when last read or written
	// (kv_etcd_hint.go).
	hints etcdHints
}

// leaseHeld reports whether the engine may serve reads from its cache
// (readCache.held): it is fenced on a leadership whose lease is known to
// be alive (EtcdFence.Valid), the fence has not refused a commit, no
// commit's outcome is in doubt, and the engine is open. While that
// holds, only this engine's updates change the keys under the prefix.
func (s *etcdKV) leaseHeld() bool {
	f := s.opts.Fence
	return f != nil && f.Valid != nil && !s.closed.Load() && !s.fenced.Load() && !s.doubt.Load() && f.Valid() == nil
}

// saw records that the engine committed or read revision rev.
func (s *etcdKV) saw(rev int64) {
	for {
		cur := s.seen.Load()
		if rev <= cur || s.seen.CompareAndSwap(cur, rev) {
			return
		}
	}
}

var _ kvStore = (*etcdKV)(nil)

func (o *EtcdOptions) fillDefaults() {
	if o.Prefix == "" {
		o.Prefix = "/shoal"
	}
	if !strings.HasSuffix(o.Prefix, "/") {
		o.Prefix += "/"
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 5 * time.Second
	}
	if o.MaxTxnOps <= 0 {
		o.MaxTxnOps = 128
	}
	if o.MaxTxnBytes <= 0 {
		o.MaxTxnBytes = 3 << 19 // 1.5 MiB
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	if o.MaxRetries <= 0 {
		o.MaxRetries = 20
	}
	if o.ScanPage <= 0 {
		o.ScanPage = 512
	}
}

func openEtcdKV(ctx context.Context, opts EtcdOptions) (*etcdKV, error) {
	opts.fillDefaults()
	s := &etcdKV{cli: opts.Client, data: opts.Prefix + "d/", gen: opts.Prefix + "gen", opts: opts, commitTimeout: opts.RequestTimeout}
	if s.cli == nil {
		cli, err := DialEtcd(ctx, opts)
		if err != nil {
			return nil, err
		}
		s.cli, s.own = cli, true
	}
	// The client dials lazily: one request tells an unreachable cluster
	// apart now rather than on the first metadata operation.
	pctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	resp, err := s.cli.Get(pctx, s.gen)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("meta: etcd %v: %w", opts.Endpoints, err)
	}
	// A linearisable read: every change committed before the engine
	// opened (a previous metadata server's) is visible to its reads.
	s.saw(resp.Header.Revision)
	s.startPin(pctx)
	return s, nil
}

// DialEtcd makes an etcd client as the engine makes its own (endpoints,
// timeouts, credentials of opts), for callers that share one client
// between the engine (EtcdOptions.Client) and other uses of the same etcd
// cluster, such as the metadata servers' election.
func DialEtcd(ctx context.Context, opts EtcdOptions) (*clientv3.Client, error) {
	opts.fillDefaults()
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("meta: etcd: no endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   opts.Endpoints,
		DialTimeout: opts.DialTimeout,
		TLS:         opts.TLS,
		Username:    opts.Username,
		Password:    opts.Password,
		Context:     context.WithoutCancel(ctx),
		// Errors reach the caller; the client's own logging of
		// reconnects would only be noise in Shoal's log.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("meta: etcd %v: %w", opts.Endpoints, err)
	}
	return cli, nil
}

// NormalizedPrefix is the prefix the engine keeps its keys under for
// opts (the default, with a trailing "/").
func (o EtcdOptions) NormalizedPrefix() string {
	o.fillDefaults()
	return o.Prefix
}

func (s *etcdKV) Close() error {
	if s.closed.Swap(true) {
		return errKVClosed
	}
	s.stopPin()
	if s.own {
		if err := s.cli.Close(); err != nil {
			return fmt.Errorf("meta: etcd close: %w", err)
		}
	}
	return nil
}

// retry runs attempt until it succeeds, fails for good or runs out of
// tries. Conflicts and transient etcd errors are retried with jittered
// exponential backoff.
func (s *etcdKV) retry(what string, attempt func() error) error {
	backoff := 2 * time.Millisecond
	for i := 0; ; i++ {
		if s.closed.Load() {
			return errKVClosed
		}
		if f := s.opts.Fence; f != nil && f.Valid != nil {
			if f.Valid() != nil {
				return s.refused()
			}
		}
		err := attempt()
		if err == nil || !retryable(err) {
			return err
		}
		if i+1 >= s.opts.MaxRetries {
			return fmt.Errorf("%w: etcd %s: gave up after %d attempts: %w", ErrUnavailable, what, i+1, err)
		}
		time.Sleep(backoff/2 + rand.N(backoff))
		backoff = min(2*backoff, time.Second)
	}
}

// storeError marks an error from etcd itself (as opposed to one fn
// returned because of what it read).
type storeError struct{ err error }

func (e *storeError) Error() string { return "meta: etcd: " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

func retryable(err error) bool {
	if errors.Is(err, errConflict) {
		return true
	}
	var se *storeError
	if !errors.As(err, &se) {
		return false
	}
	// Requests etcd rejected as malformed or too big fail the same way
	// every time; everything else (no leader, timeouts, a compacted
	// snapshot revision, connection loss) may pass on a later try.
	switch rpctypes.ErrorDesc(se.err) {
	case rpctypes.ErrorDesc(rpctypes.ErrGRPCTooManyOps), rpctypes.ErrorDesc(rpctypes.ErrGRPCRequestTooLarge),
		rpctypes.ErrorDesc(rpctypes.ErrGRPCDuplicateKey), rpctypes.ErrorDesc(rpctypes.ErrGRPCEmptyKey),
		rpctypes.ErrorDesc(rpctypes.ErrGRPCPermissionDenied), rpctypes.ErrorDesc(rpctypes.ErrGRPCInvalidAuthToken),
		rpctypes.ErrorDesc(rpctypes.ErrGRPCAuthFailed):
		return false
	}
	return !errors.Is(se.err, context.Canceled)
}

func (s *etcdKV) View(fn func(kvTxn) error) error {
	if s.closed.Load() {
		return errKVClosed
	}
	return s.retry("view", func() error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		t := &etcdTxn{s: s, ctx: ctx}
		err := fn(t)
		if t.err != nil {
			return t.err
		}
		return err
	})
}

func (s *etcdKV) Update(fn func(kvTxn) error) error {
	if s.closed.Load() {
		return errKVClosed
	}
	if s.opts.NoGroupCommit {
		s.mu.Lock()
		defer s.mu.Unlock()
		c := &etcdCall{fn: fn}
		return s.retry("update", func() error {
			_, err := s.tryBatch([]*etcdCall{c})
			if err == nil {
				err = c.res
			}
			return err
		})
	}
	return s.group(fn)
}

// conds are a commit's conditions: no other commit since genRev, and the
// fence, if any.
func (s *etcdKV) conds(genRev int64) []clientv3.Cmp {
	c := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.gen), "=", genRev)}
	if f := s.opts.Fence; f != nil {
		c = append(c, clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.CreateRevision))
	}
	return c
}

// fenceRead is a failed commit's Else branch: it reads the fence key, so
// that one round trip tells a lost fence from a conflict.
func (s *etcdKV) fenceRead() []clientv3.Op {
	if s.opts.Fence == nil {
		return nil
	}
	return []clientv3.Op{clientv3.OpGet(s.opts.Fence.Key)}
}

// fenceBroken reports whether a failed commit failed for the fence.
func (s *etcdKV) fenceBroken(tr *clientv3.TxnResponse) bool {
	f := s.opts.Fence
	if f == nil || len(tr.Responses) == 0 {
		return false
	}
	kvs := tr.Responses[0].GetResponseRange().GetKvs()
	return len(kvs) == 0 || kvs[0].CreateRevision != f.CreateRevision
}

// refused records a commit the fence refused.
func (s *etcdKV) refused() error {
	s.fenced.Store(true)
	if f := s.opts.Fence; f != nil && f.OnFenced != nil {
		f.OnFenced()
	}
	return ErrFenced
}

// commitOps turns buffered writes into etcd operations in key order,
// checking etcd's per-transaction limits (the generation put included).
func (s *etcdKV) commitOps(writes map[string]etcdWrite) ([]clientv3.Op, error) {
	if len(writes)+1 > s.opts.MaxTxnOps {
		return nil, fmt.Errorf("%w: %d writes and the generation key, etcd allows %d operations", ErrTxnTooLarge, len(writes), s.opts.MaxTxnOps)
	}
	keys := make([]string, 0, len(writes))
	size := etcdTxnOverhead + len(s.gen) + nonceLen
	for k, w := range writes {
		keys = append(keys, k)
		size += etcdOpOverhead + len(k) + len(w.val)
	}
	if size > s.opts.MaxTxnBytes {
		return nil, fmt.Errorf("%w: about %d bytes, etcd allows %d", ErrTxnTooLarge, size, s.opts.MaxTxnBytes)
	}
	slices.Sort(keys)
	ops := make([]clientv3.Op, 0, len(keys)+1)
	for _, k := range keys {
		if w := writes[k]; w.del {
			ops = append(ops, clientv3.OpDelete(s.data+k))
		} else {
			ops = append(ops, clientv3.OpPut(s.data+k, string(w.val)))
		}
	}
	return ops, nil
}

// resolve decides whether a commit whose reply was lost (timeout, leader
// change, connection reset) took effect. Retrying blindly could apply fn
// twice (a create would then report "exists"), and concluding "not
// committed" from a read is unsafe while the request may still be applied
// later. So resolve first fences: a Txn that moves gen past genRev if it
// is still there. After that, gen's first change after genRev is final:
// if it carries our nonce the commit happened, otherwise it never will
// (its condition can no longer hold).
func (s *etcdKV) resolve(ctx context.Context, genRev int64, nonce []byte, cause error) error {
	s.resolved.Add(1)
	var last error = cause
	for i := 0; i < s.opts.MaxRetries; i++ {
		if i > 0 {
			time.Sleep(time.Duration(min(i*50, 1000)) * time.Millisecond)
		}
		if s.closed.Load() {
			break
		}
		rctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
		tr, err := s.cli.Txn(rctx).
			If(s.conds(genRev)...).
			Then(clientv3.OpPut(s.gen, string(newNonce()))).
			Else(clientv3.OpGet(s.gen)).
			Commit()
		cancel()
		if err != nil {
			last = err
			continue // the fence's own outcome is unknown: fence again
		}
		if !tr.Succeeded && s.opts.Fence != nil {
			// Either gen moved (then its first change after genRev is
			// final, as below) or the leadership fence broke with gen
			// still at genRev: then our commit, conditional on the same
			// fence, has not happened and never will.
			if kvs := tr.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 && kvs[0].ModRevision == genRev {
				return s.refused()
			}
		}
		first, rev, err := s.firstGenAfter(ctx, genRev)
		if err != nil {
			last = err
			continue
		}
		if bytes.Equal(first, nonce) {
			s.saw(rev)
			return nil
		}
		return errConflict // not committed and never will be: run fn again
	}
	return fmt.Errorf("%w: etcd commit outcome unknown: %w", ErrUnavailable, last)
}

// firstGenAfter returns the value gen was first given after revision rev,
// and the revision of that change.
func (s *etcdKV) firstGenAfter(ctx context.Context, rev int64) ([]byte, int64, error) {
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), s.opts.RequestTimeout)
	defer cancel()
	for wr := range s.cli.Watch(wctx, s.gen, clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			return nil, 0, err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				return ev.Kv.Value, ev.Kv.ModRevision, nil
			}
		}
	}
	if err := wctx.Err(); err != nil {
		return nil, 0, err
	}
	return nil, 0, errors.New("meta: etcd watch closed")
}

const nonceLen = 16

func newNonce() []byte {
	b := make([]byte, nonceLen)
	_, _ = crand.Read(b)
	return b
}

type etcdWrite struct {
	val []byte
	del bool
}

// etcdTxn reads one etcd revision and, in an Update, buffers writes.
type etcdTxn struct {
	s   *etcdKV
	ctx context.Context
	// rev is the snapshot revision; in a View it is fixed by the first
	// read.
	rev    int64
	writes map[string]etcdWrite // nil in a View
	// base holds the writes of the calls before this one in its group
	// commit (nil outside one): they are read as if committed, and
	// writes shadow them.
	base map[string]etcdWrite
	// read holds what reads of the snapshot returned: the snapshot never
	// changes, so a key is read from etcd once per attempt (Prefetch
	// fills it ahead of the Gets), or once per round for all the calls
	// of a group commit, which share it.
	read *snapReads
	// gather, if set, makes the first read that would go to etcd record
	// its keys there and fail the run instead (readAhead).
	gather *[][]byte
	// assumed, if not nil, lets the transaction take directory entries
	// it has not read as absent, recording them here, for the commit to
	// check (kv_etcd_known.go).
	assumed map[string]bool
	err     error // first etcd error; fails the attempt
}

// errGathered ends a run of a group's call at its first read, whose keys
// readAhead gathered.
var errGathered = errors.New("meta: etcd: first reads gathered")

// gathered records keys as a run's first read (gather) and fails the run.
func (t *etcdTxn) gathered(keys ...[]byte) error {
	*t.gather = append(*t.gather, keys...)
	t.err = errGathered
	return t.err
}

// buffered returns the transaction's pending write of key, its own or
// its group's.
func (t *etcdTxn) buffered(key string) (etcdWrite, bool) {
	if w, ok := t.writes[key]; ok {
		return w, true
	}
	w, ok := t.base[key]
	return w, ok
}

var _ kvTxn = (*etcdTxn)(nil)

// assume reports whether key, neither written nor read, is taken as
// absent: a directory entry, in a transaction that may assume, and not
// one the engine has seen lead somewhere (etcdHints: it existed when last
// seen, so an operation on it, a remove, had better read it).
func (t *etcdTxn) assume(key string) bool {
	if t.assumed == nil || !isDentryKey(key) {
		return false
	}
	if _, seen := t.s.hints.inode(key); seen {
		return false
	}
	t.assumed[key] = true
	return true
}

// get issues a range read at the snapshot revision. Reads after the first
// are serialisable (answered by whichever member the client talks to,
// without a round trip to the leader): a revision's contents never change,
// so a member that has applied rev answers exactly as the leader would,
// and one that has not says so (ErrFutureRev). Then the read is tried
// again (futureRetries times: the client sends each request to the next
// member, and at least the leader and the member that answered the commit
// have applied it) before it is asked linearisably, which costs etcd a
// quorum round (ReadIndex).
//
// The first read of a View, which fixes its revision, is serialisable
// too, and taken only if the member's revision is at least the engine's
// seen revision: every change this engine committed (an Update records
// its commit's revision before it returns) and every revision any of its
// reads saw. Otherwise it is asked again linearisably. So no read misses
// a change this engine made or goes back behind one it showed, without
// the quorum round trip (etcd's ReadIndex) of a linearisable read on a
// cluster of several members. Changes made by other processes are seen
// once the member answering has applied them; under the engine's
// assumption of one active metadata server per prefix, whose successor
// opens its engine with a linearisable read (openEtcdKV), there are none
// that matter.
func (t *etcdTxn) get(key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if t.err != nil {
		return nil, t.err
	}
	if t.gather != nil {
		return nil, t.gathered() // a scan: nothing worth reading ahead
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.s.opts.RequestTimeout)
	defer cancel()
	var resp *clientv3.GetResponse
	var err error
	if t.rev == 0 {
		resp, err = t.s.getVia(ctx, false, key, append(opts, clientv3.WithSerializable())...)
		if err != nil || resp.Header.Revision < t.s.seen.Load() {
			resp, err = t.s.getVia(ctx, false, key, opts...)
		}
		if err == nil {
			t.rev = resp.Header.Revision
			t.s.saw(t.rev)
		}
	} else {
		opts = append(opts, clientv3.WithRev(t.rev))
		resp, err = t.s.getVia(ctx, false, key, append(opts, clientv3.WithSerializable())...)
		for i := 0; i < futureRetries && errors.Is(err, rpctypes.ErrFutureRev); i++ {
			resp, err = t.s.getVia(ctx, true, key, append(opts, clientv3.WithSerializable())...)
		}
		if errors.Is(err, rpctypes.ErrFutureRev) {
			resp, err = t.s.getVia(ctx, false, key, opts...)
		}
	}
	if err != nil {
		t.err = &storeError{err}
		return nil, t.err
	}
	return resp, nil
}

func (t *etcdTxn) Get(key []byte) ([]byte, error) {
	if w, ok := t.buffered(string(key)); ok {
		if w.del {
			return nil, nil
		}
		return w.val, nil
	}
	if v, ok := t.read.get(string(key)); ok {
		return v, nil
	}
	if t.assume(string(key)) {
		return nil, nil
	}
	if t.gather != nil && t.err == nil {
		return nil, t.gathered(key)
	}
	resp, err := t.get(t.s.data + string(key))
	if err != nil {
		return nil, err
	}
	var v []byte
	if len(resp.Kvs) > 0 {
		v = nonNil(resp.Kvs[0].Value)
	}
	t.remember(string(key), v)
	return v, nil
}

// remember records that key has value v (nil: absent) in the snapshot.
func (t *etcdTxn) remember(key string, v []byte) {
	if t.read == nil {
		t.read = &snapReads{}
	}
	t.read.put(key, v)
	t.s.hints.learn(key, v)
}

// snapReads are values read from one snapshot revision (nil: absent),
// safe for concurrent use.
type snapReads struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (r *snapReads) get(key string) ([]byte, bool) {
	if r == nil {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[key]
	return v, ok
}

func (r *snapReads) put(key string, v []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string][]byte{}
	}
	r.m[key] = v
}

var _ kvPrefetcher = (*etcdTxn)(nil)

// Prefetch reads the keys not yet read or written in one GetMany, so that
// an operation's first reads cost one round trip together; with each
// directory entry among them, the inode it led to when last seen
// (etcdHints), which an operation that follows the entry reads next.
func (t *etcdTxn) Prefetch(keys [][]byte) error {
	all := keys
	for _, k := range keys {
		if ik, ok := t.s.hints.inode(string(k)); ok {
			if len(all) == len(keys) {
				all = append(make([][]byte, 0, 2*len(keys)), keys...)
			}
			all = append(all, ik)
		}
	}
	_, err := t.GetMany(all)
	return err
}

var _ kvBatchGetter = (*etcdTxn)(nil)

// Request size estimates, as in commitOps: a fixed cost per request and
// per operation on top of the keys.
const (
	etcdTxnOverhead = 64
	etcdOpOverhead  = 16
)

// GetMany answers keys the transaction wrote from its buffer, like Get, and
// reads the others with read-only etcd Txns of range requests: a range
// inside a Txn is evaluated at its own revision field, so every range reads
// the snapshot revision, and n Gets cost one round trip instead of n. A Txn
// holds at most MaxTxnOps operations and MaxTxnBytes of request, so a large
// batch takes several Txns, one after the other. All of them read the same
// revision, so together they still read one snapshot; the first one fixes
// the revision if nothing has been read yet in a View. Only requests are
// limited: callers batch small records (dentries, inodes), not values
// whose sum could make an unreasonably large reply.
func (t *etcdTxn) GetMany(keys [][]byte) ([][]byte, error) {
	if t.err != nil {
		return nil, t.err
	}
	vals := make([][]byte, len(keys))
	var fetch []int // indexes of the keys to read from etcd
	for i, k := range keys {
		if w, ok := t.buffered(string(k)); ok {
			if !w.del {
				vals[i] = w.val
			}
			continue
		}
		if v, ok := t.read.get(string(k)); ok {
			vals[i] = v
			continue
		}
		if t.assume(string(k)) {
			continue
		}
		fetch = append(fetch, i)
	}
	if t.gather != nil && len(fetch) > 0 {
		first := make([][]byte, len(fetch))
		for j, i := range fetch {
			first[j] = keys[i]
		}
		return nil, t.gathered(first...)
	}
	for len(fetch) > 0 {
		n, size := 0, etcdTxnOverhead
		for n < len(fetch) && n < t.s.opts.MaxTxnOps {
			sz := etcdOpOverhead + len(t.s.data) + len(keys[fetch[n]])
			if n > 0 && size+sz > t.s.opts.MaxTxnBytes {
				break
			}
			size += sz
			n++
		}
		if err := t.getBatch(keys, fetch[:n], vals); err != nil {
			return nil, err
		}
		fetch = fetch[n:]
	}
	return vals, nil
}

// getBatch reads keys[i] for every i in idx into vals[i] with one etcd Txn,
// at the snapshot revision and serialisably when there is one, as get does.
func (t *etcdTxn) getBatch(keys [][]byte, idx []int, vals [][]byte) error {
	ops := make([]clientv3.Op, len(idx))
	// txn reads the keys in one Txn, through the leader unless rr.
	txn := func(ctx context.Context, rr bool, opts ...clientv3.OpOption) (*clientv3.TxnResponse, error) {
		for j, i := range idx {
			ops[j] = clientv3.OpGet(t.s.data+string(keys[i]), opts...)
		}
		return t.s.txnVia(ctx, rr, func(tx clientv3.Txn) clientv3.Txn { return tx.Then(ops...) })
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.s.opts.RequestTimeout)
	defer cancel()
	var resp *clientv3.TxnResponse
	var err error
	if t.rev == 0 {
		// A read-only Txn reads one revision, the one in its header.
		resp, err = txn(ctx, false, clientv3.WithSerializable())
		if err != nil || resp.Header.Revision < t.s.seen.Load() {
			resp, err = txn(ctx, false)
		}
		if err == nil {
			t.rev = resp.Header.Revision
			t.s.saw(t.rev)
		}
	} else {
		resp, err = txn(ctx, false, clientv3.WithRev(t.rev), clientv3.WithSerializable())
		for i := 0; i < futureRetries && errors.Is(err, rpctypes.ErrFutureRev); i++ {
			resp, err = txn(ctx, true, clientv3.WithRev(t.rev), clientv3.WithSerializable())
		}
		if errors.Is(err, rpctypes.ErrFutureRev) {
			resp, err = txn(ctx, false, clientv3.WithRev(t.rev))
		}
	}
	if err == nil && len(resp.Responses) != len(idx) {
		err = fmt.Errorf("%d responses to %d gets", len(resp.Responses), len(idx))
	}
	if err != nil {
		t.err = &storeError{err}
		return t.err
	}
	for j, i := range idx {
		r := resp.Responses[j].GetResponseRange()
		if r == nil {
			t.err = &storeError{fmt.Errorf("response %d to a get is not a range response", j)}
			return t.err
		}
		if len(r.Kvs) > 0 {
			vals[i] = nonNil(r.Kvs[0].Value)
		}
		t.remember(string(keys[i]), vals[i])
	}
	return nil
}

func (t *etcdTxn) Put(key, val []byte) error {
	if t.writes == nil {
		return errors.New("meta: etcd: write in a read-only transaction")
	}
	// Non-nil even when empty: a nil value means "absent" to Get's callers.
	t.writes[string(key)] = etcdWrite{val: append([]byte{}, val...)}
	return nil
}

func (t *etcdTxn) Delete(key []byte) error {
	if t.writes == nil {
		return errors.New("meta: etcd: write in a read-only transaction")
	}
	t.writes[string(key)] = etcdWrite{del: true}
	return nil
}

// Scan pages through the snapshot, merging the transaction's buffered
// writes in key order. Writes made by fn during the scan are not seen by
// the scan itself.
func (t *etcdTxn) Scan(prefix, start []byte, fn func(k, v []byte) bool) error {
	from := prefix
	if bytes.Compare(start, prefix) > 0 {
		from = start
	}
	end := clientv3.GetPrefixRangeEnd(t.s.data + string(prefix))
	var pending []string // buffered keys in range, sorted
	for _, m := range []map[string]etcdWrite{t.writes, t.base} {
		for k := range m {
			if strings.HasPrefix(k, string(prefix)) && k >= string(from) {
				pending = append(pending, k)
			}
		}
	}
	slices.Sort(pending)
	pending = slices.Compact(pending) // a key in both maps
	// emitPending emits buffered puts with keys below limit (all if
	// limit is nil); it reports false once fn asks to stop.
	emitPending := func(limit *string) bool {
		for len(pending) > 0 && (limit == nil || pending[0] < *limit) {
			k := pending[0]
			pending = pending[1:]
			if w, _ := t.buffered(k); !w.del && !fn([]byte(k), w.val) {
				return false
			}
		}
		return true
	}
	cursor := t.s.data + string(from)
	for page := 0; ; page++ {
		resp, err := t.get(cursor, clientv3.WithRange(end), clientv3.WithLimit(int64(t.s.opts.ScanPage)))
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			k := string(kv.Key[len(t.s.data):])
			if !emitPending(&k) {
				return nil
			}
			if len(pending) > 0 && pending[0] == k {
				continue // shadowed by a buffered write, emitted above if a put
			}
			if !fn([]byte(k), nonNil(kv.Value)) {
				return nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		cursor = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	emitPending(nil)
	return nil
}

// futureRetries is how often a serialisable read of a revision the member
// has not applied yet is tried again before a linearisable one: the other
// members of a cluster of three.
const futureRetries = 2

// nonNil maps the nil that protobuf decodes an empty value to back to an
// empty value, since nil means "absent".
func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

// OpenEtcd opens the metadata engine on an etcd cluster and initialises
// the root directory if the prefix is new.
func OpenEtcd(ctx context.Context, opts EtcdOptions) (Engine, error) {
	kv, err := openEtcdKV(ctx, opts)
	if err != nil {
		return nil, err
	}
	e := newKVEngine(kv)
	if f := opts.Fence; f != nil && f.Valid != nil && !opts.NoReadCache {
		e.cache = newReadCache(kv.leaseHeld)
	}
	if err := e.Init(ctx); err != nil {
		kv.Close()
		return nil, err
	}
	return e, nil
}

// ParseEtcdURL parses "etcd://host:port[,host:port...]/prefix" into
// options (endpoints and prefix; an empty path means the default prefix).
func ParseEtcdURL(s string) (EtcdOptions, error) {
	u, err := url.Parse(s)
	if err != nil {
		return EtcdOptions{}, fmt.Errorf("meta: etcd URL %q: %w", s, err)
	}
	if u.Scheme != "etcd" {
		return EtcdOptions{}, fmt.Errorf("meta: etcd URL %q: scheme must be etcd://", s)
	}
	if u.Host == "" {
		return EtcdOptions{}, fmt.Errorf("meta: etcd URL %q: no endpoints", s)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return EtcdOptions{}, fmt.Errorf("meta: etcd URL %q: only endpoints and a prefix are supported", s)
	}
	var opts EtcdOptions
	for _, ep := range strings.Split(u.Host, ",") {
		if ep == "" {
			return EtcdOptions{}, fmt.Errorf("meta: etcd URL %q: empty endpoint", s)
		}
		opts.Endpoints = append(opts.Endpoints, ep)
	}
	if p := strings.TrimSuffix(u.Path, "/"); p != "" {
		opts.Prefix = p
	}
	return opts, nil
}
