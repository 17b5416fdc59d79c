package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/pnfs"
)

// Data server to data server: REPLICA_WRITE and REPLICA_COMMIT.
//
// A data server calls its peers on their advertised addresses (the NFS
// port, whose listener serves program SHOAL_CONTROL for peers through
// Agent.PeerHandler), one pooled connection per peer, dialed again when it
// fails. The calls carry no credential; each carries a MAC made with the
// data filehandle key that every registered member of the cluster has
// (replicaMAC), so nobody else can write objects through a peer. The MAC
// covers the call's arguments but not its data, as NFS's own AUTH_SYS
// covers no data: the network between data servers is trusted not to
// alter traffic.

// Bounds of peer calls; store.Backend has no context of its own.
const (
	peerDialTimeout = 5 * time.Second
	peerCallTimeout = 30 * time.Second
)

// peerPool holds the agent's connections to other data servers, by id.
type peerPool struct {
	a      *Agent
	mu     sync.Mutex
	conns  map[string]*peerConn
	closed bool
}

// peerConn is the connection to one peer; mu serialises dialing it.
type peerConn struct {
	mu   sync.Mutex
	addr string
	conn *rpc.Conn
}

func newPeerPool(a *Agent) *peerPool { return &peerPool{a: a, conns: map[string]*peerConn{}} }

// conn returns a live connection to peer id, dialing one of its
// advertised addresses (from the last map naming it) if needed; fresh
// says it was just dialed.
func (p *peerPool) conn(ctx context.Context, id string) (c *rpc.Conn, fresh bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, fmt.Errorf("%w: agent closed", pnfs.ErrUnavailable)
	}
	pc := p.conns[id]
	if pc == nil {
		pc = &peerConn{}
		p.conns[id] = pc
	}
	p.mu.Unlock()

	p.a.mu.Lock()
	addrs := p.a.peerAddrs[id]
	p.a.mu.Unlock()

	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.conn != nil {
		if pc.conn.Err() == nil && slices.Contains(addrs, pc.addr) {
			return pc.conn, false, nil
		}
		pc.conn.Close()
		pc.conn = nil
	}
	if len(addrs) == 0 {
		return nil, false, fmt.Errorf("%w: no address known for data server %s", pnfs.ErrUnavailable, id)
	}
	var errs []error
	for _, addr := range addrs {
		dctx, cancel := context.WithTimeout(ctx, peerDialTimeout)
		c, err := rpc.Dial(dctx, "tcp", addr, nil, rpc.WithConfig(rpc.ConnConfig{
			WriteTimeout: peerCallTimeout,
			IdleTimeout:  rpc.DefaultIdleTimeout,
			Logger:       p.a.log,
		}))
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			c.Close()
			return nil, false, fmt.Errorf("%w: agent closed", pnfs.ErrUnavailable)
		}
		pc.addr, pc.conn = addr, c
		return c, true, nil
	}
	return nil, false, fmt.Errorf("%w: data server %s: %w", pnfs.ErrUnavailable, id, errors.Join(errs...))
}

// call makes one call to peer id. A pooled connection can have been
// closed by the peer since its last use (idle, or the peer restarted on
// the same address) without the pool having noticed: a call failing that
// way is made once more on a fresh connection. Both calls are idempotent.
func (p *peerPool) call(ctx context.Context, id string, proc uint32, args xdr.Marshaler, res xdr.Unmarshaler) error {
	for try := 0; ; try++ {
		c, fresh, err := p.conn(ctx, id)
		if err != nil {
			return err
		}
		err = call(ctx, c, proc, args, res)
		if err == nil || fresh || try > 0 || !errors.Is(err, rpc.ErrConnClosed) {
			return err
		}
	}
}

// close closes every peer connection; conn fails afterwards.
func (p *peerPool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[string]*peerConn{}
	p.mu.Unlock()
	for _, pc := range conns {
		pc.mu.Lock()
		if pc.conn != nil {
			pc.conn.Close()
			pc.conn = nil
		}
		pc.mu.Unlock()
	}
}

// MAC domains: REPLICA_WRITE and REPLICA_COMMIT MACs can never be taken
// for each other (their inputs differ in length).
const (
	macWrite  = "replica"
	macCommit = "replica-commit"
)

