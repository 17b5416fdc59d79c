// Package localcluster assembles Shoal's pNFS roles: a metadata server with
// its data-server registry, and data servers with their control agents. The
// `shoal mds`, `shoal ds` and `shoal up` commands, tests and benchmarks use
// it, so every one of them runs the same wiring.
//
// The seams it joins are small on purpose: the server package knows data
// servers only through server.DataServers and server.DataServerConfig, and
// the cluster package knows nothing of NFS. The error translation between
// the two (stateid verdicts) lives here, in one place.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/cluster"
	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
	"github.com/shoalfs/shoal/server/state"
	"github.com/shoalfs/shoal/store"
)

// DefaultStripeUnit is the stripe unit: the Linux client's rsize and wsize
// are 1 MiB, so one RPC maps to exactly one data server.
const DefaultStripeUnit = 1 << 20

// MDS is a running metadata server.
type MDS struct {
	Server   *server.Server
	Registry *cluster.Registry
	Striped  *cluster.Striped
	Addr     net.Addr
	ln       net.Listener
	done     chan error
}

// MDSConfig configures StartMDS.
type MDSConfig struct {
	Listen string
	Dir    string
	// MetaURL selects the metadata engine (see server.Config.MetaURL):
	// "" for bbolt in Dir, or etcd://HOST:PORT[,HOST:PORT...]/PREFIX.
	MetaURL    string
	StripeUnit uint64
	Exports    []*server.Export
	Lease      time.Duration
	Logger     *slog.Logger
	// Metrics receives the server's Prometheus collector (role="mds").
	Metrics prometheus.Registerer
}

// dataServers adapts the registry and striping to server.DataServers.
type dataServers struct {
	reg     *cluster.Registry
	striped *cluster.Striped
}

var _ server.DataServers = (*dataServers)(nil)

func (d *dataServers) Devices() (uint64, [][]string) {
	members := d.reg.Members()
	addrs := make([][]string, len(members))
	for i, m := range members {
		addrs[i] = m.Addrs
	}
	return d.reg.Generation(), addrs
}

func (d *dataServers) Layout(ino uint64) (uint32, uint64, uint32) {
	first, unit, n := d.striped.Layout(ino)
	return uint32(first), unit, uint32(n)
}

func (d *dataServers) Fence(ctx context.Context, id uint64) error   { return d.reg.Fence(ctx, id) }
func (d *dataServers) Unfence(ctx context.Context, id uint64) error { return d.reg.Unfence(ctx, id) }
func (d *dataServers) OnChange(fn func()) func() {
	return d.reg.Subscribe(func(cluster.Event) { fn() })
}

// lazyBackend is the striped backend, reached through the adapter that is
// completed after the server is built.
type lazyBackend struct{ d *dataServers }

var _ store.Backend = lazyBackend{}

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

// toCluster translates the metadata server's stateid verdicts for the
// control protocol.
func toCluster(err error) error {
	for _, m := range []struct{ from, to error }{
		{server.ErrFenced, cluster.ErrFenced},
		{state.ErrBadStateid, cluster.ErrBadStateid},
		{state.ErrOldStateid, cluster.ErrOldStateid},
		{state.ErrStaleStateid, cluster.ErrStaleStateid},
		{state.ErrExpired, cluster.ErrExpired},
		{state.ErrOpenMode, cluster.ErrOpenMode},
		{state.ErrLocked, cluster.ErrOpenMode},
	} {
		if errors.Is(err, m.from) {
			return fmt.Errorf("%w: %v", m.to, err)
		}
	}
	return err
}

// fromCluster translates the control protocol's verdicts for the data
// server's NFS code.
func fromCluster(err error) error {
	for _, m := range []struct{ from, to error }{
		{cluster.ErrFenced, server.ErrFenced},
		{cluster.ErrBadStateid, state.ErrBadStateid},
		{cluster.ErrOldStateid, state.ErrOldStateid},
		{cluster.ErrStaleStateid, state.ErrStaleStateid},
		{cluster.ErrExpired, state.ErrExpired},
		{cluster.ErrOpenMode, state.ErrOpenMode},
	} {
		if errors.Is(err, m.from) {
			return fmt.Errorf("%w: %v", m.to, err)
		}
	}
	return err
}

