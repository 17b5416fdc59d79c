// Package wiring is Shoal's production wiring: it assembles the pNFS roles
// exactly as the shoal binary runs them, a metadata server with its
// data-server registry, administration and striped backend, and data
// servers with their control agents. `shoal mds`, `shoal ds` and `shoal up`
// use it, and so do the tests and benchmarks that need a cluster, so a test
// never passes on a path the binary does not take.
//
// The seams it joins are small on purpose: the server package knows data
// servers only through server.DataServers and server.DataServerConfig, and
// the cluster package knows nothing of NFS. Both speak the cluster's
// errors (stateid verdicts, ErrUnavailable, ErrDataServerDown), which the
// server maps to NFS4ERR_* in its one error table.
package wiring

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/flexv3"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/serverhook"
	"github.com/shoalfs/shoal/internal/statuspage"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/server"
	"github.com/shoalfs/shoal/store"
)

// DefaultStripeUnit is the stripe unit: the Linux client's rsize and wsize
// are 1 MiB, so one RPC maps to exactly one data server.
const DefaultStripeUnit = 1 << 20

// JoinSecretName is the join secret's file name in the MDS's directory.
const JoinSecretName = "join-secret"

// registryRecordKey is where the registry's record lives in the metadata
// engine.
const registryRecordKey = "cluster/registry"

// metaRecord keeps the registry's record in the metadata engine, so it
// survives MDS restarts and moves with an etcd-backed MDS.
type metaRecord struct{ e meta.Engine }

func (r metaRecord) Load(ctx context.Context) ([]byte, error) {
	b, err := r.e.GetConfig(ctx, registryRecordKey)
	if errors.Is(err, meta.ErrNotFound) {
		return nil, nil
	}
	return b, err
}

func (r metaRecord) Save(ctx context.Context, b []byte) error {
	return r.e.PutConfig(ctx, registryRecordKey, b)
}

// checkMetaHasRegistry refuses metadata that holds files but no registry
// record: it was written by `shoal serve` (whose data is not on data
// servers) or by a Shoal before per-file stripe maps, and its files have
// no stripe maps. Serving it would read their data as zeros.
//
// Directories alone hold no data, and a fresh MDS whose exports are
// subtrees (/images, /nodes) has already created their roots when this
// runs, so a namespace of nothing but directories is accepted.
func checkMetaHasRegistry(e meta.Engine) error {
	ctx := context.Background()
	rec, err := metaRecord{e}.Load(ctx)
	if err != nil || rec != nil {
		return err
	}
	st, err := e.StatFS(ctx)
	if err != nil {
		return err
	}
	if st.Files <= 1 {
		return nil
	}
	onlyDirs, err := onlyDirectories(ctx, e, maxDirsWithoutRegistry)
	if err != nil {
		return fmt.Errorf("check metadata without a cluster record: %w", err)
	}
	if !onlyDirs {
		return fmt.Errorf("the metadata holds %d files but no cluster record: it was written by `shoal serve` or by a Shoal before per-file stripe maps, whose files this MDS cannot find on the data servers; copy the data into a new cluster with `shoal cp`", st.Files-1)
	}
	return nil
}

// maxDirsWithoutRegistry bounds the walk of onlyDirectories: a namespace
// without a cluster record that has more entries than this is refused
// even if they are all directories.
const maxDirsWithoutRegistry = 10000

// onlyDirectories reports whether every object under the root is a
// directory, looking at no more than limit entries (false past it).
func onlyDirectories(ctx context.Context, e meta.Engine, limit int) (bool, error) {
	queue := []meta.Ino{meta.RootIno}
	seen := 0
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		var cookie uint64
		for {
			ents, eof, err := e.ReadDir(ctx, dir, cookie, 256)
			if err != nil {
				return false, err
			}
			for _, en := range ents {
				if seen++; seen > limit || en.Attr.Type != meta.TypeDirectory {
					return false, nil
				}
				queue = append(queue, en.Ino)
				cookie = en.Cookie
			}
			if eof || len(ents) == 0 {
				break
			}
		}
	}
	return true, nil
}

