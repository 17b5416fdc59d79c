package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/gcfloor"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// serveConfig is what `shoal serve` runs with: its flags, once its
// configuration file (loadConfig) has filled those not given on the command
// line, and the file's settings that have no flag.
type serveConfig struct {
	Listen  string
	Dir     string
	Meta    string // metadata engine: "bolt" (default) or "etcd://host:port[,...]/prefix"
	Lease   time.Duration
	MaxIO   uint32
	Exports []*server.Export
	// Metrics is the address of the Prometheus metrics endpoint ("" off).
	Metrics string
	// Delegations grants NFSv4 delegations (--delegations).
	Delegations bool
	// Durability is --sync and --commit-interval.
	Durability durabilityFlags
}

// serveFile is the part of serve's configuration file that no flag sets.
type serveFile struct {
	exportsFile `yaml:",inline"`
	// MaxIO is the largest READ and WRITE the server offers (0: its default).
	MaxIO uint32 `yaml:"max_io"`
}

func newServeCmd() *cobra.Command {
	var (
		listen, dir, config string
		metaURL             string
		cpuprofile          string
		metrics             string
		lease               time.Duration
		noRootSquash        bool
		delegations         bool
		durability          durabilityFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Args:  cobra.NoArgs,
		Short: "Run a single NFSv4.1/4.2 server (no pNFS): the NFSv4 baseline",
		Example: `  shoal serve --listen 127.0.0.1:2049 --dir /var/lib/shoal
  shoal serve --config /etc/shoal/serve.yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			serverGC()
			file, err := loadConfig[serveFile](cmd, config)
			if err != nil {
				return err
			}
			if err := checkMetaURL(metaURL); err != nil {
				return err
			}
			if dir == "" {
				return errors.New("--dir is required: where Shoal keeps metadata and file data")
			}
			if err := durability.check(); err != nil {
				return err
			}
			cfg := &serveConfig{
				Listen: listen, Dir: dir, Meta: metaURL, Lease: lease, Metrics: metrics,
				MaxIO: file.MaxIO, Exports: squashExports(file.Exports, noRootSquash),
				Delegations: delegations, Durability: durability,
			}
			if cpuprofile != "" {
				stop, err := startCPUProfile(cpuprofile)
				if err != nil {
					return err
				}
				defer stop()
			}
			return runServer(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:2049", "address to listen on")
	cmd.Flags().StringVar(&dir, "dir", "", "data directory (metadata database and file data)")
	cmd.Flags().StringVar(&config, "config", "", "YAML configuration file")
	cmd.Flags().StringVar(&metaURL, "meta", "bolt", metaFlagHelp)
	cmd.Flags().DurationVar(&lease, "lease", 90*time.Second, "NFSv4 lease time; the grace period after restart lasts as long")
	cmd.Flags().BoolVar(&noRootSquash, "no-root-squash", false, "do not map root to the anonymous user (for tests and trusted clients)")
	cmd.Flags().BoolVar(&delegations, "delegations", true, delegationsHelp)
	durability.register(cmd)
	// --cpuprofile is for `shoal bench --cpuprofile`: the profile covers the
	// server's whole life and is written when it shuts down (SIGINT/SIGTERM).
	httpFlag(cmd, &metrics, "serve Prometheus metrics (/metrics) on this address (e.g. 127.0.0.1:9100)")
	cmd.Flags().StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of the server to this file")
	_ = cmd.Flags().MarkHidden("cpuprofile")
	return cmd
}

// delegationsHelp describes --delegations of serve, mds and up.
const delegationsHelp = "grant NFSv4 read and write delegations to clients with a working callback path (recalled on conflict)"

func runServer(ctx context.Context, cfg *serveConfig) error {
	if err := checkAddr("--listen", cfg.Listen, true); err != nil {
		return err
	}
	claim, err := claimDir(cfg.Dir)
	if err != nil {
		return err
	}
	defer claim.release()
	reg, err := startMetrics(cfg.Metrics)
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{
		Metrics:        registerer(reg),
		MetricLabels:   map[string]string{"role": "server", "instance": "serve"},
		Dir:            cfg.Dir,
		MetaURL:        cfg.Meta,
		Exports:        cfg.Exports,
		Lease:          cfg.Lease,
		MaxRead:        cfg.MaxIO,
		MaxWrite:       cfg.MaxIO,
		Logger:         slog.Default(),
		NoDelegations:  !cfg.Delegations,
		Async:          !cfg.Durability.sync,
		CommitInterval: cfg.Durability.interval,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		srv.Close()
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	claim.ready()
	slog.Info("shoal serve ready", "listen", ln.Addr().String(), "dir", cfg.Dir, "meta", cfg.Meta, "durability", srv.Durability().String(),
		"mount", fmt.Sprintf("mount -t nfs4 -o vers=4.2,port=%d %s:/ /mnt", ln.Addr().(*net.TCPAddr).Port, ln.Addr().(*net.TCPAddr).IP))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		slog.Info("shutting down")
		return srv.Close()
	case err := <-errc:
		srv.Close()
		return err
	}
}

// durabilityFlags are --sync and --commit-interval of serve, mds and up
// (config keys sync and commit_interval; an export's own sync key
// overrides the first for it).
type durabilityFlags struct {
	sync     bool
	interval time.Duration
}

func (d *durabilityFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&d.sync, "sync", true, "answer metadata changes only once they are durable (knfsd's sync); --sync=false answers them once written to the metadata log (knfsd's async, for exports without sync: true): a crash of the process loses nothing, a crash of the machine at most the last --commit-interval of changes, never the namespace's consistency; COMMIT and stable writes stay durable")
	cmd.Flags().DurationVar(&d.interval, "commit-interval", meta.DefaultCommitInterval, "with --sync=false or an export with sync: false: the longest a change answered early waits for the metadata log's fdatasync")
}

func (d *durabilityFlags) check() error {
	if d.interval <= 0 || d.interval > time.Minute {
		return fmt.Errorf("--commit-interval %v: want more than 0 and at most 1m", d.interval)
	}
	return nil
}

const metaFlagHelp = "metadata engine: bolt (a database in --dir) or etcd://HOST:PORT[,HOST:PORT...]/PREFIX (an etcd cluster; file data stays in --dir)"

// checkMetaURL validates a --meta value, so that a typo fails before the
// server starts.
func checkMetaURL(u string) error {
	if u == "" || u == "bolt" {
		return nil
	}
	if !strings.HasPrefix(u, "etcd://") {
		return fmt.Errorf("--meta %q: want bolt or etcd://HOST:PORT[,HOST:PORT...]/PREFIX", u)
	}
	if _, err := meta.ParseEtcdURL(u); err != nil {
		return fmt.Errorf("--meta: %w", err)
	}
	return nil
}

// startCPUProfile starts a CPU profile into path and returns the function
// that stops it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			slog.Error("cpu profile", "err", err)
		}
	}, nil
}

// serverGC gives a server process's collector a heap-goal floor
// (internal/gcfloor): a metadata server's live heap is small and every
// operation allocates, so at GOGC=100 it collected many times a second.
// GOGC in the environment overrides it.
func serverGC() {
	floor := int64(gcfloor.DefaultFloor)
	if v, err := strconv.ParseInt(os.Getenv("SHOAL_GC_FLOOR_MB"), 10, 64); err == nil {
		floor = v << 20
	}
	gcfloor.Start(floor)
}
