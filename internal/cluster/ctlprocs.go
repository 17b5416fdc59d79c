package cluster

import (
	"context"
	"errors"
	"io/fs"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
)

// The control protocol (spec/control.x) has three kinds of caller, each
// served by its own endpoint: the MDS calls a data server's Agent over the
// connection the data server opened (Agent.serveRPC), a data server calls
// the MDS's Registry (Registry.serveRPC), and a data server calls a peer
// data server on the peer's NFS port (Agent.servePeer). ctlProcs declares
// every procedure once: who may call it, its arguments (by the handler's
// type) and its handler. An endpoint answers PROC_UNAVAIL to a procedure
// its callers may not make, as to one the table does not declare.

// caller is a kind of caller of the control protocol, a set when combined.
type caller uint8

const (
	// fromMDS: the MDS calls a data server (Agent.serveRPC). The data
	// server refuses these calls from an MDS of an older term
	// (Agent.staleTerm) with CTL_ERR_NOT_LEADER.
	fromMDS caller = 1 << iota
	// fromDS: a data server calls the MDS (Registry.serveRPC).
	fromDS
	// fromPeer: a data server calls a peer data server on the peer's
	// NFS listener (Agent.servePeer), which clients can reach too: each
	// such procedure authenticates its caller itself.
	fromPeer
)

