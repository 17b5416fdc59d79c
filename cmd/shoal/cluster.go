package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/bytesize"
	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/leader"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// squashFlag returns exports with root squashing turned off when asked.
func exportsFor(noRootSquash bool) []*server.Export {
	if !noRootSquash {
		return nil
	}
	f := false
	return []*server.Export{{Path: "/", RootSquash: &f}}
}

func newMDSCmd() *cobra.Command {
	var (
		listen, dir  string
		metaURL      string
		unit         uint64
		lease        time.Duration
		noRootSquash bool
		httpAddr     string
		secretFile   string
		downAfter    time.Duration
		mirrors      int
		healRate     string
		inlineMax    string
		config       string
		delegations  bool
		node         string
		leaderLease  time.Duration
		advertise    string
		durability   durabilityFlags
		layout       layoutFlags
		flexV3       flexV3Flags
	)
	cmd := &cobra.Command{
		Use:   "mds",
		Args:  cobra.NoArgs,
		Short: "Run a pNFS metadata server (files layout); data servers register with it",
		Example: `  shoal mds --listen 127.0.0.1:2049 --dir /var/lib/shoal/mds
  shoal mds --config /etc/shoal/mds.yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			serverGC()
			file, err := loadConfig[mdsFile](cmd, config)
			if err != nil {
				return err
			}
			if dir == "" {
				return fmt.Errorf("--dir is required")
			}
			v3, err := flexV3.config(file.FlexV3Servers)
			if err != nil {
				return err
			}
			if err := checkMetaURL(metaURL); err != nil {
				return err
			}
			rate, err := parseRate(healRate)
			if err != nil {
				return fmt.Errorf("--heal-rate: %w", err)
			}
			inline, err := parseInlineMax(inlineMax)
			if err != nil {
				return err
			}
			if err := durability.check(); err != nil {
				return err
			}
			if err := checkAddr("--listen", listen, true); err != nil {
				return err
			}
			claim, err := claimDir(dir)
			if err != nil {
				return err
			}
			defer claim.release()
			web, err := startWeb(httpAddr)
			if err != nil {
				return err
			}
			cfg := wiring.MDSConfig{
				Listen: listen, Dir: dir, MetaURL: metaURL, StripeUnit: unit, Lease: lease,
				JoinSecretFile: secretFile, DownAfter: downAfter, Mirrors: mirrors, HealRate: rate,
				Exports: layout.apply(squashExports(file.Exports, noRootSquash)), Logger: slog.Default(), Metrics: web.registerer(),
				NoDelegations: !delegations, InlineMax: inline, Node: node, LeaderLease: leaderLease, Advertise: advertise,
				Async: !durability.sync, CommitInterval: durability.interval, FlexV3: v3,
			}
			// On etcd the MDS stands for election and serves only while it
			// leads; RunMDS stands it again whenever a term ends.
			readied := false
			err = wiring.RunMDS(cmd.Context(), cfg, func(m *wiring.MDS) {
				web.serveStatus(m.StatusSource())
				if !readied {
					claim.ready()
					readied = true
				}
				slog.Info("shoal mds ready", "listen", m.Addr.String(), statusAttr(web), "dir", dir, "meta", metaURL, "term", m.Term(),
					"durability", m.Server.Durability().String(),
					"cluster_id", fmt.Sprintf("%x", m.Registry.ClusterID()), "join_secret_file", m.JoinSecretFile,
					"ds", fmt.Sprintf("%s ds --mds %s --join-secret-file %s --listen HOST:PORT --dir DIR", selfCommand(), m.Addr, m.JoinSecretFile),
					"admin", fmt.Sprintf("%s admin status --mds %s --join-secret-file %s", selfCommand(), m.Addr, m.JoinSecretFile))
			})
			slog.Info("shutting down")
			return err
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:2049", "address for NFS clients and data servers")
	cmd.Flags().StringVar(&dir, "dir", "", "metadata directory")
	cmd.Flags().StringVar(&config, "config", "", "YAML configuration file: the flags as keys (stripe_unit for --stripe-unit) and exports; flags given override it")
	cmd.Flags().StringVar(&metaURL, "meta", "bolt", metaFlagHelp)
	cmd.Flags().Uint64Var(&unit, "stripe-unit", wiring.DefaultStripeUnit, "stripe unit in bytes (multiple of 64)")
	cmd.Flags().DurationVar(&lease, "lease", 90*time.Second, "NFSv4 lease time")
	cmd.Flags().BoolVar(&noRootSquash, "no-root-squash", false, "do not map root to the anonymous user")
	httpFlag(cmd, &httpAddr, "serve the status page (/, /status.json) and Prometheus metrics (/metrics) on this address (e.g. 127.0.0.1:9101)")
	cmd.Flags().StringVar(&secretFile, "join-secret-file", "", "the cluster's join secret, created on first start (default DIR/"+wiring.JoinSecretName+"); copy it to every data server")
	cmd.Flags().DurationVar(&downAfter, "ds-down-after", cluster.DefaultDownAfter, "how long a data server may be out of service before I/O on its stripes fails with EIO instead of being retried, and before healing replaces its copies")
	cmd.Flags().IntVar(&mirrors, "mirrors", 1, "copies of each stripe unit for directories without a policy of their own (1-3; see \"shoal admin policy\")")
	cmd.Flags().StringVar(&healRate, "heal-rate", "64MiB", "bandwidth healing may use to copy stripes, per second (0 = unlimited)")
	cmd.Flags().BoolVar(&delegations, "delegations", true, delegationsHelp)
	cmd.Flags().StringVar(&inlineMax, "inline-max", inlineMaxDefault, inlineMaxHelp)
	cmd.Flags().StringVar(&node, "node", "", "this MDS's name among the MDS nodes sharing an etcd prefix (default: the host name); `shoal vip --node` on the same host matches it")
	cmd.Flags().StringVar(&advertise, "advertise", "", "with --meta etcd://...: the address this MDS is reached at, as `shoal admin status` lists it (default: --listen)")
	durability.register(cmd)
	layout.register(cmd)
	flexV3.register(cmd)
	cmd.Flags().DurationVar(&leaderLease, "leader-lease", leader.DefaultTTL, "with --meta etcd://...: the election lease; a standby takes over this long after the leader stops renewing it (whole seconds)")
	return cmd
}

// exitRemoved is shoal ds's exit status once the MDS has retired it: not
// a failure to restart from (the units say RestartPreventExitStatus=3).
const exitRemoved = 3

func newDSCmd() *cobra.Command {
	var listen, dir, advertise, peerAdvertise, metrics, secretFile, config string
	var mds []string
	cmd := &cobra.Command{
		Use:   "ds",
		Args:  cobra.NoArgs,
		Short: "Run a pNFS data server for a Shoal metadata server",
		Example: `  shoal ds --mds 10.0.0.1:2049 --join-secret-file /etc/shoal/join-secret --listen 10.0.0.2:2050 --dir /var/lib/shoal/ds
  shoal ds --mds 10.0.0.1:2049,10.0.0.5:2049 --join-secret-file /etc/shoal/join-secret --listen 10.0.0.2:2050 --dir /var/lib/shoal/ds
  shoal ds --config /etc/shoal/ds.yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			serverGC()
			if _, err := loadConfig[struct{}](cmd, config); err != nil {
				return err
			}
			if dir == "" || len(mds) == 0 || secretFile == "" {
				return fmt.Errorf("--dir, --mds and --join-secret-file are required")
			}
			secret, err := cluster.ReadJoinSecret(secretFile)
			if err != nil {
				return err
			}
			if err := checkAddr("--listen", listen, true); err != nil {
				return err
			}
			for _, addr := range mds {
				if addr == "" {
					return fmt.Errorf("--mds %s: an empty address", strings.Join(mds, ","))
				}
				if err := checkAddr("--mds", addr, false); err != nil {
					return err
				}
			}
			claim, err := claimDir(dir)
			if err != nil {
				return err
			}
			defer claim.release()
			reg, err := startMetrics(metrics)
			if err != nil {
				return err
			}
			d, err := wiring.StartDS(cmd.Context(), wiring.DSConfig{
				Listen: listen, Dir: dir, MDS: mds, JoinSecret: secret, Advertise: advertise, PeerAdvertise: peerAdvertise, Logger: slog.Default(), Metrics: registerer(reg),
			})
			if err != nil {
				return err
			}
			claim.ready()
			slog.Info("shoal ds ready", "listen", d.Addr.String(), "id", d.Agent.ID(), "mds", mds)
			select {
			case <-cmd.Context().Done():
			case <-d.Agent.Removed():
				d.Close()
				return &exitError{code: exitRemoved, err: fmt.Errorf("data server %s was removed from the cluster (shoal admin remove); its directory %s can be deleted", d.Agent.ID(), dir)}
			}
			slog.Info("shutting down")
			return d.Close()
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "address for NFS clients")
	cmd.Flags().StringVar(&dir, "dir", "", "data directory")
	cmd.Flags().StringVar(&config, "config", "", "YAML configuration file: the flags as keys (join_secret_file for --join-secret-file); flags given override it")
	cmd.Flags().StringSliceVar(&mds, "mds", nil, "metadata server address host:port; with failover, every metadata server's, comma-separated (the data server registers with the leader)")
	cmd.Flags().StringVar(&secretFile, "join-secret-file", "", "the cluster's join secret: a copy of the MDS's "+wiring.JoinSecretName+" file")
	cmd.Flags().StringVar(&advertise, "advertise", "", "address clients use to reach this data server (default: --listen)")
	cmd.Flags().StringVar(&peerAdvertise, "peer-advertise", "", "address the other data servers use to reach this one for replicated writes (default: --listen if it names a host, else --advertise)")
	httpFlag(cmd, &metrics, "serve Prometheus metrics (/metrics) on this address (e.g. 127.0.0.1:9102)")
	return cmd
}

