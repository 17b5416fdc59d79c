package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/procs"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/serverhook"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// Config configures a Server.
type Config struct {
	// Dir holds the metadata database (unless MetaURL names another
	// engine) and file data.
	Dir string
	// MetaURL selects the metadata engine: "" or "bolt" for a bbolt
	// database in Dir (meta.db), or "etcd://host:port[,host:port...]/prefix"
	// for an etcd cluster, with all keys under prefix (see meta.OpenEtcd).
	// Only one server may use an etcd prefix at a time.
	MetaURL string
	// Meta, if set, is the metadata engine to use instead of opening
	// MetaURL: an engine the caller opened with options of its own (the
	// elected MDS's fenced etcd engine). The server closes it.
	Meta meta.Engine
	// Leading, if set, is asked at the start of every COMPOUND whether
	// this server may still act (an elected MDS's leadership, which a
	// pause can outlive); while it returns an error, every COMPOUND is
	// answered NFS4ERR_DELAY and nothing is read or changed.
	Leading func() error
	// Exports to serve. Empty means one read-write export of "/" with root
	// squashing.
	Exports []*Export
	// Lease is the NFSv4 lease time (default 90 s). The grace period after
	// a restart lasts one lease.
	Lease time.Duration
	// MaxRead and MaxWrite bound READ and WRITE sizes (default 1 MiB).
	MaxRead, MaxWrite uint32
	Logger            *slog.Logger
	// PNFS, if set, makes the server a pNFS metadata server whose file data
	// lives on data servers.
	PNFS *PNFSConfig
	// Metrics, if set, receives the server's Prometheus collector, with
	// MetricLabels (for example role and instance) on every series.
	Metrics      prometheus.Registerer
	MetricLabels prometheus.Labels
	// OnEvent, if set, is told of layout and delegation recalls,
	// delegation revocations, fencing and purged clients (Event), from
	// the server's goroutines as they happen; it must not block.
	OnEvent func(Event)
	// NoDelegations turns delegations off: OPEN and WANT_DELEGATION never
	// grant one. The zero value grants them when it is safe (deleg.go).
	NoDelegations bool
	// Async answers the COMPOUNDs that change metadata of an export
	// without sync: true once the changes are written to the metadata
	// engine's log, before they are durable (knfsd's async export; see
	// durability.go). The zero value answers once durable.
	Async bool
	// CommitInterval bounds how long a change answered early waits for
	// the log's fdatasync (default meta.DefaultCommitInterval).
	CommitInterval time.Duration
	// InlineMax is the size up to which a pNFS metadata server keeps a
	// file's data in its metadata engine rather than on data servers
	// (inline.go); 0 means DefaultInlineMax and a negative value turns
	// it off. Only files written through the metadata server start
	// inline.
	InlineMax int

	// programs serves other ONC RPC programs on the same listener (the
	// metadata server's control protocol for data servers). Only the
	// module's wiring sets it, through internal/serverhook, so that
	// Config names no internal type.
	programs map[uint32]rpc.Handler
}