// MDS is a running metadata server.
type MDS struct {
	Server   *server.Server
	Registry *cluster.Registry
	Striped  *cluster.Striped
	Admin    *cluster.Admin
	// FlexV3 is the loosely coupled NFSv3 data servers (MDSConfig.FlexV3),
	// or nil.
	FlexV3 *flexv3.DataServers
	// JoinSecretFile is the file data servers and `shoal admin` read the
	// join secret from.
	JoinSecretFile string
	Addr           net.Addr
	ln             net.Listener
	done           chan error
	status         *statusSource
	// elec is the term this MDS leads in; nil on bbolt.
	elec *election
	// ended is closed when the MDS stops serving: Close, a planned
	// step-down, or (on etcd) a lost term.
	ended chan struct{}
	// stopping is closed when stop begins (before the term is given up).
	stopping  chan struct{}
	closeOnce sync.Once
	closeErr  error
	metrics   *termMetrics
}

// MDSConfig configures StartMDS.
type MDSConfig struct {
	Listen string
	Dir    string
	// JoinSecretFile holds the cluster's join secret (created on first
	// start); default Dir/join-secret. Data servers and `shoal admin`
	// present it.
	JoinSecretFile string
	// DownAfter is how long a data server may be out of service before
	// I/O on its stripes fails (cluster.RegistryConfig.DownAfter).
	DownAfter time.Duration
	// Mirrors is the number of copies of each stripe unit for files in
	// directories without a policy of their own (`shoal admin policy`):
	// 1 (the default for 0) to 3.
	Mirrors int
	// HealRate bounds the bandwidth healing uses to copy stripes, in
	// bytes per second (cluster.AdminConfig.HealRate).
	HealRate int64
	// HealInterval is how often the healer scans every stripe map
	// (cluster.AdminConfig.HealInterval).
	HealInterval time.Duration
	// MetaURL selects the metadata engine (see server.Config.MetaURL):
	// "" for bbolt in Dir, or etcd://HOST:PORT[,HOST:PORT...]/PREFIX.
	MetaURL    string
	StripeUnit uint64
	Exports    []*server.Export
	Lease      time.Duration
	Logger     *slog.Logger
	// Metrics receives the server's Prometheus collector (role="mds").
	Metrics prometheus.Registerer
	// NoDelegations is server.Config.NoDelegations.
	NoDelegations bool
	// InlineMax is server.Config.InlineMax.
	InlineMax int
	// Async and CommitInterval are server.Config's: whether metadata
	// changes are answered before they are durable (sync: false), and
	// how long they wait for durability then.
	Async          bool
	CommitInterval time.Duration
	// Advertise is the address this MDS is reached at, as the election
	// (and so `shoal admin status`) names it; default Listen, which may
	// be 0.0.0.0:PORT.
	Advertise string
	// Node names this MDS in the election of MDS nodes sharing an etcd
	// prefix (default: the host name); the service-address supervisor
	// on the same host matches it.
	Node string
	// LeaderLease is the election lease (leader.DefaultTTL if zero): a
	// leader that dies is replaced after at most this long.
	LeaderLease time.Duration
	// Events, if set, records the MDS's events (the status page's)
	// across terms; RunMDS keeps one.
	Events *statuspage.EventLog
	// FlexV3, if set, makes the MDS's pNFS data servers the loosely
	// coupled NFSv3 servers it names (docs/flexfiles.md): flexfiles
	// exports hand out layouts on them, and I/O through the MDS goes to
	// their data files. Inline data is off then (InlineMax -1).
	FlexV3 *flexv3.Config
}

// dataServers adapts the registry and striping to server.DataServers.
type dataServers struct {
	reg     *cluster.Registry
	striped *cluster.Striped
}

var (
	_ store.ObjectLister  = lazyBackend{}
	_ server.DataServers  = (*dataServers)(nil)
	_ server.FlexLayouter = (*dataServers)(nil)
	_ server.CopyFailer   = (*dataServers)(nil)
)

// FlexLayout hands out flexfiles layouts (cluster.Striped.FlexLayout).
func (d *dataServers) FlexLayout(ctx context.Context, ino uint64, width int, write bool) (pnfs.FlexLayout, error) {
	return d.striped.FlexLayout(ctx, ino, width, write)
}

// CopyFailed marks a copy a flexfiles client reports failing stale
// (cluster.Striped.CopyFailed).
func (d *dataServers) CopyFailed(ctx context.Context, ino uint64, device [16]byte) (string, bool, error) {
	return d.striped.CopyFailed(ctx, ino, device)
}