func newUpCmd() *cobra.Command {
	var (
		listen, dir, advertise string
		httpAddr               string
		readyFile, cpuprofile  string
		n, mirrors             int
		unit                   uint64
		lease                  time.Duration
		rootSquash             bool
		delegations            bool
		inlineMax              string
		durability             durabilityFlags
	)
	cmd := &cobra.Command{
		Use:   "up",
		Args:  cobra.NoArgs,
		Short: "Start a local pNFS cluster: one metadata server and N data servers",
		Example: `  shoal up --dir /tmp/shoal --ds 4
  shoal up --dir /tmp/shoal --ds 4 --listen 127.0.0.1:2049 --advertise-host 10.0.2.2`,
		RunE: func(cmd *cobra.Command, args []string) error {
			serverGC()
			if dir == "" {
				dir = filepath.Join(os.TempDir(), "shoal")
			}
			inline, err := parseInlineMax(inlineMax)
			if err != nil {
				return err
			}
			if err := durability.check(); err != nil {
				return err
			}
			if err := checkAddr("--listen", listen, true); err != nil {
				return err
			}
			claim, err := claimDir(dir)
			if err != nil {
				return err
			}
			defer claim.release()
			// The directories wiring.Start gives the MDS and each data
			// server.
			for i := -1; i < n; i++ {
				name := "mds"
				if i >= 0 {
					name = fmt.Sprintf("ds%d", i)
				}
				if err := claim.claimSub(name); err != nil {
					return err
				}
			}
			ctx := cmd.Context()
			if cpuprofile != "" {
				stop, err := startCPUProfile(cpuprofile)
				if err != nil {
					return err
				}
				defer stop()
			}
			web, err := startWeb(httpAddr)
			if err != nil {
				return err
			}
			c, err := wiring.Start(ctx, wiring.Config{
				Dir: dir, DataServers: n, Listen: listen, AdvertiseHost: advertise,
				StripeUnit: unit, Lease: lease, Exports: exportsFor(!rootSquash), Logger: slog.Default(),
				Metrics: web.registerer(), Mirrors: mirrors, NoDelegations: !delegations, InlineMax: inline,
				Async: !durability.sync, CommitInterval: durability.interval,
			})
			if err != nil {
				return err
			}
			web.serveStatus(c.MDS.StatusSource())
			claim.ready()
			addr := c.MDS.Addr.(*net.TCPAddr)
			var ds []string
			for _, d := range c.DS {
				ds = append(ds, d.Addr.String())
			}
			fmt.Printf("shoal up: ready: MDS %s, %d data servers [%s], stripe unit %d, data in %s\n",
				addr, len(c.DS), strings.Join(ds, " "), c.MDS.Striped.StripeUnit(), dir)
			self := selfCommand()
			fmt.Printf("  meta:   %s\n", c.MDS.Server.Durability())
			fmt.Printf("  mount:  mount -t nfs4 -o vers=4.2,port=%d %s:/ /mnt\n", addr.Port, addr.IP)
			fmt.Printf("  files:  %s ls nfs://%s/\n", self, addr)
			fmt.Printf("  bench:  %s bench --addr %s\n", self, addr)
			fmt.Printf("  admin:  %s admin status --mds %s --join-secret-file %s\n", self, addr, c.MDS.JoinSecretFile)
			if url := web.statusURL(); url != "" {
				fmt.Printf("  status: %s\n", url)
			}
			fmt.Printf("  stop:   Ctrl-C, or kill %d\n", os.Getpid())
			fmt.Print(goRunNote())
			if readyFile != "" {
				if err := writeReadyFile(readyFile, addr.String(), ds); err != nil {
					c.Close()
					return err
				}
			}
			<-ctx.Done()
			fmt.Println("shoal up: shutting down")
			shut, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Close() }()
			select {
			case err := <-done:
				return err
			case <-shut.Done():
				return fmt.Errorf("shutdown timed out")
			}
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:2049", "metadata server address")
	cmd.Flags().StringVar(&dir, "dir", "", "directory for all cluster data (default $TMPDIR/shoal)")
	cmd.Flags().StringVar(&advertise, "advertise-host", "", "host clients use to reach the data servers (default: the listen host)")
	cmd.Flags().IntVar(&n, "ds", 4, "number of data servers")
	cmd.Flags().IntVar(&mirrors, "mirrors", 1, "copies of each stripe unit (1-3, at most --ds)")
	cmd.Flags().Uint64Var(&unit, "stripe-unit", wiring.DefaultStripeUnit, "stripe unit in bytes")
	cmd.Flags().DurationVar(&lease, "lease", 90*time.Second, "NFSv4 lease time")
	cmd.Flags().BoolVar(&rootSquash, "root-squash", false, "map root to the anonymous user (off for a local development cluster)")
	cmd.Flags().BoolVar(&delegations, "delegations", true, delegationsHelp)
	cmd.Flags().StringVar(&inlineMax, "inline-max", inlineMaxDefault, inlineMaxHelp)
	durability.register(cmd)
	httpFlag(cmd, &httpAddr, "serve the status page (/, /status.json) and Prometheus metrics of all servers (/metrics) on this address (e.g. 127.0.0.1:9100)")
	cmd.Flags().StringVar(&readyFile, "ready-file", "", `once every data server is in service, write {"mds": HOST:PORT, "data_servers": [...], "pid": N} to this file (for --listen 127.0.0.1:0)`)
	// --cpuprofile is for `shoal bench --workloads ior --cpuprofile`: the
	// profile covers the MDS and all data servers.
	cmd.Flags().StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of the cluster to this file")
	_ = cmd.Flags().MarkHidden("cpuprofile")
	return cmd
}

const (
	inlineMaxDefault = "32KiB"
	inlineMaxHelp    = "keep the data of files up to this size, written through the metadata server, in the metadata engine instead of on data servers (0 = never)"
)

// parseInlineMax parses --inline-max for server.Config.InlineMax, where
// off is negative.
func parseInlineMax(s string) (int, error) {
	n, err := bytesize.Parse(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("--inline-max: %w", err)
	case n == 0:
		return -1, nil
	case n > 1<<20:
		// A record is read and rewritten whole by every write.
		return 0, fmt.Errorf("--inline-max %s: at most 1MiB", s)
	}
	return int(n), nil
}

// parseRate parses a bandwidth per second such as "64MiB"; "0" means
// unlimited, which cluster.AdminConfig.HealRate spells as a negative rate.
func parseRate(s string) (int64, error) {
	n, err := bytesize.Parse(s)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}
