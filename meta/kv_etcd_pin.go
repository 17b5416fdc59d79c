package meta

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// Requests to the leader.
//
// The etcd client spreads requests over its endpoints round robin. On a
// cluster of several members that costs the engine twice: a commit that
// reaches a follower is forwarded to the leader, one more hop between
// processes before the quorum round even starts; and the reads after a
// commit, which ask for the commit's revision, reach a member that may not
// have applied it yet, answer ErrFutureRev, and go again to the next
// member (etcdTxn.get). Traced on three etcd processes on one machine: a
// commit took a median 0.65 ms through the leader and 1.0 ms through a
// follower, and a serial create or remove paid a futile read about one
// time in four.
//
// So the engine sends its requests to the leader, over a connection of
// its own to that member only (the pin), made with the client's own
// settings (Client.Dial: credentials, TLS, interceptors). The leader
// answers a commit after applying it, so the reads that follow find their
// revision there. Nothing about correctness depends on which member
// answers: reads check revisions as before (etcdTxn.get) and every commit
// carries its conditions and the fence, so the pin only changes where a
// request goes, never what it may return. Any failure of the pin sends
// the engine back to the round-robin client at once:
//
//   - the pinned connection failing (the member killed or unreachable)
//     drops the pin, and requests in flight on it end with errPinLost,
//     which is retried through the round-robin client (a commit whose
//     reply is lost that way is resolved like any other lost reply);
//   - an etcd error from the pinned member drops the pin too;
//   - a reply from a newer raft term than the pin's (an election) or an
//     ErrFutureRev from the pinned member (it is behind what the engine
//     saw, so no longer the leader) looks for the leader again.
//
// The leader is looked up with a Status request to every endpoint, in the
// background, at most one look-up at a time and at most one per
// pinRetryEvery; only at open does the engine wait for it, until a member
// answers that it leads or for at most 2 seconds.

// errPinLost ends requests in flight on a pinned connection that was
// dropped: they are retried through the round-robin client.
var errPinLost = errors.New("meta: etcd: connection to the leader dropped")

// pinRetryEvery bounds how often the engine looks for the leader.
const pinRetryEvery = 500 * time.Millisecond

// etcdPin is a connection to the member that led when it was made.
type etcdPin struct {
	kv       clientv3.KV
	conn     *grpc.ClientConn
	endpoint string
	member   uint64
	// term is the raft term in which the member was found leading; a
	// reply from a later term means an election happened.
	term atomic.Uint64
	// ctx ends when the pin is dropped; requests on the pin run under it.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// etcdPinner holds the engine's pin and looks for the leader.
type etcdPinner struct {
	ctx      context.Context // ends at Close
	stop     context.CancelFunc
	cur      atomic.Pointer[etcdPin]
	finding  atomic.Bool
	wg       sync.WaitGroup
	mu       sync.Mutex // guards lastFind
	lastFind time.Time
}

// startPin sets up pinning for an engine whose client has several
// endpoints and finds the leader once, waiting at most until ctx ends.
func (s *etcdKV) startPin(ctx context.Context) {
	if len(s.cli.Endpoints()) < 2 {
		return // one member: the client's own connection goes there
	}
	pctx, stop := context.WithCancel(context.Background())
	s.pinner = &etcdPinner{ctx: pctx, stop: stop}
	s.pinner.finding.Store(true)
	s.pinner.wg.Add(1)
	s.findLeader(ctx)
}

// stopPin drops the pin and waits for look-ups in flight (Close).
func (s *etcdKV) stopPin() {
	p := s.pinner
	if p == nil {
		return
	}
	p.stop()
	p.wg.Wait()
	if pin := p.cur.Swap(nil); pin != nil {
		s.dropPin(pin)
	}
}

// refind starts a look-up for the leader in the background unless one is
// running or the last began less than pinRetryEvery ago.
func (s *etcdKV) refind() {
	p := s.pinner
	if p == nil || p.ctx.Err() != nil || !p.finding.CompareAndSwap(false, true) {
		return
	}
	p.mu.Lock()
	recent := time.Since(p.lastFind) < pinRetryEvery
	p.mu.Unlock()
	if recent {
		p.finding.Store(false)
		return
	}
	p.wg.Add(1)
	go s.findLeader(p.ctx)
}

// findLeader asks every endpoint for its status and pins the leader. It
// runs with p.finding set and one count in p.wg, and releases both.
func (s *etcdKV) findLeader(ctx context.Context) {
	p := s.pinner
	defer p.wg.Done()
	defer p.finding.Store(false)
	p.mu.Lock()
	p.lastFind = time.Now()
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, min(s.opts.DialTimeout, 2*time.Second))
	defer cancel()
	eps := s.cli.Endpoints()
	type status struct {
		ep           string
		member, lead uint64
		term         uint64
	}
	found := make(chan status, len(eps))
	for _, ep := range eps {
		go func() {
			st, err := s.cli.Status(ctx, ep)
			if err != nil {
				found <- status{}
				return
			}
			found <- status{ep, st.Header.MemberId, st.Leader, st.RaftTerm}
		}()
	}
	// The first member to answer that it leads is taken: waiting for the
	// others would wait out the timeout whenever one of them is down. A
	// leader deposed meanwhile shows in a later term (routed).
	var lead status
	for range eps {
		if st := <-found; st.member != 0 && st.member == st.lead {
			lead = st
			break
		}
	}
	if lead.member == 0 || p.ctx.Err() != nil {
		return
	}
	if cur := p.cur.Load(); cur != nil && cur.member == lead.member {
		cur.term.Store(lead.term) // the same leader, in a later term
		return
	}
	conn, err := s.cli.Dial(lead.ep)
	if err != nil {
		return
	}
	pin := &etcdPin{kv: clientv3.NewKVFromKVClient(pb.NewKVClient(conn), s.cli), conn: conn, endpoint: lead.ep, member: lead.member}
	pin.term.Store(lead.term)
	pin.ctx, pin.cancel = context.WithCancelCause(p.ctx)
	if old := p.cur.Swap(pin); old != nil {
		s.dropPin(old)
	}
	p.wg.Add(1)
	go s.watchPin(pin)
}