func (d *dataServers) Layout(ctx context.Context, ino uint64) (pnfs.FileLayout, error) {
	return d.striped.Layout(ctx, ino)
}
func (d *dataServers) Device(id [16]byte) ([][]string, bool) { return d.striped.Device(id) }
func (d *dataServers) Devices() [][16]byte                   { return d.striped.Devices() }
func (d *dataServers) StripeUnit() uint64                    { return d.striped.StripeUnit() }
func (d *dataServers) Shares(ctx context.Context, ino uint64, id [16]byte, off, length uint64) (map[string]uint64, bool) {
	return d.striped.Shares(ctx, ino, id, off, length)
}

func (d *dataServers) Fence(ctx context.Context, id uint64) error   { return d.reg.Fence(ctx, id) }
func (d *dataServers) Unfence(ctx context.Context, id uint64) error { return d.reg.Unfence(ctx, id) }

// OnChange runs fn when a data server joins or leaves service, when
// layouts naming it must be fetched again. A change of state (drain,
// remove) moves no data by itself: each file that moves has its own
// layouts recalled (HoldLayouts).
func (d *dataServers) OnChange(fn func(left bool)) func() {
	return d.reg.Subscribe(func(ev cluster.Event) {
		if ev.Kind == cluster.Joined || ev.Kind == cluster.Left {
			fn(ev.Kind == cluster.Left)
		}
	})
}

// lazyBackend is the striped backend, reached through the adapter that is
// completed after the server is built.
type lazyBackend struct{ d *dataServers }

var (
	_ store.Backend   = lazyBackend{}
	_ store.Copier    = lazyBackend{}
	_ store.MapPlaced = lazyBackend{}
)

func (b lazyBackend) Open(ino uint64, create bool) (store.File, error) {
	return b.d.striped.Open(ino, create)
}
func (b lazyBackend) Remove(ino uint64) error             { return b.d.striped.Remove(ino) }
func (b lazyBackend) Truncate(ino uint64, n uint64) error { return b.d.striped.Truncate(ino, n) }
func (b lazyBackend) Sync(ino uint64) error               { return b.d.striped.Sync(ino) }
func (b lazyBackend) StatFS() (uint64, uint64, uint64, error) {
	return b.d.striped.StatFS()
}
func (b lazyBackend) Close() error { return b.d.striped.Close() }

// serverSweep is the server's sweep of unowned data objects as the
// cluster's administration runs it.
type serverSweep struct{ s *server.Server }

var _ cluster.Sweeper = serverSweep{}

func (w serverSweep) StartSweep() bool { return w.s.StartSweep() }

func (w serverSweep) SweepState() cluster.SweepState {
	st := cluster.SweepState{Running: w.s.Sweeping()}
	if rep, ok := w.s.LastSweep(); ok {
		st.Last, _ = json.Marshal(rep)
	}
	return st
}

// ListObjects and RemoveObject are the sweep's (store.ObjectLister).
func (b lazyBackend) ListObjects(ctx context.Context, fn func(place string, inos []uint64) error) error {
	return b.d.striped.ListObjects(ctx, fn)
}

func (b lazyBackend) RemoveObject(ctx context.Context, place string, ino uint64) error {
	return b.d.striped.RemoveObject(ctx, place, ino)
}

// PlacedByMap forwards the striped backend's (store.MapPlaced); false
// until there is one.
func (b lazyBackend) PlacedByMap() bool { return b.d.striped != nil && b.d.striped.PlacedByMap() }

// CopyRange lets the data servers copy for COPY and CLONE (store.Copier).
func (b lazyBackend) CopyRange(src, dst uint64, srcOff, dstOff, n int64) error {
	return b.d.striped.CopyRange(src, dst, srcOff, dstOff, n)
}

// StartMDS starts a pNFS metadata server; data servers register with it on
// the same address (the control protocol shares the NFS listener). On
// etcd it first wins the election of the MDS nodes sharing the prefix,
// waiting as a standby for as long as another leads (StartMDSContext
// bounds the wait).
func StartMDS(cfg MDSConfig) (*MDS, error) {
	return StartMDSContext(context.Background(), cfg)
}