// Server is a single-node NFSv4.1/4.2 server.
type Server struct {
	cfg  Config
	log  *slog.Logger
	meta meta.Engine
	data store.Backend
	// inline is s.data on a pNFS metadata server keeping small files in
	// the engine; nil otherwise.
	inline *inlineStore
	// mdsThreshold is the encoded mdsthreshold attribute (inline.go);
	// mdsThresholdFlex that of flexfiles exports.
	mdsThreshold, mdsThresholdFlex []byte
	ns                             *namespace
	fh                             fhCodec
	rpc                            *rpc.Server
	cache                          *inodeCache

	// life ends when Close starts: the only thing that cuts a COMPOUND
	// short (see compoundRequest).
	life    context.Context
	endLife context.CancelFunc
	// cctx is the context COMPOUNDs run under: life, marked
	// meta.Deferred when the engine can sync later (syncer); see
	// durability.go.
	cctx   context.Context
	syncer meta.Syncer

	testHookBeforeOp atomic.Pointer[opHook] // set by tests only

	// inflight counts COMPOUNDs between their start and their reply's
	// write; quiescing refuses new ones (Quiesce).
	inflight  atomic.Int64
	quiescing atomic.Bool
	// replied ends a COMPOUND's count; made once, so that registering it
	// per request allocates nothing.
	replied func()

	// writeVerf changes on every start, so clients detect that uncommitted
	// UNSTABLE writes may have been lost (RFC 8881 §18.32.3). verfGen
	// changes it during a run too: see Server.verifier.
	writeVerf [8]byte
	verfGen   atomic.Uint32
	// owner and scope identify this server instance to clients (EXCHANGE_ID).
	owner, scope []byte
	bootTime     time.Time

	st        *stateGlue
	startOnce sync.Once
	// ops are the operations of the server's role (optable.go).
	ops opTable
	// exchangeFlags is the role EXCHANGE_ID tells clients
	// (EXCHGID4_FLAG_USE_NON_PNFS, _USE_PNFS_MDS or _USE_PNFS_DS).
	exchangeFlags uint32
	// pnfs is the layout machinery of a metadata server with data
	// servers; nil on a plain server, where its methods that the shared
	// MDS code calls answer for a server without layouts (pnfs.go).
	pnfs *pnfsState
	// replays are the durable replay records of namespace changes
	// (replay.go); nil on a data server.
	replays *replayBook
	// ds is a data server's configuration; nil on an MDS. Only the
	// data server's handlers (ds.go) use it.
	ds       *DataServerConfig
	counters counters
	copies   asyncCopies    // COPY in the background (copy_async.go)
	reports  *layoutReports // LAYOUTERROR, LAYOUTSTATS (layoutstats.go)
	// fileLayouts caches the layout types recorded on files (layoutpolicy.go).
	fileLayouts fileLayouts
	// ownData is set when the server opened its data store itself (and so
	// closes it); a store handed in by the caller stays open.
	ownData bool
	// sweep removes data objects no file owns after an unclean start
	// (sweep.go); nil on a data server.
	sweep *sweeper
}

const (
	defaultMaxIO = 1 << 20
)