// procHandler serves one call whose arguments it decodes itself, writing
// its result to res, on an endpoint of type E.
type procHandler[E any] func(e E, ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat

// procDef declares one control procedure.
type procDef struct {
	// from is who may call it.
	from caller
	// agent serves it on a data server (fromMDS, fromPeer); registry on
	// the MDS (fromDS). Both nil: the procedure takes no arguments and
	// returns nothing (NULL).
	agent    procHandler[*Agent]
	registry procHandler[*Registry]
	// releaseArgs: the handler keeps no reference to its decoded
	// arguments' bytes once the reply is written, so the RPC layer may
	// reuse the request's buffer (rpc.Call.ReleaseArgsAfterReply).
	releaseArgs bool
}

// argsPtr is a pointer to a procedure's generated arguments type.
type argsPtr[A any] interface {
	*A
	xdr.Unmarshaler
}

// decoding makes a procHandler of fn: it decodes the call's arguments,
// requiring that all are consumed (GARBAGE_ARGS otherwise), and runs fn,
// which writes the result.
func decoding[E, A any, PA argsPtr[A]](fn func(e E, ctx context.Context, c *rpc.Call, args PA, res *xdr.Encoder)) procHandler[E] {
	return func(e E, ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
		var args A
		if !decodeArgs(c, PA(&args)) {
			return rpc.GarbageArgs
		}
		fn(e, ctx, c, &args, res)
		return rpc.Success
	}
}

// mdsToDS declares a procedure the MDS calls on a data server.
func mdsToDS[A any, PA argsPtr[A]](fn func(a *Agent, ctx context.Context, c *rpc.Call, args PA, res *xdr.Encoder)) procDef {
	return procDef{from: fromMDS, agent: decoding(fn)}
}

// dsToMDS declares a procedure a data server calls on the MDS.
func dsToMDS[A any, PA argsPtr[A]](fn func(r *Registry, ctx context.Context, c *rpc.Call, args PA, res *xdr.Encoder)) procDef {
	return procDef{from: fromDS, registry: decoding(fn)}
}

// dsToPeer declares a procedure a data server calls on a peer.
func dsToPeer[A any, PA argsPtr[A]](fn func(a *Agent, ctx context.Context, c *rpc.Call, args PA, res *xdr.Encoder)) procDef {
	return procDef{from: fromPeer, agent: decoding(fn)}
}

// releasing marks p's handler as keeping no reference to its arguments.
func (p procDef) releasing() procDef { p.releaseArgs = true; return p }

// noArgs are the arguments of a procedure that takes none: a call with any
// argument bytes is GARBAGE_ARGS.
type noArgs struct{}

func (*noArgs) DecodeXDR(*xdr.Decoder) {}

// ctlProcs is the control protocol, one declaration per procedure.
var ctlProcs = map[uint32]procDef{
	ctlproto.CTLPROC_NULL: {from: fromMDS | fromDS | fromPeer},

	// The MDS to a data server: objects, fencing, cached maps, removal.
	ctlproto.CTLPROC_OBJ_READ:     mdsToDS((*Agent).serveObjRead),
	ctlproto.CTLPROC_OBJ_WRITE:    mdsToDS((*Agent).serveObjWrite).releasing(),
	ctlproto.CTLPROC_OBJ_COMMIT:   mdsToDS((*Agent).serveObjCommit),
	ctlproto.CTLPROC_OBJ_TRUNCATE: mdsToDS((*Agent).serveObjTruncate),
	ctlproto.CTLPROC_OBJ_REMOVE:   mdsToDS((*Agent).serveObjRemove),
	ctlproto.CTLPROC_OBJ_PUNCH:    mdsToDS((*Agent).serveObjPunch),
	ctlproto.CTLPROC_OBJ_ALLOCATE: mdsToDS((*Agent).serveObjAllocate),
	ctlproto.CTLPROC_OBJ_SEEK:     mdsToDS((*Agent).serveObjSeek),
	ctlproto.CTLPROC_OBJ_COPY:     mdsToDS((*Agent).serveObjCopy),
	ctlproto.CTLPROC_OBJ_GETSIZE:  mdsToDS((*Agent).serveObjGetsize),
	ctlproto.CTLPROC_OBJ_SUM:      mdsToDS((*Agent).serveObjSum),
	ctlproto.CTLPROC_OBJ_LIST:     mdsToDS((*Agent).serveObjList),
	ctlproto.CTLPROC_FENCE:        mdsToDS((*Agent).serveFence),
	ctlproto.CTLPROC_UNFENCE:      mdsToDS((*Agent).serveUnfence),
	ctlproto.CTLPROC_MAP_CHANGED:  mdsToDS((*Agent).serveMapChanged),
	ctlproto.CTLPROC_RETIRE:       mdsToDS((*Agent).serveRetire),

	// A data server to the MDS: membership, stateids, sizes, maps, admin.
	ctlproto.CTLPROC_REGISTER:       dsToMDS((*Registry).serveRegister),
	ctlproto.CTLPROC_HEARTBEAT:      dsToMDS((*Registry).serveHeartbeat),
	ctlproto.CTLPROC_CHECK_STATEID:  dsToMDS((*Registry).serveCheckStateid),
	ctlproto.CTLPROC_FILE_SIZE:      dsToMDS((*Registry).serveFileSize),
	ctlproto.CTLPROC_ADMIN:          dsToMDS((*Registry).serveAdminCall),
	ctlproto.CTLPROC_MAP:            dsToMDS((*Registry).serveMapCall),
	ctlproto.CTLPROC_REPLICA_FAILED: dsToMDS((*Registry).serveReplicaFailed),

	// A data server to a peer: the copies of a mirrored write.
	ctlproto.CTLPROC_REPLICA_WRITE:  dsToPeer((*Agent).serveReplicaWrite).releasing(),
	ctlproto.CTLPROC_REPLICA_COMMIT: dsToPeer((*Agent).serveReplicaCommit),
}

// ctlProc returns the declaration of proc if a caller of kind from may make
// it.
func ctlProc(proc uint32, from caller) (procDef, bool) {
	p, ok := ctlProcs[proc]
	return p, ok && p.from&from != 0
}

// runProc runs the call c, declared by p, with h, the handler p has for
// endpoint e: NULL (no handler) answers nothing; a handler that keeps no
// reference to its arguments lets the RPC layer reuse their buffer.
func runProc[E any](e E, p procDef, h procHandler[E], ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if h == nil {
		return rpc.Success
	}
	st := h(e, ctx, c, res)
	if st == rpc.Success && p.releaseArgs {
		c.ReleaseArgsAfterReply()
	}
	return st
}

// Handlers of the MDS's calls on a data server.

func (a *Agent) serveObjRead(_ context.Context, c *rpc.Call, args *ctlproto.CtlReadArgs, res *xdr.Encoder) {
	a.objRead(c, args, res)
}

// serveObjWrite hands args.Data only to Store's WriteAt, which as an
// io.WriterAt does not retain it, and the result holds no slice of it: the
// 1 MiB record buffer can be reused for the next write (releaseArgs).
func (a *Agent) serveObjWrite(_ context.Context, _ *rpc.Call, args *ctlproto.CtlWriteArgs, res *xdr.Encoder) {
	out := a.objWrite(args)
	out.EncodeXDR(res)
}

func (a *Agent) serveObjCommit(_ context.Context, _ *rpc.Call, args *ctlproto.CtlInoArgs, res *xdr.Encoder) {
	a.stats.commitOps.Add(1)
	out := ctlproto.CtlCommitRes{Status: ctlproto.CTL_OK, Verifier: &a.verifier}
	if err := a.cfg.Store.Sync(args.Ino); err != nil && !errors.Is(err, fs.ErrNotExist) {
		out = ctlproto.CtlCommitRes{Status: a.storeStatus("commit", args.Ino, err)}
	}
	out.EncodeXDR(res)
}

func (a *Agent) serveObjTruncate(_ context.Context, _ *rpc.Call, args *ctlproto.CtlTruncateArgs, res *xdr.Encoder) {
	a.stats.truncateOps.Add(1)
	out := ctlproto.CtlStatusRes{Status: ctlproto.CTL_OK}
	if args.Size > 1<<63-1 {
		out.Status = ctlproto.CTL_ERR_FBIG
	} else if err := a.cfg.Store.Truncate(args.Ino, args.Size); err != nil {
		out.Status = a.storeStatus("truncate", args.Ino, err)
	}
	out.EncodeXDR(res)
}

func (a *Agent) serveObjRemove(_ context.Context, _ *rpc.Call, args *ctlproto.CtlInoArgs, res *xdr.Encoder) {
	a.stats.removeOps.Add(1)
	out := ctlproto.CtlStatusRes{Status: ctlproto.CTL_OK}
	if err := a.cfg.Store.Remove(args.Ino); err != nil && !errors.Is(err, fs.ErrNotExist) {
		out.Status = a.storeStatus("remove", args.Ino, err)
	}
	out.EncodeXDR(res)
}

func (a *Agent) serveObjPunch(_ context.Context, _ *rpc.Call, args *ctlproto.CtlPunchArgs, res *xdr.Encoder) {
	out := ctlproto.CtlStatusRes{Status: a.objPunch(args)}
	out.EncodeXDR(res)
}

func (a *Agent) serveObjAllocate(_ context.Context, _ *rpc.Call, args *ctlproto.CtlAllocateArgs, res *xdr.Encoder) {
	out := ctlproto.CtlStatusRes{Status: a.objAllocate(args)}
	out.EncodeXDR(res)
}

func (a *Agent) serveObjSeek(_ context.Context, _ *rpc.Call, args *ctlproto.CtlSeekArgs, res *xdr.Encoder) {
	out := a.objSeek(args)
	out.EncodeXDR(res)
}

func (a *Agent) serveObjCopy(_ context.Context, _ *rpc.Call, args *ctlproto.CtlCopyArgs, res *xdr.Encoder) {
	out := ctlproto.CtlStatusRes{Status: a.objCopy(args)}
	out.EncodeXDR(res)
}

func (a *Agent) serveObjGetsize(_ context.Context, _ *rpc.Call, args *ctlproto.CtlInoArgs, res *xdr.Encoder) {
	a.stats.getSizeOps.Add(1)
	out := a.objSize(args.Ino)
	out.EncodeXDR(res)
}

func (a *Agent) serveObjSum(_ context.Context, _ *rpc.Call, args *ctlproto.CtlSumArgs, res *xdr.Encoder) {
	out := a.objSum(args)
	out.EncodeXDR(res)
}

func (a *Agent) serveFence(_ context.Context, _ *rpc.Call, args *ctlproto.CtlClientArgs, res *xdr.Encoder) {
	a.setFenced(args.Clientid, true)
	(&ctlproto.CtlStatusRes{Status: ctlproto.CTL_OK}).EncodeXDR(res)
}

func (a *Agent) serveUnfence(_ context.Context, _ *rpc.Call, args *ctlproto.CtlClientArgs, res *xdr.Encoder) {
	a.setFenced(args.Clientid, false)
	(&ctlproto.CtlStatusRes{Status: ctlproto.CTL_OK}).EncodeXDR(res)
}

func (a *Agent) serveMapChanged(_ context.Context, _ *rpc.Call, args *ctlproto.CtlInoArgs, res *xdr.Encoder) {
	a.dropMap(args.Ino)
	(&ctlproto.CtlStatusRes{Status: ctlproto.CTL_OK}).EncodeXDR(res)
}

func (a *Agent) serveRetire(_ context.Context, _ *rpc.Call, _ *noArgs, res *xdr.Encoder) {
	a.mu.Lock()
	if !a.removed {
		a.removed = true
		close(a.removedCh)
	}
	a.mu.Unlock()
	a.log.Warn("cluster: removed from the cluster by the MDS")
	(&ctlproto.CtlStatusRes{Status: ctlproto.CTL_OK}).EncodeXDR(res)
}

// Handlers of a data server's calls on the MDS.

func (r *Registry) serveRegister(ctx context.Context, c *rpc.Call, args *ctlproto.CtlRegisterArgs, res *xdr.Encoder) {
	out := r.register(ctx, c.Conn, args)
	out.EncodeXDR(res)
}

func (r *Registry) serveHeartbeat(_ context.Context, c *rpc.Call, args *ctlproto.CtlHeartbeatArgs, res *xdr.Encoder) {
	out := ctlproto.CtlStatusRes{Status: r.heartbeat(c.Conn, args)}
	out.EncodeXDR(res)
}

func (r *Registry) serveCheckStateid(ctx context.Context, c *rpc.Call, args *ctlproto.CtlCheckStateidArgs, res *xdr.Encoder) {
	out := r.checkStateid(ctx, c.Conn, args)
	out.EncodeXDR(res)
}

func (r *Registry) serveFileSize(ctx context.Context, c *rpc.Call, args *ctlproto.CtlInoArgs, res *xdr.Encoder) {
	out := r.fileSize(ctx, c.Conn, args.Ino)
	out.EncodeXDR(res)
}

func (r *Registry) serveAdminCall(ctx context.Context, c *rpc.Call, args *ctlproto.CtlAdminArgs, res *xdr.Encoder) {
	out := r.serveAdmin(ctx, c.Conn, args)
	out.EncodeXDR(res)
}

func (r *Registry) serveMapCall(ctx context.Context, c *rpc.Call, args *ctlproto.CtlInoArgs, res *xdr.Encoder) {
	out := r.serveMap(ctx, c.Conn, func(h MapHandler, _ string) (meta.StripeMap, bool, error) {
		return h.FileMap(ctx, args.Ino)
	})
	out.EncodeXDR(res)
}

func (r *Registry) serveReplicaFailed(ctx context.Context, c *rpc.Call, args *ctlproto.CtlReplicaFailedArgs, res *xdr.Encoder) {
	out := r.serveMap(ctx, c.Conn, func(h MapHandler, from string) (meta.StripeMap, bool, error) {
		m, err := h.ReplicaFailed(ctx, args.Ino, args.Gen, from, args.DsId)
		return m, true, err
	})
	out.EncodeXDR(res)
}

// Handlers of a peer data server's calls.

// serveReplicaWrite hands args.Data only to the store's WriteAt, which does
// not retain it, and the result holds no slice of it (releaseArgs).
func (a *Agent) serveReplicaWrite(ctx context.Context, _ *rpc.Call, args *ctlproto.CtlReplicaWriteArgs, res *xdr.Encoder) {
	out := a.peerWrite(ctx, args)
	out.EncodeXDR(res)
}

func (a *Agent) serveReplicaCommit(ctx context.Context, _ *rpc.Call, args *ctlproto.CtlReplicaCommitArgs, res *xdr.Encoder) {
	out := a.peerCommit(ctx, args)
	out.EncodeXDR(res)
}