// StartMDSContext is StartMDS with a context that bounds the wait for
// leadership.
func StartMDSContext(ctx context.Context, cfg MDSConfig) (*MDS, error) {
	if cfg.StripeUnit == 0 {
		cfg.StripeUnit = DefaultStripeUnit
	}
	if cfg.Mirrors < 0 || cfg.Mirrors > meta.MaxMirrors {
		return nil, fmt.Errorf("mirrors %d: want 1 to %d", cfg.Mirrors, meta.MaxMirrors)
	}
	if cfg.StripeUnit%64 != 0 {
		return nil, fmt.Errorf("stripe unit %d is not a multiple of 64 bytes", cfg.StripeUnit)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &MDS{done: make(chan error, 1), ended: make(chan struct{}), stopping: make(chan struct{})}
	// The status page's recent events: the server reports recalls,
	// fencing and purged clients as they happen, the registry its data
	// servers' comings and goings (newStatusSource).
	events := cfg.Events
	if events == nil {
		events = statuspage.NewEventLog(statuspage.DefaultEvents)
	}
	// On etcd, only the elected leader goes on; a standby waits here.
	var eng meta.Engine
	var leading func() error
	if isEtcd(cfg.MetaURL) {
		var err error
		m.elec, eng, err = campaign(ctx, &cfg, events)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errCampaign, err)
		}
		if !unsafeNoFencing() {
			leading = m.elec.term.Check
		}
	}
	fail := func(err error) (*MDS, error) {
		if m.metrics != nil {
			m.metrics.unregisterAll()
		}
		if m.elec != nil {
			m.elec.end(true)
		}
		return nil, err
	}
	if cfg.Metrics != nil {
		m.metrics = &termMetrics{Registerer: cfg.Metrics}
		cfg.Metrics = m.metrics
	}
	// The server owns the cluster secret (it lives in its metadata store),
	// and the registry needs it; the server also needs the registry. So
	// the server is built with an adapter whose fields are filled in
	// before it serves anything.
	ds := &dataServers{}
	pnfsCfg := &server.PNFSConfig{DataServers: ds, Backend: lazyBackend{ds}}
	if cfg.FlexV3 != nil {
		v3 := *cfg.FlexV3
		if v3.Logger == nil {
			v3.Logger = cfg.Logger.With("role", "mds")
		}
		st, err := flexv3.New(v3)
		if err != nil {
			return fail(err)
		}
		m.FlexV3 = flexv3.NewDataServers(st, cfg.StripeUnit)
		pnfsCfg = &server.PNFSConfig{DataServers: m.FlexV3, Backend: st}
		cfg.InlineMax = -1
	}
	scfg := server.Config{
		Dir:     cfg.Dir,
		MetaURL: cfg.MetaURL,
		Meta:    eng,
		Leading: leading,
		Exports: cfg.Exports,
		Lease:   cfg.Lease,
		Logger:  cfg.Logger.With("role", "mds"),
		Metrics: cfg.Metrics, MetricLabels: prometheus.Labels{"role": "mds", "instance": "mds"},
		PNFS:           pnfsCfg,
		NoDelegations:  cfg.NoDelegations,
		InlineMax:      cfg.InlineMax,
		Async:          cfg.Async,
		CommitInterval: cfg.CommitInterval,
		OnEvent:        func(ev server.Event) { events.Add(serverEvent(ev)) },
	}
	serverhook.SetPrograms(&scfg, map[uint32]rpc.Handler{ctlproto.SHOAL_CONTROL: rpc.HandlerFunc(
		func(ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
			return m.Registry.Handler().ServeRPC(ctx, c, res)
		})})
	srv, err := server.New(scfg)
	if err != nil {
		if eng != nil {
			eng.Close()
		}
		return fail(err)
	}
	secretFile := cfg.JoinSecretFile
	if secretFile == "" {
		secretFile = filepath.Join(cfg.Dir, JoinSecretName)
	}
	joinSecret, err := joinSecret(srv.Meta(), secretFile)
	if err != nil {
		srv.Close()
		return fail(err)
	}
	m.JoinSecretFile = secretFile
	if err := checkMetaHasRegistry(srv.Meta()); err != nil {
		srv.Close()
		return fail(err)
	}
	m.Registry, err = cluster.NewRegistry(context.Background(), cluster.RegistryConfig{
		DataKey:      srv.DataFHKey(),
		JoinSecret:   joinSecret,
		Store:        metaRecord{srv.Meta()},
		DownAfter:    cfg.DownAfter,
		CheckStateid: srv.CheckDataIO,
		FileSize:     srv.FileSize,
		Lease:        cfg.Lease,
		Leader:       leaderOf(m.elec),
		Logger:       cfg.Logger.With("role", "registry"),
	})
	if err != nil {
		srv.Close()
		return fail(err)
	}
	m.Striped = cluster.NewStriped(m.Registry, srv.Meta(), cfg.StripeUnit)
	// Replicated stripes: a file gets its copies from its own policy
	// (copied from its directory when it was created), else the cluster
	// default; a map that changes recalls the file's layouts; data
	// servers ask for maps (MAP) and report unreachable peers
	// (REPLICA_FAILED).
	policies := policyStore{eng: srv.Meta(), def: max(cfg.Mirrors, 1)}
	m.Striped.SetDefaultMirrors(policies.def)
	m.Striped.SetMirrors(policies.mirrorsOf)
	m.Striped.SetRecall(srv.RecallLayouts)
	m.Striped.SetHold(srv.HoldLayouts)
	m.Registry.SetMaps(m.Striped)
	ds.reg, ds.striped = m.Registry, m.Striped
	var ha cluster.HA
	if m.elec != nil {
		ha = m.elec
	}
	m.Admin = cluster.NewAdmin(cluster.AdminConfig{
		Registry: m.Registry, Striped: m.Striped, Hold: srv.HoldLayouts, FileSize: srv.FileSize,
		Policy: policies, HealRate: cfg.HealRate, HealInterval: cfg.HealInterval, HA: ha, Sweep: serverSweep{srv},
		Logger: cfg.Logger.With("role", "admin"), FenceFile: m.fenceFile(policies),
	})
	m.Registry.SetAdmin(m.Admin)
	m.status = newStatusSource(m, events)
	m.Striped.SetOnStale(func(uint64) { m.Admin.Kick() })
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(cluster.NewCollector(m.Admin)); err != nil {
			m.Admin.Close()
			m.Registry.Close()
			srv.Close()
			return fail(fmt.Errorf("metrics: %w", err))
		}
	}
	m.Server = srv
	if err := m.startFlexV3(cfg, srv); err != nil {
		m.Admin.Close()
		m.Registry.Close()
		srv.Close()
		return fail(err)
	}
	m.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		srv.Close()
		m.Registry.Close()
		return fail(fmt.Errorf("listen on %s: %w", cfg.Listen, err))
	}
	m.Addr = m.ln.Addr()
	events.Add(statuspage.Event{Kind: "mds started", Subject: m.Addr.String(), Detail: fmt.Sprintf("%d data servers known", len(m.Registry.DataServers()))})
	go func() { m.done <- srv.Serve(m.ln) }()
	if e := m.elec; e != nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := e.serving(pctx); err != nil {
			e.log.Warn("telling the election this MDS serves (the service address waits for it)", "err", err)
		}
		cancel()
		e.stepDown = func() {
			haCounters.stepDowns.Add(1)
			e.log.Info("stepping down: a standby takes over", "term", e.term.Number())
			events.Add(statuspage.Event{Kind: "mds stepped down", Subject: m.Addr.String(), Detail: fmt.Sprintf("term %d, planned", e.term.Number())})
			// The replies of what is running go out first: the next
			// leader has no reply cache of this one's.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := m.Server.Quiesce(ctx); err != nil {
				e.log.Warn("stepping down before every reply went out", "err", err)
			}
			cancel()
			m.stop(true)
		}
		go func() {
			select {
			case <-e.term.Lost():
				if unsafeNoFencing() {
					e.log.Error("leadership lost, and going on serving: fencing is off (" + UnsafeNoFencingEnv + ")")
					return
				}
				select {
				case <-m.stopping:
					return // a resignation, not a loss
				default:
				}
				haCounters.lost.Add(1)
				e.log.Error("leadership lost: stopping at once", "term", e.term.Number(), "err", e.term.Check())
				events.Add(statuspage.Event{Kind: "mds lost leadership", Subject: m.Addr.String(), Detail: fmt.Sprintf("term %d: %v", e.term.Number(), e.term.Check())})
				m.stop(false)
			case <-m.stopping:
			}
		}()
	}
	return m, nil
}