// fillDefaults sets the defaults of every role.
func (cfg *Config) fillDefaults() {
	if cfg.Lease <= 0 {
		cfg.Lease = 90 * time.Second
	}
	if cfg.MaxRead == 0 {
		cfg.MaxRead = defaultMaxIO
	}
	if cfg.MaxWrite == 0 {
		cfg.MaxWrite = defaultMaxIO
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
}

// New opens (or creates) a server's state under cfg.Dir.
func New(cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("server: no data directory")
	}
	cfg.fillDefaults()
	if len(cfg.Exports) == 0 {
		cfg.Exports = []*Export{{Path: "/"}}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, bootTime: time.Now(), reports: newLayoutReports(),
		ops: plainOps, exchangeFlags: nfs4.EXCHGID4_FLAG_USE_NON_PNFS}
	s.initLife()
	ns, err := newNamespace(cfg.Exports)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.ns = ns
	m, err := openMeta(cfg)
	if err != nil {
		return nil, fmt.Errorf("server: open metadata: %w", err)
	}
	s.meta = m
	s.setDurability()
	ctx := context.Background()
	if err := m.Init(ctx); err != nil {
		m.Close()
		return nil, fmt.Errorf("server: init metadata: %w", err)
	}
	secret, err := loadFHSecret(
		func() ([]byte, error) { return m.GetConfig(ctx, "fh-secret") },
		func(b []byte) error { return m.PutConfig(ctx, "fh-secret", b) })
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("server: filehandle secret: %w", err)
	}
	s.fh = newFHCodec(secret)
	// The server owner must be stable across restarts and unique to this
	// server, but clients see it: derive it from the secret instead of
	// showing any byte of the key that makes every filehandle.
	s.owner = append([]byte("shoal:"), dataFHKey(append([]byte("server owner:"), secret...))[:8]...)
	s.scope = []byte("shoal")
	fillWriteVerf(s)

	if err := s.resolveExports(ctx); err != nil {
		m.Close()
		return nil, err
	}
	if cfg.PNFS != nil {
		s.data = cfg.PNFS.Backend
		if cfg.InlineMax >= 0 {
			limit := cfg.InlineMax
			if limit == 0 {
				limit = DefaultInlineMax
			}
			s.inline = newInlineStore(m, s.data, limit)
			s.data = s.inline
		}
	} else if s.data, err = store.NewLocal(cfg.Dir, store.LocalOptions{}); err != nil {
		m.Close()
		return nil, fmt.Errorf("server: data store: %w", err)
	} else {
		s.ownData = true
		if err := markNoData(ctx, cfg, m, s.data.(*store.Local)); err != nil {
			s.data.Close()
			m.Close()
			return nil, err
		}
	}
	s.mdsThreshold = mdsThreshold(s.inline)
	s.mdsThresholdFlex = mdsThresholdOf(s.inline, nfs4.LAYOUT4_FLEX_FILES)
	s.cache = newInodeCache(s)
	epoch, err := nextEpoch(ctx, m)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("server: boot epoch: %w", err)
	}
	if s.st, err = newStateGlue(s, epoch, metaClients{m}); err != nil {
		m.Close()
		return nil, err
	}
	s.replays = newReplayBook(s, epoch)
	if s.st.orphans, err = newOrphanSet(s.st.ctx, s); err != nil {
		s.st.cancel()
		m.Close()
		return nil, err
	}
	s.sweep = newSweeper(s)
	if cfg.PNFS != nil {
		s.pnfs = newPNFS(s, cfg.PNFS)
		s.ops, s.exchangeFlags = mdsOps, nfs4.EXCHGID4_FLAG_USE_PNFS_MDS
	}
	if err := s.registerMetrics(); err != nil {
		m.Close()
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	s.rpc = &rpc.Server{Handler: (*rpcHandler)(s), Logger: s.log, ConnState: s.connState}
	return s, nil
}

// markNoData tells the server's own data store which inode numbers have
// no data file yet (store.Local.NoDataFrom), so that freeing a removed
// file that never had data makes no unlink(2): every number from the
// engine's next inode number on. Only with the bbolt engine that openMeta
// opened in the same directory: its lock makes this process the only
// one that allocates inode numbers and makes data files there, and an
// unclean shutdown has already advanced the counter past every number
// the last run may have handed out (meta's inoGap). An etcd engine's
// counter is shared with other servers, so it is left alone.
func markNoData(ctx context.Context, cfg Config, m meta.Engine, l *store.Local) error {
	if cfg.Meta != nil || (cfg.MetaURL != "" && cfg.MetaURL != "bolt") {
		return nil
	}
	st, err := m.StatFS(ctx)
	if err != nil {
		return fmt.Errorf("server: read the next inode number: %w", err)
	}
	l.NoDataFrom(uint64(st.NextIno))
	return nil
}

// openMeta opens the metadata engine cfg.MetaURL names.
func openMeta(cfg Config) (meta.Engine, error) {
	if cfg.Meta != nil {
		return cfg.Meta, nil
	}
	switch u := cfg.MetaURL; {
	case u == "" || u == "bolt":
		if !cfg.Async {
			// Every change waits for the metadata log's fdatasync, which
			// a goroutine runs blocked in the system call, one at a time
			// (meta's rounds): it gets a P of its own, so that the rest
			// of the server, and the goroutine coming back from the
			// call, need not wait for sysmon to take its P away
			// (internal/procs).
			procs.Reserve("metadata log fdatasync", 1)
		}
		return meta.OpenBolt(filepath.Join(cfg.Dir, "meta.db"), meta.BoltOptions{GroupCommit: true, WAL: true, CommitInterval: cfg.CommitInterval})
	case strings.HasPrefix(u, "etcd://"):
		opts, err := meta.ParseEtcdURL(u)
		if err != nil {
			return nil, err
		}
		return meta.OpenEtcd(context.Background(), opts)
	default:
		return nil, fmt.Errorf("unknown metadata engine %q: want bolt or etcd://HOST:PORT[,HOST:PORT...]/PREFIX", u)
	}
}