// StartMDS starts a pNFS metadata server; data servers register with it on
// the same address (the control protocol shares the NFS listener).
func StartMDS(cfg MDSConfig) (*MDS, error) {
	if cfg.StripeUnit == 0 {
		cfg.StripeUnit = DefaultStripeUnit
	}
	if cfg.StripeUnit%64 != 0 {
		return nil, fmt.Errorf("stripe unit %d is not a multiple of 64 bytes", cfg.StripeUnit)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &MDS{done: make(chan error, 1)}
	// The server owns the cluster secret (it lives in its metadata store),
	// and the registry needs it; the server also needs the registry. So
	// the server is built with an adapter whose fields are filled in
	// before it serves anything.
	ds := &dataServers{}
	srv, err := server.New(server.Config{
		Dir:     cfg.Dir,
		MetaURL: cfg.MetaURL,
		Exports: cfg.Exports,
		Lease:   cfg.Lease,
		Logger:  cfg.Logger.With("role", "mds"),
		Metrics: cfg.Metrics, MetricLabels: prometheus.Labels{"role": "mds", "instance": "mds"},
		PNFS: &server.PNFSConfig{DataServers: ds, Backend: lazyBackend{ds}},
		Programs: map[uint32]rpc.Handler{ctlproto.SHOAL_CONTROL: rpc.HandlerFunc(
			func(ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
				return m.Registry.Handler().ServeRPC(ctx, c, res)
			})},
	})
	if err != nil {
		return nil, err
	}
	m.Registry = cluster.NewRegistry(cluster.RegistryConfig{
		Secret: srv.ClusterSecret(),
		CheckStateid: func(ctx context.Context, ino uint64, sid [16]byte, write bool) (uint64, error) {
			id, err := srv.CheckDataIO(ctx, ino, sid, write)
			return id, toCluster(err)
		},
		Logger: cfg.Logger.With("role", "registry"),
	})
	m.Striped = cluster.NewStriped(m.Registry, cfg.StripeUnit)
	ds.reg, ds.striped = m.Registry, m.Striped
	m.Server = srv
	m.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		srv.Close()
		m.Registry.Close()
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	m.Addr = m.ln.Addr()
	go func() { m.done <- srv.Serve(m.ln) }()
	return m, nil
}

// Close stops the metadata server and its registry.
func (m *MDS) Close() error {
	err := m.Server.Close()
	m.Registry.Close()
	return err
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
	MDS    string
	// Advertise is the host:port clients use to reach this data server
	// (for example 10.0.2.2:PORT from a qemu guest); default: the listen
	// address.
	Advertise string
	Lease     time.Duration
	Logger    *slog.Logger
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
	if d.Store, err = store.NewLocal(cfg.Dir, store.LocalOptions{}); err != nil {
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
	id, index, hasIndex := loadIdentity(cfg.Dir)
	d.Agent, err = cluster.StartAgent(ctx, cluster.AgentConfig{
		MDS: cfg.MDS, ID: id, Addrs: []string{adv}, Store: d.Store,
		Index: index, HasIndex: hasIndex,
		Logger: cfg.Logger.With("role", "ds-agent"),
	})
	if err != nil {
		d.ln.Close()
		d.Store.Close()
		return nil, fmt.Errorf("register with MDS %s: %w", cfg.MDS, err)
	}
	saveIdentity(cfg.Dir, id, d.Agent.Index())
	d.Server, err = server.NewDataServer(server.Config{
		Dir:     cfg.Dir,
		Lease:   cfg.Lease,
		Logger:  cfg.Logger.With("role", "ds", "index", d.Agent.Index()),
		Metrics: cfg.Metrics, MetricLabels: prometheus.Labels{"role": "ds", "instance": strconv.Itoa(d.Agent.Index())},
	}, server.DataServerConfig{
		Secret: d.Agent.Secret,
		CheckStateid: func(ctx context.Context, ino uint64, sid [16]byte, write bool) error {
			return fromCluster(d.Agent.CheckStateid(ctx, ino, sid, write))
		},
		Store: d.Store,
	})
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

// identity persists a data server's id and stripe index in its directory,
// so it keeps its place in every file's striping across restarts.
func loadIdentity(dir string) (id string, index int, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, "ds-identity"))
	if err == nil {
		var idx int
		if _, err := fmt.Sscanf(string(b), "%s %d", &id, &idx); err == nil {
			return id, idx, true
		}
	}
	return fmt.Sprintf("ds-%d-%d", os.Getpid(), time.Now().UnixNano()), 0, false
}

func saveIdentity(dir, id string, index int) {
	_ = os.WriteFile(filepath.Join(dir, "ds-identity"), []byte(fmt.Sprintf("%s %d\n", id, index)), 0o600)
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
	Logger        *slog.Logger
	Metrics       prometheus.Registerer
}

// Start brings up a local cluster and waits until every data server is in
// service.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.DataServers < 1 {
		return nil, errors.New("a cluster needs at least one data server")
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("bad listen address %q: %w", cfg.Listen, err)
	}
	mds, err := StartMDS(MDSConfig{
		Listen: cfg.Listen, Dir: filepath.Join(cfg.Dir, "mds"), MetaURL: cfg.MetaURL, StripeUnit: cfg.StripeUnit,
		Exports: cfg.Exports, Lease: cfg.Lease, Logger: cfg.Logger, Metrics: cfg.Metrics,
	})
	if err != nil {
		return nil, err
	}
	c := &Cluster{MDS: mds}
	adv := cfg.AdvertiseHost
	if adv == "" {
		adv = host
	}
	for i := range cfg.DataServers {
		d, err := StartDS(ctx, DSConfig{
			Listen:    net.JoinHostPort(host, "0"),
			Dir:       filepath.Join(cfg.Dir, fmt.Sprintf("ds%d", i)),
			MDS:       mds.Addr.String(),
			Advertise: net.JoinHostPort(adv, "0"),
			Lease:     cfg.Lease,
			Logger:    cfg.Logger,
			Metrics:   cfg.Metrics,
		})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("data server %d: %w", i, err)
		}
		c.DS = append(c.DS, d)
		// All data servers of a local cluster share this machine's disks,
		// so the MDS can still read a data server's stripe units after the
		// data server died (cluster.Striped.SetFallback).
		fb, err := store.NewLocal(filepath.Join(cfg.Dir, fmt.Sprintf("ds%d", i)), store.LocalOptions{MaxOpen: 64})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.fallbacks = append(c.fallbacks, fb)
		mds.Striped.SetFallback(d.Agent.Index(), fb)
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