// Done is closed when the MDS has stopped serving: Close, a planned
// step-down, or a lost term.
func (m *MDS) Done() <-chan struct{} { return m.ended }

// Term is the election term this MDS leads in (0 on bbolt).
func (m *MDS) Term() uint64 {
	if m.elec == nil {
		return 0
	}
	return m.elec.term.Number()
}

// FencedTransactions counts the metadata transactions this MDS's fence
// refused (it had stopped leading).
func (m *MDS) FencedTransactions() uint64 {
	if m.elec == nil {
		return 0
	}
	return m.elec.fenced.Load()
}

// StepDown stops serving and resigns, so that a standby takes over at
// once (`shoal admin step-down`). It returns at once; Done tells when it
// is over.
func (m *MDS) StepDown() error {
	if m.elec == nil {
		return errors.New("this MDS is not elected (its metadata is not on etcd)")
	}
	return m.elec.StepDown()
}

// Close stops the metadata server and its registry; an elected one
// resigns, so a standby takes over without waiting for the lease.
func (m *MDS) Close() error {
	if m.elec != nil {
		// A standby takes over at once: let the running requests'
		// replies out first, as a step-down does.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = m.Server.Quiesce(ctx)
		cancel()
	}
	m.stop(true)
	return m.closeErr
}

// stop ends serving once: resign says whether the term is handed over
// at once (a clean stop) or left to expire (it was lost).
func (m *MDS) stop(resign bool) {
	m.closeOnce.Do(func() {
		close(m.stopping)
		m.Admin.Close()
		m.closeErr = m.Server.Close()
		m.Registry.Close()
		if m.metrics != nil {
			m.metrics.unregisterAll()
		}
		if m.elec != nil {
			m.elec.end(resign)
		}
		close(m.ended)
	})
}