// resolveExports finds (creating if needed) each export's root directory.
func (s *Server) resolveExports(ctx context.Context) error {
	for _, e := range s.ns.exports {
		ino := meta.RootIno
		if e.Path != "/" {
			for _, name := range splitPath(e.Path) {
				nd, err := s.meta.Lookup(ctx, ino, name)
				if errors.Is(err, meta.ErrNotFound) {
					nd, _, err = s.meta.Create(ctx, ino, name, meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, time.Time{})
				}
				if err != nil {
					return fmt.Errorf("server: export %s: %w", e.Path, err)
				}
				ino = nd.Ino
			}
		}
		e.root = ino
	}
	return nil
}

// Serve accepts connections on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.startOnce.Do(func() {
		s.pnfs.start()
		go s.st.run()
	})
	return s.rpc.Serve(ln)
}

// Close stops serving, flushes cached attributes and closes the stores.
func (s *Server) Close() error {
	s.endLife()
	err := s.rpc.Close()
	s.startOnce.Do(func() { close(s.st.done) }) // never started
	s.st.stop()
	if s.sweep != nil {
		s.sweep.wg.Wait() // stopped with life
	}
	s.copies.wait() // stopped with the state's context
	if ferr := s.cache.flushAll(context.Background()); err == nil {
		err = ferr
	}
	if s.data != nil && s.ownData {
		s.data.Close()
	}
	if s.meta != nil {
		if merr := s.meta.Close(); err == nil {
			err = merr
		}
	}
	return err
}

// serveRPC serves one call on the server's listener: the NFS program, and
// the programs internal/serverhook attached.
func (s *Server) serveRPC(ctx context.Context, call *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if call.Prog != nfs4.NFS4_PROGRAM {
		if h := s.cfg.programs[call.Prog]; h != nil {
			return h.ServeRPC(ctx, call, res)
		}
		return rpc.ProgUnavail
	}
	if call.Vers != nfs4.NFS_V4 {
		res.Uint32(nfs4.NFS_V4)
		res.Uint32(nfs4.NFS_V4)
		return rpc.ProgMismatch
	}
	switch call.Proc {
	case nfs4.NFSPROC4_NULL:
		return rpc.Success
	case nfs4.NFSPROC4_COMPOUND:
		return s.compoundRequest(ctx, call, res)
	}
	return rpc.ProcUnavail
}

// rpcHandler is the Server as the rpc.Handler of its listener. The
// dispatch is not API, and its signature names internal/rpc types, so it
// stays out of Server's method set.
type rpcHandler Server

func (h *rpcHandler) ServeRPC(ctx context.Context, call *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	return (*Server)(h).serveRPC(ctx, call, res)
}

var _ rpc.Handler = (*rpcHandler)(nil)

func init() {
	serverhook.SetPrograms = func(cfg any, progs map[uint32]rpc.Handler) {
		switch c := cfg.(type) {
		case *Config:
			c.programs = progs
		case *DataServerConfig:
			c.programs = progs
		default:
			panic(fmt.Sprintf("server: serverhook.SetPrograms on a %T, want *server.Config or *server.DataServerConfig", cfg))
		}
	}
}

// fillWriteVerf sets a write verifier unique to this start.
func fillWriteVerf(s *Server) {
	randRead(s.writeVerf[:])
	binary.BigEndian.PutUint32(s.writeVerf[:4], uint32(s.bootTime.Unix()))
}

var randRead = rand.Read

// Meta returns the server's metadata engine (for tools and tests).
func (s *Server) Meta() meta.Engine { return s.meta }