// replicaWriteMAC is the MAC of a REPLICA_WRITE: HMAC-SHA256 with the data
// filehandle key over "replica", then ino, gen, offset and the data's
// length as big-endian 64-bit numbers and stable as one byte, truncated to
// 16 bytes.
func replicaWriteMAC(key []byte, ino, gen, off, n uint64, stable bool) [16]byte {
	b := make([]byte, 0, len(macWrite)+33)
	b = append(b, macWrite...)
	b = binary.BigEndian.AppendUint64(b, ino)
	b = binary.BigEndian.AppendUint64(b, gen)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint64(b, n)
	if stable {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return macOf(key, b)
}

// replicaCommitMAC is the MAC of a REPLICA_COMMIT: HMAC-SHA256 with the
// data filehandle key over "replica-commit", ino and gen, truncated to 16
// bytes.
func replicaCommitMAC(key []byte, ino, gen uint64) [16]byte {
	b := make([]byte, 0, len(macCommit)+16)
	b = append(b, macCommit...)
	b = binary.BigEndian.AppendUint64(b, ino)
	b = binary.BigEndian.AppendUint64(b, gen)
	return macOf(key, b)
}

func macOf(key, msg []byte) [16]byte {
	h := hmac.New(sha256.New, key)
	h.Write(msg)
	var out [16]byte
	copy(out[:], h.Sum(nil))
	return out
}

// replicaWrite hands data at off of ino to peer id (REPLICA_WRITE) and
// returns the peer's boot verifier. The data is spliced into the call
// without a copy and not referenced once replicaWrite returns.
func (a *Agent) replicaWrite(ctx context.Context, id string, ino, gen, off uint64, data []byte, stable bool) ([8]byte, error) {
	key := a.DataKey()
	if len(key) == 0 {
		return [8]byte{}, fmt.Errorf("%w: not registered with the MDS", pnfs.ErrUnavailable)
	}
	args := &ctlproto.CtlReplicaWriteArgs{
		Mac: replicaWriteMAC(key, ino, gen, off, uint64(len(data)), stable),
		Ino: ino, Gen: gen, Offset: off, Stable: stable, Data: data,
	}
	ctx, cancel := context.WithTimeout(ctx, peerCallTimeout)
	defer cancel()
	var res ctlproto.CtlWriteRes
	if err := a.peers.call(ctx, id, ctlproto.CTLPROC_REPLICA_WRITE, args, &res); err != nil {
		return [8]byte{}, fmt.Errorf("cluster: REPLICA_WRITE of ino %d to %s: %w", ino, id, err)
	}
	if res.Status != ctlproto.CTL_OK {
		return [8]byte{}, fmt.Errorf("cluster: REPLICA_WRITE of ino %d at %d to %s: %w", ino, off, id, errOf(res.Status))
	}
	if int(res.Ok.Count) != len(data) {
		return [8]byte{}, fmt.Errorf("cluster: REPLICA_WRITE of ino %d at %d to %s: short write %d of %d: %w",
			ino, off, id, res.Ok.Count, len(data), io.ErrShortWrite)
	}
	return res.Ok.Verifier, nil
}

// replicaCommit makes ino durable on peer id (REPLICA_COMMIT) and returns
// the peer's boot verifier.
func (a *Agent) replicaCommit(ctx context.Context, id string, ino, gen uint64) ([8]byte, error) {
	key := a.DataKey()
	if len(key) == 0 {
		return [8]byte{}, fmt.Errorf("%w: not registered with the MDS", pnfs.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, peerCallTimeout)
	defer cancel()
	var res ctlproto.CtlCommitRes
	if err := a.peers.call(ctx, id, ctlproto.CTLPROC_REPLICA_COMMIT,
		&ctlproto.CtlReplicaCommitArgs{Mac: replicaCommitMAC(key, ino, gen), Ino: ino, Gen: gen}, &res); err != nil {
		return [8]byte{}, fmt.Errorf("cluster: REPLICA_COMMIT of ino %d to %s: %w", ino, id, err)
	}
	if res.Status != ctlproto.CTL_OK {
		return [8]byte{}, fmt.Errorf("cluster: REPLICA_COMMIT of ino %d to %s: %w", ino, id, errOf(res.Status))
	}
	return *res.Verifier, nil
}

// PeerHandler serves program SHOAL_CONTROL for the data server's peers:
// REPLICA_WRITE and REPLICA_COMMIT (and NULL); every other procedure is
// PROC_UNAVAIL, since the listener is the NFS port, open to clients. Route
// calls to SHOAL_CONTROL on the data server's NFS listener here
// (internal/serverhook.SetPrograms).
func (a *Agent) PeerHandler() rpc.Handler { return rpc.HandlerFunc(a.servePeer) }

func (a *Agent) servePeer(ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if st, ok := checkProgram(c, res); !ok {
		return st
	}
	p, ok := ctlProc(c.Proc, fromPeer)
	if !ok {
		return rpc.ProcUnavail
	}
	return runProc(a, p, p.agent, ctx, c, res)
}

// peerAuth checks a peer call's MAC in constant time.
func (a *Agent) peerAuth(mac [16]byte, want func(key []byte) [16]byte) ctlproto.CtlStatus {
	key := a.DataKey()
	if len(key) == 0 {
		return ctlproto.CTL_ERR_DELAY // not registered yet: no key to check with
	}
	w := want(key)
	if !hmac.Equal(mac[:], w[:]) {
		return ctlproto.CTL_ERR_AUTH
	}
	return ctlproto.CTL_OK
}

// peerMapStatus is the status of a peer call whose map could not be had.
func (a *Agent) peerMapStatus(ino uint64, err error) ctlproto.CtlStatus {
	if errors.Is(err, fs.ErrNotExist) {
		return ctlproto.CTL_ERR_NOTMEMBER // the file has no map: nobody holds it
	}
	a.log.Debug("cluster: no map for a peer call", "ino", ino, "err", err)
	if st := statusOf(err); st != ctlproto.CTL_ERR_IO {
		return st
	}
	return ctlproto.CTL_ERR_DELAY
}

// peerWrite serves REPLICA_WRITE: the bytes go to the local store only,
// never further.
func (a *Agent) peerWrite(ctx context.Context, args *ctlproto.CtlReplicaWriteArgs) ctlproto.CtlWriteRes {
	a.stats.replicaWriteOps.Add(1)
	n := uint64(len(args.Data))
	if st := a.peerAuth(args.Mac, func(key []byte) [16]byte {
		return replicaWriteMAC(key, args.Ino, args.Gen, args.Offset, n, args.Stable)
	}); st != ctlproto.CTL_OK {
		return ctlproto.CtlWriteRes{Status: st}
	}
	end := args.Offset + n
	if end < args.Offset || end > 1<<63-1 {
		return ctlproto.CtlWriteRes{Status: ctlproto.CTL_ERR_FBIG}
	}
	m, err := a.mapAtLeast(ctx, args.Ino, args.Gen)
	if err != nil {
		return ctlproto.CtlWriteRes{Status: a.peerMapStatus(args.Ino, err)}
	}
	if !holdsRange(m, a.cfg.ID, args.Offset, len(args.Data)) {
		return ctlproto.CtlWriteRes{Status: ctlproto.CTL_ERR_NOTMEMBER}
	}
	f, err := a.cfg.Store.Open(args.Ino, true)
	if err != nil {
		return ctlproto.CtlWriteRes{Status: a.storeStatus("replica write", args.Ino, err)}
	}
	defer f.Close()
	if _, err := f.WriteAt(args.Data, int64(args.Offset)); err != nil {
		return ctlproto.CtlWriteRes{Status: a.storeStatus("replica write", args.Ino, err)}
	}
	if args.Stable {
		if err := f.Sync(); err != nil {
			return ctlproto.CtlWriteRes{Status: a.storeStatus("replica write", args.Ino, err)}
		}
	}
	a.stats.replicaWriteBytes.Add(n)
	return ctlproto.CtlWriteRes{Status: ctlproto.CTL_OK, Ok: &ctlproto.CtlWriteOk{
		Count: uint32(n), Committed: args.Stable, Verifier: a.verifier,
	}}
}

// peerCommit serves REPLICA_COMMIT: a sync of the local object, for a
// data server that holds a current copy of some part of the file.
func (a *Agent) peerCommit(ctx context.Context, args *ctlproto.CtlReplicaCommitArgs) ctlproto.CtlCommitRes {
	a.stats.replicaCommitOps.Add(1)
	if st := a.peerAuth(args.Mac, func(key []byte) [16]byte {
		return replicaCommitMAC(key, args.Ino, args.Gen)
	}); st != ctlproto.CTL_OK {
		return ctlproto.CtlCommitRes{Status: st}
	}
	m, err := a.mapAtLeast(ctx, args.Ino, args.Gen)
	if err != nil {
		return ctlproto.CtlCommitRes{Status: a.peerMapStatus(args.Ino, err)}
	}
	if !m.Holds(a.cfg.ID) || m.IsStale(a.cfg.ID) {
		return ctlproto.CtlCommitRes{Status: ctlproto.CTL_ERR_NOTMEMBER}
	}
	if err := a.cfg.Store.Sync(args.Ino); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return ctlproto.CtlCommitRes{Status: a.storeStatus("replica commit", args.Ino, err)}
	}
	return ctlproto.CtlCommitRes{Status: ctlproto.CTL_OK, Verifier: &a.verifier}
}