// DS is a running data server.
type DS struct {
	Server *server.Server
	Agent  *cluster.Agent
	Addr   net.Addr
	Store  *store.Local
	ln     net.Listener
}

// DSConfig configures StartDS.
type DSConfig struct {
	Listen string
	Dir    string
	// MDS lists the metadata servers' addresses: one, or all of those
	// that take turns leading (cluster.AgentConfig.MDS).
	MDS []string
	// JoinSecret is the cluster's join secret (the MDS's join-secret
	// file).
	JoinSecret []byte
	// Advertise is the host:port clients use to reach this data server
	// (for example 10.0.2.2:PORT from a qemu guest); default: the listen
	// address.
	Advertise string
	// PeerAdvertise is the host:port the other data servers use to reach
	// this one (replicated writes); default: the listen address when it
	// names a host, else Advertise. A qemu guest's 10.0.2.2 is not an
	// address the host's data servers can reach.
	PeerAdvertise string
	Lease         time.Duration
	Logger        *slog.Logger
	// Metrics receives the data server's collector (role="ds",
	// instance=its stripe index).
	Metrics prometheus.Registerer
}

// StartDS starts a data server and registers it with its metadata server.
func StartDS(ctx context.Context, cfg DSConfig) (*DS, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	d := &DS{}
	var err error
	// Block checksums: a data server never returns bytes that do not
	// match what was written (store.ErrCorrupt sends the client to the
	// MDS, which reads another copy).
	if d.Store, err = store.NewLocal(cfg.Dir, store.LocalOptions{Checksums: true}); err != nil {
		return nil, err
	}
	// The identity exists before the port accepts anything, so whoever
	// sees the port open finds the data server's ID in its directory.
	ident, err := loadIdentity(cfg.Dir)
	if err != nil {
		d.Store.Close()
		return nil, err
	}
	if d.ln, err = listenStable(cfg.Listen, cfg.Dir); err != nil {
		d.Store.Close()
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	d.Addr = d.ln.Addr()
	adv := cfg.Advertise
	if adv == "" {
		adv = d.Addr.String()
	} else if host, port, err := net.SplitHostPort(adv); err == nil && port == "0" {
		adv = net.JoinHostPort(host, strconv.Itoa(d.Addr.(*net.TCPAddr).Port))
	}
	peer := cfg.PeerAdvertise
	if tcp, ok := d.Addr.(*net.TCPAddr); peer == "" && ok && !tcp.IP.IsUnspecified() {
		peer = d.Addr.String()
	}
	var peerAddrs []string
	if peer != "" && peer != adv {
		peerAddrs = []string{peer}
	}
	d.Agent, err = cluster.StartAgent(ctx, cluster.AgentConfig{
		MDS: cfg.MDS, ID: ident.ID, ClusterID: ident.cluster(), Addrs: []string{adv}, PeerAddrs: peerAddrs, Store: d.Store,
		JoinSecret: cfg.JoinSecret, Lease: cfg.Lease,
		Logger: cfg.Logger.With("role", "ds-agent"),
	})
	if err != nil {
		d.ln.Close()
		d.Store.Close()
		mds := strings.Join(cfg.MDS, ",")
		if errors.Is(err, cluster.ErrWrongCluster) {
			return nil, fmt.Errorf("data directory %s belongs to cluster %s, not to the cluster of MDS %s: use an empty directory: %w",
				cfg.Dir, ident.ClusterID, mds, err)
		}
		if errors.Is(err, cluster.ErrAuth) {
			return nil, fmt.Errorf("MDS %s refused the join secret (--join-secret-file must be the MDS's %s): %w", mds, JoinSecretName, err)
		}
		return nil, fmt.Errorf("register with MDS %s: %w", mds, err)
	}
	ident.ClusterID = fmt.Sprintf("%x", d.Agent.ClusterID())
	if err := saveIdentity(cfg.Dir, ident); err != nil {
		d.Agent.Close()
		d.ln.Close()
		d.Store.Close()
		return nil, err
	}
	// Clients' writes go through a ReplicaStore, which hands each unit to
	// the other copies of its stripe (REPLICA_WRITE to the peers, served
	// on this same listener); the MDS's object calls reach d.Store
	// directly through the agent.
	dcfg := server.DataServerConfig{
		Dir:     cfg.Dir,
		Lease:   cfg.Lease,
		Logger:  cfg.Logger.With("role", "ds", "id", ident.ID),
		Metrics: cfg.Metrics, MetricLabels: prometheus.Labels{"role": "ds", "instance": ident.ID},
		Secret:       d.Agent.DataKey,
		CheckStateid: d.Agent.CheckStateid,
		FileSize:     d.Agent.FileSize,
		Store:        cluster.NewReplicaStore(d.Agent, d.Store),
	}
	serverhook.SetPrograms(&dcfg, map[uint32]rpc.Handler{ctlproto.SHOAL_CONTROL: d.Agent.PeerHandler()})
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(cluster.NewAgentCollector(d.Agent, dcfg.MetricLabels)); err != nil {
			d.Agent.Close()
			d.ln.Close()
			return nil, fmt.Errorf("data server metrics: %w", err)
		}
	}
	d.Server, err = server.NewDataServer(dcfg)
	if err != nil {
		d.Agent.Close()
		d.ln.Close()
		return nil, err
	}
	go d.Server.Serve(d.ln)
	return d, nil
}

