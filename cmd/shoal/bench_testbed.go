package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/shoalfs/shoal/internal/bench"
	"github.com/shoalfs/shoal/internal/bytesize"
	"github.com/shoalfs/shoal/internal/testbed"
)

// groupMeta is the --workloads name of the mdtest- and postmark-like
// workloads.
const groupMeta = "meta"

// benchExtra holds the flags of the IOR options and of the testbed mode.
type benchExtra struct {
	shared, random, testbed, testbedUp bool
	stonewall                          time.Duration
	access, label, target, rate        string
	storage, smallIO                   string
	tbName, tbDir                      string
	tbClients, fileSize, transactions  int
	poolFiles, ganeshaPort             int
	seed                               int64
	dirs                               []string
	mirrors                            []int
	changed                            func(string) bool
}

func (x *benchExtra) flags(fl *pflag.FlagSet) {
	x.changed = fl.Changed
	fl.BoolVar(&x.shared, "shared", false, "ior: one shared file, each client its own segment (default: a file per client)")
	fl.BoolVar(&x.random, "random", false, "ior: visit each client's transfers in a seeded random order (default: sequential)")
	fl.DurationVar(&x.stonewall, "stonewall", 0, "ior: stop each phase after this long and report the bytes moved (0: move everything)")
	fl.StringVar(&x.access, "access", "", "ior: the clients' access method: direct (default: no client cache), odirect (small writes gathered) or cached")
	fl.StringVar(&x.label, "label", "", "sweep label stored in the JSON for \"shoal bench plot\": ds, clients or block")
	fl.StringVar(&x.target, "target", bench.TargetShoal, "testbed: server to measure, shoal or ganesha (NFS-Ganesha in the MDS namespace)")
	fl.BoolVar(&x.testbed, "testbed", false, "run ior/meta on a running \"shoal testbed\" (its --ds must match)")
	fl.BoolVar(&x.testbedUp, "testbed-up", false, "bring a testbed up for every --ds count and tear it down after")
	fl.StringVar(&x.rate, "rate", testbed.DefaultRate, "testbed-up: per-link rate")
	fl.StringVar(&x.storage, "storage", testbed.StorageTmpfs, "testbed-up: data servers' storage, tmpfs or disk (see shoal testbed up --help)")
	fl.StringVar(&x.tbName, "testbed-name", testbed.DefaultName, "testbed name")
	fl.StringVar(&x.tbDir, "testbed-dir", "", "testbed directory (default $TMPDIR/NAME)")
	fl.IntVar(&x.tbClients, "testbed-clients", 0, "testbed-up: client namespaces (default: --clients)")
	fl.IntVar(&x.fileSize, "file-size", 4<<10, "meta: bytes written into each mdtest file")
	fl.IntVar(&x.transactions, "transactions", 1000, "meta: postmark transactions per client (0: no postmark)")
	fl.IntVar(&x.poolFiles, "pool-files", 200, "meta: postmark's initial files per client")
	fl.Int64Var(&x.seed, "seed", 42, "meta: postmark RNG seed")
	fl.StringSliceVar(&x.dirs, "dirs", []string{bench.DirUnique, bench.DirShared}, "meta: mdtest directory layouts, unique (one per client) and/or shared")
	fl.IntVar(&x.ganeshaPort, "ganesha-port", 2050, "testbed: NFS-Ganesha's port in the MDS namespace")
	fl.IntSliceVar(&x.mirrors, "mirrors", nil, "ior: copies of every stripe unit to measure, a fresh cluster each (shoal mds --mirrors; 1-3, at most the smallest --ds); default 1, or a running --testbed's own")
	fl.StringVar(&x.smallIO, "small-io-threshold", "0", "ior, meta: the clients' client.Policy.SmallIOThreshold, requests shorter than this go through the MDS (0: the library's default)")
}

// smallIOThreshold parses --small-io-threshold (a size such as 4097 or
// 64KiB; negative values are passed on for the library to judge).
func (x *benchExtra) smallIOThreshold() (int, error) {
	v, err := bytesize.ParseSigned(x.smallIO)
	if err != nil || v > 1<<30 || v < -1<<30 {
		return 0, fmt.Errorf("--small-io-threshold %q: want a size up to 1GiB", x.smallIO)
	}
	return int(v), nil
}

// applyIOR copies the IOR options into c.
func (x *benchExtra) applyIOR(c *bench.IORConfig) error {
	c.Shared, c.Random, c.Stonewall, c.Access, c.Label = x.shared, x.random, x.stonewall, x.access, x.label
	c.Target = x.target
	if x.changed("mirrors") {
		c.Mirrors = x.mirrors
		if x.target == bench.TargetGanesha && slices.ContainsFunc(c.Mirrors, func(m int) bool { return m != 1 }) {
			return errors.New("--target ganesha keeps one copy: --mirrors must be 1")
		}
	}
	t, err := x.smallIOThreshold()
	if err != nil {
		return err
	}
	c.SmallIOThreshold = t
	if x.target != bench.TargetShoal && x.target != bench.TargetGanesha {
		return fmt.Errorf("--target %q: want shoal or ganesha", x.target)
	}
	return c.Validate()
}