// watchPin drops pin once its connection fails.
func (s *etcdKV) watchPin(pin *etcdPin) {
	defer s.pinner.wg.Done()
	for st := pin.conn.GetState(); st != connectivity.TransientFailure && st != connectivity.Shutdown; st = pin.conn.GetState() {
		if !pin.conn.WaitForStateChange(pin.ctx, st) {
			return // dropped, or the engine closed
		}
	}
	s.unpin(pin)
	s.refind()
}

// unpin drops pin if it is still the engine's pin.
func (s *etcdKV) unpin(pin *etcdPin) {
	if s.pinner.cur.CompareAndSwap(pin, nil) {
		s.dropPin(pin)
	}
}

// dropPin ends the requests in flight on pin (errPinLost) and closes its
// connection.
func (s *etcdKV) dropPin(pin *etcdPin) {
	pin.cancel(errPinLost)
	_ = pin.conn.Close()
}

// route returns where to send one request: the pin's KV with a context
// that also ends when the pin is dropped, or the round-robin client (pin
// nil). done must be called once the request is over.
func (s *etcdKV) route(ctx context.Context) (kv clientv3.KV, rctx context.Context, pin *etcdPin, done func()) {
	if s.pinner != nil {
		if pin = s.pinner.cur.Load(); pin != nil {
			rctx, cancel := context.WithCancelCause(ctx)
			stop := context.AfterFunc(pin.ctx, func() { cancel(context.Cause(pin.ctx)) })
			return pin.kv, rctx, pin, func() { stop(); cancel(nil) }
		}
		s.refind()
	}
	return s.cli.KV, ctx, nil, func() {}
}

// routed tells the pin how a request sent through route went, and
// returns the request's error, as errPinLost if the pin was dropped under
// it (retryable, unlike the context's cancellation it shows up as).
func (s *etcdKV) routed(pin *etcdPin, ctx context.Context, h *pb.ResponseHeader, err error) error {
	if pin == nil {
		return err
	}
	switch {
	case err == nil:
		if h != nil && h.RaftTerm > pin.term.Load() {
			s.refind()
		}
	case pin.ctx.Err() != nil && ctx.Err() == nil:
		return errPinLost
	case errors.Is(err, rpctypes.ErrFutureRev):
		s.refind()
	case !errors.Is(ctx.Err(), context.Canceled):
		// An error or no answer in time from the pinned member: the
		// round-robin client, until the leader is found again.
		s.unpin(pin)
		s.refind()
	}
	return err
}

// getVia makes one Get, through route unless rr (the round-robin client).
func (s *etcdKV) getVia(ctx context.Context, rr bool, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	kv, rctx, pin, done := s.cli.KV, ctx, (*etcdPin)(nil), func() {}
	if !rr {
		kv, rctx, pin, done = s.route(ctx)
	}
	defer done()
	resp, err := kv.Get(rctx, key, opts...)
	var h *pb.ResponseHeader
	if err == nil {
		h = resp.Header
	}
	return resp, s.routed(pin, ctx, h, err)
}

// txnVia commits the Txn build makes, through route unless rr.
func (s *etcdKV) txnVia(ctx context.Context, rr bool, build func(clientv3.Txn) clientv3.Txn) (*clientv3.TxnResponse, error) {
	kv, rctx, pin, done := s.cli.KV, ctx, (*etcdPin)(nil), func() {}
	if !rr {
		kv, rctx, pin, done = s.route(ctx)
	}
	defer done()
	resp, err := build(kv.Txn(rctx)).Commit()
	var h *pb.ResponseHeader
	if err == nil {
		h = resp.Header
	}
	return resp, s.routed(pin, ctx, h, err)
}