// Close stops the data server.
func (d *DS) Close() error {
	err := d.Server.Close()
	d.Agent.Close()
	d.Store.Close()
	return err
}

// identity is a data server's persistent identity, kept in its directory
// (identityName): stripe maps name the data server by ID, and ClusterID
// binds the directory to the cluster it joined.
type identity struct {
	ID        string `json:"id"`
	ClusterID string `json:"cluster_id,omitempty"` // hex; empty until the first registration
}

const identityName = "ds-identity.json"

func (i identity) cluster() []byte {
	b, _ := hex.DecodeString(i.ClusterID)
	return b
}

// loadIdentity reads dir's identity, making a new one for a new directory.
func loadIdentity(dir string) (identity, error) {
	path := filepath.Join(dir, identityName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		var r [8]byte
		if _, err := rand.Read(r[:]); err != nil {
			return identity{}, err
		}
		id := identity{ID: fmt.Sprintf("ds-%x", r)}
		return id, saveIdentity(dir, id)
	}
	if err != nil {
		return identity{}, fmt.Errorf("data server identity: %w", err)
	}
	var id identity
	if err := json.Unmarshal(b, &id); err != nil || id.ID == "" {
		return identity{}, fmt.Errorf("data server identity %s is damaged: %v", path, err)
	}
	if _, err := hex.DecodeString(id.ClusterID); err != nil {
		return identity{}, fmt.Errorf("data server identity %s: bad cluster id %q", path, id.ClusterID)
	}
	return id, nil
}

// saveIdentity writes dir's identity atomically and durably.
func saveIdentity(dir string, id identity) error {
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, identityName)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("data server identity: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("data server identity: %w", err)
	}
	return nil
}

// Cluster is an MDS and N data servers in one process (`shoal up`).
type Cluster struct {
	MDS       *MDS
	DS        []*DS
	mu        sync.Mutex
	fallbacks []*store.Local
}