// metaConfig builds the meta workload's configuration from the flags:
// the defaults (or the quick ones), overridden by every flag given
// explicitly. Only the first --ds count and --pnfs mode are used.
func (x *benchExtra) metaConfig(quick bool, ds []int, pnfs []string, clients, files int, timeout time.Duration) (bench.MetaConfig, error) {
	c := bench.DefaultMetaConfig()
	if quick {
		c = bench.QuickMetaConfig()
	}
	if len(ds) > 0 {
		c.DataServers = ds[0]
	}
	if x.changed("clients") || !quick {
		c.Clients = clients
	}
	if x.changed("files") {
		c.Files = files
	}
	if x.changed("file-size") {
		c.FileSize = x.fileSize
	}
	if x.changed("transactions") {
		c.Transactions = x.transactions
	}
	if x.changed("pool-files") {
		c.PoolFiles = x.poolFiles
	}
	if x.changed("timeout") {
		c.Timeout = timeout
	}
	c.Seed, c.Dirs, c.Target, c.Label = x.seed, x.dirs, x.target, x.label
	modes, err := bench.ParsePNFSModes(pnfs)
	if err != nil || len(modes) == 0 {
		return c, fmt.Errorf("--pnfs: %v", err)
	}
	c.PNFS = modes[0] && x.target == bench.TargetShoal
	if c.SmallIOThreshold, err = x.smallIOThreshold(); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// runTestbedBench runs ior and/or meta on the emulated cluster.
func runTestbedBench(cmd *cobra.Command, x benchExtra, ior, meta, quick bool, ds []int, pnfs []string, clients int,
	block, transfer string, reps int, timeout time.Duration, files int, jsonOut, script string) error {
	ctx := cmd.Context()
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if os.Geteuid() != 0 {
		return errors.New("the testbed needs root (network namespaces)")
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the shoal binary: %w", err)
	}
	log := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tc := &bench.TestbedCluster{Exe: exe, Logger: log}
	if x.testbed {
		st, err := testbed.Load(testbed.DirFor(x.tbName, x.tbDir))
		if err != nil {
			return fmt.Errorf("no running testbed %s (shoal testbed up): %w", x.tbName, err)
		}
		tc.State = st
	} else {
		m := x.tbClients
		if m == 0 {
			m = clients
		}
		tc.Up = &testbed.Config{Name: x.tbName, Dir: x.tbDir, Clients: m, Rate: x.rate, Storage: x.storage, Binary: exe}
	}
	setup := bench.IORSetup{Cluster: tc, Clients: tc}
	tmp, err := os.MkdirTemp("", "shoal-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if x.target == bench.TargetGanesha {
		if script == "" {
			script = bench.FindScript(filepath.Join("scripts", "ganesha.sh"))
		}
		if script != "" {
			script, _ = filepath.Abs(script)
		}
		setup.Cluster = &bench.GaneshaTestbed{Script: script, Dir: filepath.Join(tmp, "ganesha"), Testbed: tc, Port: x.ganeshaPort}
		if x.testbedUp {
			return errors.New("--target ganesha runs on a testbed that is up (--testbed)")
		}
	}
	if meta && x.changed("mirrors") {
		return errors.New("--mirrors applies to --workloads ior (bring a testbed up with `shoal testbed up --mirrors N` for meta)")
	}
	var errs []error
	if ior {
		changed := x.changed
		c, err := iorConfig(changed, quick, ds, pnfs, clients, block, transfer, reps, timeout)
		if err != nil {
			return err
		}
		if err := x.applyIOR(&c); err != nil {
			return err
		}
		if tc.State != nil && !x.changed("mirrors") {
			// Record what the running testbed keeps.
			c.Mirrors = []int{tc.State.Copies()}
		}
		c.LinkBitsPerSec = tc.LinkBitsPerSec()
		if x.target == bench.TargetGanesha {
			// Ganesha offers no layouts: a pNFS-on client would fall back
			// to the same path, so one mode is measured.
			c.PNFS = []bool{false}
		}
		c.Progress = errOut
		fmt.Fprintf(errOut, "ior on testbed (%s): %d clients x %s in %s transfers; data servers %v; copies %v; pNFS %s; %d reps\n",
			x.target, c.Clients, bench.FormatSize(c.BlockSize), bench.FormatSize(int64(c.TransferSize)),
			c.DataServers, c.Copies(), bench.FormatPNFSModes(c.PNFS), c.Reps)
		rep, runErr := bench.RunIOR(ctx, c, setup)
		errs = append(errs, runErr)
		if rep != nil {
			fmt.Fprintln(out)
			errs = append(errs, rep.WriteTable(out))
			if jsonOut != "" {
				errs = append(errs, writeJSONFile(jsonOut, rep.WriteJSON))
			}
		}
	}
	if meta && ctx.Err() == nil {
		c, err := x.metaConfig(quick, ds, pnfs, clients, files, timeout)
		if err != nil {
			return err
		}
		c.Progress = errOut
		rep, runErr := bench.RunMeta(ctx, c, setup)
		errs = append(errs, runErr)
		if rep != nil {
			fmt.Fprintln(out)
			errs = append(errs, rep.WriteTable(out))
			if jsonOut != "" {
				path := jsonOut
				if ior {
					path = strings.TrimSuffix(jsonOut, ".json") + "-meta.json"
				}
				errs = append(errs, writeJSONFile(path, rep.WriteJSON))
			}
		}
	}
	return errors.Join(errs...)
}

func writeJSONFile(path string, write func(w io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// newBenchPlotCmd is `shoal bench plot`: the plots and the Markdown
// tables of the JSON reports in a directory. benchPlot, which does it, is
// in bench_plot.go, or in bench_noplot.go for a shoal built with -tags
// noplot that refuses, so that binary does not link the plotting library.
func newBenchPlotCmd() *cobra.Command {
	var dir, md string
	short := "Draw the benchmark plots (PNG and SVG) and tables from the JSON reports in a directory"
	if !plotsIncluded {
		short += " (not in this build: -tags noplot)"
	}
	cmd := &cobra.Command{
		Use:   "plot",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return benchPlot(cmd.OutOrStdout(), dir, md)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "docs/bench", "directory holding the JSON reports; the plots are written there")
	cmd.Flags().StringVar(&md, "markdown", "", "write the tables here (default DIR/results.md)")
	return cmd
}