// Config configures Start.
type Config struct {
	Dir         string
	DataServers int
	// MetaURL selects the MDS's metadata engine (see MDSConfig.MetaURL).
	MetaURL string
	// Listen is the MDS address; data servers listen on the same host with
	// ports chosen by the kernel.
	Listen string
	// AdvertiseHost is the host clients use to reach the data servers
	// (default: the listen host).
	AdvertiseHost string
	StripeUnit    uint64
	Exports       []*server.Export
	Lease         time.Duration
	// DownAfter is MDSConfig.DownAfter.
	DownAfter time.Duration
	// Mirrors is MDSConfig.Mirrors.
	Mirrors int
	Logger  *slog.Logger
	Metrics prometheus.Registerer
	// NoDelegations is server.Config.NoDelegations for the MDS.
	NoDelegations bool
	// InlineMax is server.Config.InlineMax for the MDS.
	InlineMax int
	// HealInterval is MDSConfig.HealInterval.
	HealInterval time.Duration
	// Async and CommitInterval are MDSConfig's.
	Async          bool
	CommitInterval time.Duration
	// FlexV3 is MDSConfig.FlexV3.
	FlexV3 *flexv3.Config
}

// Start brings up a local cluster and waits until every data server is in
// service.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.DataServers < 1 && cfg.FlexV3 == nil {
		return nil, errors.New("a cluster needs at least one data server (or NFSv3 ones, FlexV3)")
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("bad listen address %q: %w", cfg.Listen, err)
	}
	mds, err := StartMDS(MDSConfig{
		Listen: cfg.Listen, Dir: filepath.Join(cfg.Dir, "mds"), MetaURL: cfg.MetaURL, StripeUnit: cfg.StripeUnit,
		Exports: cfg.Exports, Lease: cfg.Lease, DownAfter: cfg.DownAfter, Mirrors: cfg.Mirrors, Logger: cfg.Logger, Metrics: cfg.Metrics,
		NoDelegations: cfg.NoDelegations, InlineMax: cfg.InlineMax, Async: cfg.Async, CommitInterval: cfg.CommitInterval,
		HealInterval: cfg.HealInterval, FlexV3: cfg.FlexV3,
	})
	if err != nil {
		return nil, err
	}
	c := &Cluster{MDS: mds}
	joinSecret, err := cluster.ReadJoinSecret(mds.JoinSecretFile)
	if err != nil {
		mds.Close()
		return nil, err
	}
	adv := cfg.AdvertiseHost
	if adv == "" {
		adv = host
	}
	for i := range cfg.DataServers {
		d, err := StartDS(ctx, DSConfig{
			Listen:     net.JoinHostPort(host, "0"),
			Dir:        filepath.Join(cfg.Dir, fmt.Sprintf("ds%d", i)),
			MDS:        []string{mds.Addr.String()},
			JoinSecret: joinSecret,
			Advertise:  net.JoinHostPort(adv, "0"),
			Lease:      cfg.Lease,
			Logger:     cfg.Logger,
			Metrics:    cfg.Metrics,
		})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("data server %d: %w", i, err)
		}
		c.DS = append(c.DS, d)
		// All data servers of a local cluster share this machine's disks,
		// so the MDS can still read a data server's stripe units after the
		// data server died (cluster.Striped.SetFallback).
		// It reads through the same block checksums as the data server
		// (and must not open the directory without them: that would
		// switch the directory's checksums off).
		fb, err := store.NewLocal(filepath.Join(cfg.Dir, fmt.Sprintf("ds%d", i)), store.LocalOptions{MaxOpen: 64, Checksums: true})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.fallbacks = append(c.fallbacks, fb)
		mds.Striped.SetFallback(d.Agent.ID(), fb)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := mds.Registry.WaitFor(wctx, cfg.DataServers); err != nil {
		c.Close()
		return nil, fmt.Errorf("waiting for data servers: %w", err)
	}
	return c, nil
}

// Close shuts the cluster down: data servers first, then the MDS.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first error
	for _, d := range c.DS {
		if d != nil {
			if err := d.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	if err := c.MDS.Close(); err != nil && first == nil {
		first = err
	}
	for _, fb := range c.fallbacks {
		fb.Close()
	}
	return first
}

// listenStable listens on addr. When addr asks for any port (":0"), it
// first tries the port this data server had last time (saved in dir): the
// address is in clients' cached device info, and after a restart a client
// with I/O in flight keeps retrying that address rather than fetching the
// device again.
func listenStable(addr, dir string) (net.Listener, error) {
	portFile := filepath.Join(dir, "ds-port")
	if host, port, err := net.SplitHostPort(addr); err == nil && port == "0" {
		if b, err := os.ReadFile(portFile); err == nil {
			if ln, err := net.Listen("tcp", net.JoinHostPort(host, strings.TrimSpace(string(b)))); err == nil {
				return ln, nil
			}
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = os.WriteFile(portFile, []byte(strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), 0o600)
	return ln, nil
}
