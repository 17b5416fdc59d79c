package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/bench"
	"github.com/shoalfs/shoal/internal/bytesize"
)

func newBenchCmd() *cobra.Command {
	var (
		targets, size, block, addr, root, jsonOut, profDir, script string
		transfer, servers                                          string
		groups, pnfs                                               []string
		dsCounts                                                   []int
		depth, files, dirFiles, reps, serverPID, clients, streams  int
		timeout                                                    time.Duration
		quick, keep                                                bool
		x                                                          benchExtra
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark shoal serve against NFS-Ganesha on this machine",
		Long: `bench starts each target server on a free 127.0.0.1 port in a temporary
directory (Shoal as a child "shoal serve", NFS-Ganesha through
scripts/ganesha.sh), drives it with Shoal's client and prints, per target:
sequential write and read throughput of one file, and small-file create,
stat and remove rates. Each number is the median of --reps runs with the
minimum and maximum. With --addr it benchmarks a running server instead.

--workloads ior is the pNFS scaling benchmark, IOR-style: for each
--ds count it starts a fresh local cluster (a child "shoal up"), then
--clients client processes each write their own file of --block bytes in
--transfer calls (timed until COMMIT and CLOSE), and after all writers
finished read them back; with pNFS on and off (--pnfs), --reps times. It
prints aggregate MB/s per data-server count and mode, with the CPU use of
the servers and of the clients. --shared (one file, a segment per client),
--random and --stonewall select IOR's other modes. --mirrors 1,2 also
measures each number of copies of every stripe unit (shoal mds --mirrors)
on a cluster of its own, with the write ceiling of every byte entering the
data servers once per copy.

--testbed (a running "shoal testbed") or --testbed-up (one brought up per
--ds count at --rate, torn down after) run ior and --workloads meta
(mdtest- and postmark-like small-file work) on the emulated cluster: each
client process in a client namespace of its own, each cell with the link
ceiling and the machine's CPU use. --target ganesha measures NFS-Ganesha
run in the MDS namespace instead. "shoal bench plot" draws the plots of a
directory of JSON reports; scripts/bench-papers.sh runs every sweep.

--workloads scale is issue 13's scale test on loopback: --clients sessions
create --files empty files (default 1,000,000), --dir-files of them
(default 100,000) in one directory, then stat the first and the last 10%
from fresh sessions and list the large directory with its attributes
(ls -l). It reports the create and stat rates of the first and last 10%,
the listing time, meta.db's size and the MDS's memory (VmRSS, VmHWM). The
MDS runs as "shoal mds" of its own (--servers split) unless --servers up or
--cpuprofile is given.`,
		Example: `  shoal bench --testbed-up --ds 1,2,4,6 --clients 8 --rate 1gbit --workloads ior --block 128MiB --stonewall 20s --json ds.json
  shoal bench --testbed-up --ds 4 --mirrors 1,2 --clients 8 --pnfs on --workloads ior --label mirrors --json mirrors.json
  shoal bench --testbed --ds 6 --clients 8 --workloads meta --target ganesha --json meta-ganesha.json
  shoal bench plot --dir docs/bench
  shoal bench
  shoal bench --quick --targets shoal
  shoal bench --workloads ior --ds 1,2,4 --pnfs on,off --clients 4 --block 256MiB --transfer 1MiB --reps 3 --json ior.json
  shoal bench --workloads ior --quick
  shoal bench --size 1GiB --block 1MiB --reps 3 --json out.json --cpuprofile prof/
  shoal bench --addr 127.0.0.1:2049 --root /export
  shoal bench --workloads scale --files 200000 --dir-files 50000 --json scale.json
  shoal bench --workloads scale --quick`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			ior := slices.Contains(groups, bench.IOR)
			meta := slices.Contains(groups, groupMeta)
			scale := slices.Contains(groups, groupScale)
			groups = slices.DeleteFunc(slices.Clone(groups), func(g string) bool { return g == bench.IOR || g == groupMeta || g == groupScale })
			classic := (!ior && !meta && !scale) || len(groups) > 0
			if x.testbed || x.testbedUp {
				if scale {
					return errors.New("--workloads scale runs on loopback only, not with --testbed")
				}
				if classic {
					return errors.New("--testbed runs only the ior and meta workloads (--workloads ior,meta)")
				}
				return runTestbedBench(cmd, x, ior, meta, quick, dsCounts, pnfs, clients, block, transfer, reps, timeout, files, jsonOut, script)
			}
			if x.target != bench.TargetShoal {
				return errors.New("--target ganesha needs --testbed or --testbed-up (on loopback use --targets)")
			}
			var metaCfg *bench.MetaConfig
			if meta {
				if addr != "" {
					return errors.New("--workloads meta starts its own cluster; it cannot use --addr")
				}
				c, err := x.metaConfig(quick, dsCounts, pnfs, clients, files, timeout)
				if err != nil {
					return err
				}
				c.Progress = cmd.ErrOrStderr()
				metaCfg = &c
			}
			var scaleCfg *bench.ScaleConfig
			if scale {
				if addr != "" {
					return errors.New("--workloads scale starts its own cluster; it cannot use --addr")
				}
				c, err := scaleConfig(f.Changed, quick, files, dirFiles, clients, dsCounts, timeout, servers, profDir)
				if err != nil {
					return err
				}
				c.Progress = cmd.ErrOrStderr()
				scaleCfg = &c
			}
			var iorCfg *bench.IORConfig
			if ior {
				if addr != "" {
					return errors.New("--workloads ior starts its own clusters; it cannot use --addr")
				}
				if classic && f.Changed("block") {
					return errors.New("--block means the request size for seq and the per-client size for ior; run ior on its own to set it")
				}
				c, err := iorConfig(f.Changed, quick, dsCounts, pnfs, clients, block, transfer, reps, timeout)
				if err != nil {
					return err
				}
				if err := x.applyIOR(&c); err != nil {
					return err
				}
				c.Progress = cmd.ErrOrStderr()
				iorCfg = &c
			}
			if !classic {
				return runBench(cmd.Context(), cmd, nil, iorCfg, benchSetup{
					jsonOut: jsonOut, profDir: profDir, keep: keep, servers: servers, meta: metaCfg, scale: scaleCfg,
				})
			}
			cfg := bench.DefaultConfig()
			if quick {
				cfg = bench.QuickConfig()
			}
			var err error
			if f.Changed("size") || !quick {
				if cfg.Size, err = bytesize.Parse(size); err != nil {
					return fmt.Errorf("--size: %w", err)
				}
			}
			b, err := bytesize.Parse(block)
			if err != nil {
				return fmt.Errorf("--block: %w", err)
			}
			cfg.Block = int(min(b, 1<<30))
			cfg.Depth, cfg.Timeout = depth, timeout
			if len(groups) > 0 {
				cfg.Groups = groups
			}
			if f.Changed("files") || !quick {
				cfg.Files = files
			}
			if f.Changed("reps") || !quick {
				cfg.Reps = reps
			}
			cfg.Streams = streams
			cfg.Progress = cmd.ErrOrStderr()
			if err := cfg.Validate(); err != nil {
				return err
			}
			return runBench(cmd.Context(), cmd, &cfg, iorCfg, benchSetup{
				targets: targets, addr: addr, root: root, jsonOut: jsonOut,
				profDir: profDir, script: script, keep: keep, servers: servers,
				targetsSet: f.Changed("targets"), serverPID: serverPID, meta: metaCfg, scale: scaleCfg,
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&targets, "targets", "shoal,ganesha", "comma-separated servers to start and benchmark: shoal, shoal-async (shoal serve --sync=false), ganesha; with ganesha among them the table ends with each target's ratio to it")
	fl.StringVar(&addr, "addr", "", "benchmark the already running server at host:port instead of starting any")
	fl.StringVar(&root, "root", "/", "with --addr: directory of the server's pseudo file system to work in (Ganesha: /export)")
	fl.IntVar(&serverPID, "server-pid", 0, "with --addr: pid of the server if it runs on this machine, to report its CPU time")
	fl.StringVar(&size, "size", "1GiB", "size of the sequentially written and read file")
	fl.StringVar(&block, "block", "1MiB", "size of each READ and WRITE request; ior: how much each client writes and reads, 256MiB unless set")
	fl.IntVar(&depth, "depth", 16, "sequential READ/WRITE requests in flight at once")
	fl.IntVar(&files, "files", 2000, "number of files for the create, stat and remove rates; meta: files per client, 500 unless set; scale: files in the namespace, 1000000 unless set")
	fl.IntVar(&streams, "streams", 1, "small: how many create, stat and remove streams run at once, each in a directory of its own, over one client session (1: one operation at a time)")
	fl.IntVar(&dirFiles, "dir-files", 100_000, "scale: how many of the --files are in one large directory")
	fl.IntVar(&reps, "reps", 3, "repetitions of each measurement (the median is reported)")
	fl.StringSliceVar(&groups, "workloads", nil, "workload groups to run: seq (write+read), small (create, stat, remove), ior (pNFS scaling), meta (mdtest- and postmark-like; on loopback a \"shoal up\" cluster of the first --ds count, client mode the first --pnfs), scale (a namespace of --files files, --dir-files of them in one directory: create and stat rates of the first and last 10%, ls -l time, meta.db size, MDS memory; --clients sessions); default seq,small")
	fl.IntSliceVar(&dsCounts, "ds", []int{1, 2, 4}, "ior: data-server counts, a fresh cluster each")
	fl.StringSliceVar(&pnfs, "pnfs", []string{"on", "off"}, "ior: client modes: on (I/O to the data servers), off (all I/O through the MDS)")
	fl.IntVar(&clients, "clients", 4, "ior: client processes, one file each")
	fl.StringVar(&transfer, "transfer", "1MiB", "ior: size of each write and read call")
	fl.StringVar(&servers, "servers", "up", "ior: up (MDS and data servers in one \"shoal up\" process) or split (\"shoal mds\" and one \"shoal ds\" per data server, to tell their CPU apart)")
	fl.DurationVar(&timeout, "timeout", 10*time.Minute, "limit for the whole run (ior: 30m unless set)")
	fl.BoolVar(&quick, "quick", false, "smoke run: 64MiB, 200 files, 1 rep; ior: 1 and 2 DSes, 2 clients x 16MiB, 1 rep (explicit flags still win)")
	fl.StringVar(&jsonOut, "json", "", "also write the report as JSON to this file")
	fl.StringVar(&profDir, "cpuprofile", "", "write CPU profiles of the Shoal server and of this client into this directory")
	fl.StringVar(&script, "ganesha-script", "", "path of scripts/ganesha.sh (default: looked up from the working directory)")
	fl.BoolVar(&keep, "keep", false, "keep the servers' temporary directories (data, logs) for inspection")
	x.flags(fl)
	cmd.AddCommand(newBenchClientCmd(), newBenchPlotCmd())
	return cmd
}

// iorConfig builds the ior configuration from the flags: the defaults (or
// the quick ones), overridden by every flag given explicitly.
func iorConfig(changed func(string) bool, quick bool, ds []int, pnfs []string, clients int, block, transfer string, reps int, timeout time.Duration) (bench.IORConfig, error) {
	c := bench.DefaultIORConfig()
	if quick {
		c = bench.QuickIORConfig()
	}
	if changed("ds") {
		c.DataServers = ds
	}
	if changed("pnfs") {
		modes, err := bench.ParsePNFSModes(pnfs)
		if err != nil {
			return c, fmt.Errorf("--pnfs: %w", err)
		}
		c.PNFS = modes
	}
	if changed("clients") {
		c.Clients = clients
	}
	if changed("block") {
		b, err := bytesize.Parse(block)
		if err != nil {
			return c, fmt.Errorf("--block: %w", err)
		}
		c.BlockSize = b
	}
	if changed("transfer") {
		t, err := bytesize.Parse(transfer)
		if err != nil {
			return c, fmt.Errorf("--transfer: %w", err)
		}
		c.TransferSize = int(min(t, 1<<30))
	}
	if changed("reps") {
		c.Reps = reps
	}
	if changed("timeout") {
		c.Timeout = timeout
	}
	return c, c.Validate()
}

// newBenchClientCmd is the hidden `shoal bench client`: one ior client
// process, driven by its parent over stdin and stdout (bench.RunClient).
func newBenchClientCmd() *cobra.Command {
	var spec string
	cmd := &cobra.Command{
		Use:    "client",
		Short:  "One ior benchmark client (started by shoal bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var s bench.ClientSpec
			if err := json.Unmarshal([]byte(spec), &s); err != nil {
				return fmt.Errorf("--spec: %w", err)
			}
			return bench.RunClient(cmd.Context(), s, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&spec, "spec", "", "the client's job as JSON (bench.ClientSpec)")
	return cmd
}

// writeReadyFile writes `shoal up --ready-file`: a bench.ClusterReady,
// through a rename so a reader never sees it half-written.
func writeReadyFile(path, mds string, ds []string) error {
	b, err := json.Marshal(bench.ClusterReady{MDS: mds, DataServers: ds, PID: os.Getpid()})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	return nil
}

type benchSetup struct {
	targets, addr, root, jsonOut, profDir, script string
	servers                                       string // ior: up or split
	keep, targetsSet                              bool
	serverPID                                     int
	// meta, if not nil, is the meta workload, run on a `shoal up`
	// cluster after the others.
	meta *bench.MetaConfig
	// scale, if not nil, is the scale workload, run last on a cluster of
	// its own.
	scale *bench.ScaleConfig
}

// runBench runs the classic workloads (cfg) and the ior workload (iorCfg),
// whichever is not nil.
func runBench(ctx context.Context, cmd *cobra.Command, cfg *bench.Config, iorCfg *bench.IORConfig, s benchSetup) error {
	errOut := cmd.ErrOrStderr()
	if s.addr != "" && s.targetsSet {
		return errors.New("--addr and --targets exclude each other")
	}
	tmp, err := os.MkdirTemp("", "shoal-bench-")
	if err != nil {
		return err
	}
	defer func() {
		if s.keep {
			fmt.Fprintf(errOut, "kept %s\n", tmp)
			return
		}
		os.RemoveAll(tmp)
	}()
	if s.profDir != "" {
		if s.profDir, err = filepath.Abs(s.profDir); err != nil {
			return err
		}
		if err := os.MkdirAll(s.profDir, 0o755); err != nil {
			return err
		}
		pf, err := os.Create(filepath.Join(s.profDir, "bench-client.cpu.pprof"))
		if err != nil {
			return err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("client CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	var runErr error
	if cfg != nil {
		runErr = runClassic(ctx, cmd, *cfg, s, tmp)
	}
	if iorCfg != nil && ctx.Err() == nil {
		jsonOut := s.jsonOut
		if cfg != nil && jsonOut != "" {
			jsonOut = strings.TrimSuffix(jsonOut, ".json") + "-ior.json"
		}
		runErr = errors.Join(runErr, runIOR(ctx, cmd, *iorCfg, jsonOut, s.profDir, s.servers, tmp))
	}
	if s.meta != nil && ctx.Err() == nil {
		jsonOut := s.jsonOut
		if (cfg != nil || iorCfg != nil) && jsonOut != "" {
			jsonOut = strings.TrimSuffix(jsonOut, ".json") + "-meta.json"
		}
		runErr = errors.Join(runErr, runMetaLocal(ctx, cmd, *s.meta, jsonOut, tmp))
	}
	if s.scale != nil && ctx.Err() == nil {
		jsonOut := s.jsonOut
		if (cfg != nil || iorCfg != nil || s.meta != nil) && jsonOut != "" {
			jsonOut = strings.TrimSuffix(jsonOut, ".json") + "-scale.json"
		}
		runErr = errors.Join(runErr, runScale(ctx, cmd, *s.scale, jsonOut, s.profDir, tmp))
	}
	if ctx.Err() != nil && runErr == nil {
		runErr = ctx.Err()
	}
	return runErr
}

// runIOR runs the ior workload with `shoal up` clusters and client
// processes of this binary.
func runIOR(ctx context.Context, cmd *cobra.Command, cfg bench.IORConfig, jsonOut, profDir, servers, tmp string) error {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the shoal binary: %w", err)
	}
	logs := filepath.Join(tmp, "ior-clients")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	setup := bench.IORSetup{Clients: &bench.ProcessLauncher{Exe: exe, LogDir: logs}}
	switch servers {
	case "", "up":
		setup.Cluster = &bench.ClusterProcess{Exe: exe, Dir: filepath.Join(tmp, "ior"), ProfileDir: profDir}
	case "split":
		if profDir != "" {
			return errors.New("--cpuprofile is only supported with --servers up")
		}
		setup.Cluster = &bench.ClusterSplit{Exe: exe, Dir: filepath.Join(tmp, "ior")}
	default:
		return fmt.Errorf("--servers %q: want up or split", servers)
	}
	fmt.Fprintf(errOut, "ior: %d clients x %s in %s transfers; data servers %v; pNFS %s; %d reps\n",
		cfg.Clients, bench.FormatSize(cfg.BlockSize), bench.FormatSize(int64(cfg.TransferSize)),
		cfg.DataServers, bench.FormatPNFSModes(cfg.PNFS), cfg.Reps)
	rep, runErr := bench.RunIOR(ctx, cfg, setup)
	if rep == nil {
		return runErr
	}
	return printReport(out, errOut, "ior", rep, jsonOut, runErr)
}

// printReport prints rep's table to out and writes its JSON to jsonOut
// (unless empty), joining any error to runErr, the run's own error.
func printReport(out, errOut io.Writer, what string, rep interface {
	WriteTable(io.Writer) error
	WriteJSON(io.Writer) error
}, jsonOut string, runErr error) error {
	fmt.Fprintln(out)
	if err := rep.WriteTable(out); err != nil {
		return errors.Join(runErr, err)
	}
	if jsonOut != "" {
		if err := writeJSONFile(jsonOut, rep.WriteJSON); err != nil {
			return errors.Join(runErr, err)
		}
		fmt.Fprintf(errOut, "%s: JSON report in %s\n", what, jsonOut)
	}
	return runErr
}

// runMetaLocal runs the meta workload on a `shoal up` cluster on
// loopback, with client processes of this binary.
func runMetaLocal(ctx context.Context, cmd *cobra.Command, cfg bench.MetaConfig, jsonOut, tmp string) error {
	out := cmd.OutOrStdout()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the shoal binary: %w", err)
	}
	logs := filepath.Join(tmp, "meta-clients")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	setup := bench.IORSetup{
		Cluster: &bench.ClusterProcess{Exe: exe, Dir: filepath.Join(tmp, "meta")},
		Clients: &bench.ProcessLauncher{Exe: exe, LogDir: logs},
	}
	rep, runErr := bench.RunMeta(ctx, cfg, setup)
	if rep == nil {
		return runErr
	}
	return printReport(out, cmd.ErrOrStderr(), "meta", rep, jsonOut, runErr)
}

// groupScale is the --workloads name of the scale workload.
const groupScale = "scale"

// scaleConfig builds the scale workload's configuration from the flags:
// the defaults (or the quick ones), overridden by every flag given. The
// servers run split (the MDS a process of its own, so its memory is its
// own) unless --servers says otherwise or --cpuprofile asks for a
// profile, which only `shoal up` writes.
func scaleConfig(changed func(string) bool, quick bool, files, dirFiles, sessions int, ds []int, timeout time.Duration, servers, profDir string) (bench.ScaleConfig, error) {
	c := bench.DefaultScaleConfig()
	if quick {
		c = bench.QuickScaleConfig()
	}
	if changed("files") {
		c.Files = files
	}
	if changed("dir-files") {
		c.DirFiles = dirFiles
	}
	if changed("clients") {
		c.Sessions = sessions
	}
	if changed("ds") && len(ds) > 0 {
		c.DataServers = ds[0]
	}
	if changed("timeout") {
		c.Timeout = timeout
	}
	c.Servers = "split"
	if changed("servers") {
		c.Servers = servers
	} else if profDir != "" {
		c.Servers = "up"
	}
	switch {
	case c.Servers != "up" && c.Servers != "split":
		return c, fmt.Errorf("--servers %q: want up or split", c.Servers)
	case c.Servers == "split" && profDir != "":
		return c, errors.New("scale: --cpuprofile needs --servers up")
	}
	return c, c.Validate()
}

// runScale runs the scale workload on a cluster of its own on loopback.
func runScale(ctx context.Context, cmd *cobra.Command, cfg bench.ScaleConfig, jsonOut, profDir, tmp string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the shoal binary: %w", err)
	}
	dir := filepath.Join(tmp, "scale")
	setup := bench.ScaleSetup{DataDir: dir}
	if cfg.Servers == "up" {
		setup.Cluster = &bench.ClusterProcess{Exe: exe, Dir: dir, ProfileDir: profDir}
	} else {
		setup.Cluster = &bench.ClusterSplit{Exe: exe, Dir: dir}
	}
	rep, runErr := bench.RunScale(ctx, cfg, setup)
	if rep == nil {
		return runErr
	}
	return printReport(cmd.OutOrStdout(), cmd.ErrOrStderr(), "scale", rep, jsonOut, runErr)
}

// runClassic runs the seq and small workloads against their targets.
func runClassic(ctx context.Context, cmd *cobra.Command, cfg bench.Config, s benchSetup, tmp string) error {
	out := cmd.OutOrStdout()
	var targets []bench.Target
	if s.addr != "" {
		targets = append(targets, bench.Target{Name: s.addr, Starter: bench.Existing{Addr: s.addr, Root: s.root, PID: s.serverPID}})
	} else {
		seen := map[string]bool{}
		for _, name := range strings.Split(s.targets, ",") {
			name = strings.TrimSpace(name)
			if name == "" || seen[name] {
				continue
			}
			seen[name] = true
			switch name {
			case "shoal", bench.TargetShoalAsync:
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the shoal binary: %w", err)
				}
				sp := &bench.ShoalProcess{Exe: exe, Dir: filepath.Join(tmp, name)}
				if name == bench.TargetShoalAsync {
					// knfsd's async: answered once in the metadata log.
					sp.Args = []string{"--sync=false"}
				}
				if s.profDir != "" {
					sp.CPUProfile = filepath.Join(s.profDir, name+"-serve.cpu.pprof")
				}
				targets = append(targets, bench.Target{Name: name, Starter: sp})
			case "ganesha":
				script := s.script
				if script == "" {
					script = bench.FindScript(filepath.Join("scripts", "ganesha.sh"))
				}
				targets = append(targets, bench.Target{Name: "ganesha", Starter: &bench.Ganesha{Script: script, Dir: filepath.Join(tmp, "ganesha")}})
			default:
				return fmt.Errorf("unknown target %q (want shoal, shoal-async or ganesha)", name)
			}
		}
		if len(targets) == 0 {
			return errors.New("--targets names no target")
		}
	}

	rep, runErr := bench.Run(ctx, cfg, targets)
	if rep == nil {
		return runErr
	}
	fmt.Fprintln(out)
	if err := rep.WriteTable(out); err != nil {
		return err
	}
	if s.jsonOut != "" {
		if err := writeReportJSON(s.jsonOut, rep); err != nil {
			return errors.Join(runErr, err)
		}
	}
	if ctx.Err() != nil && runErr == nil {
		runErr = ctx.Err()
	}
	return runErr
}

func writeReportJSON(path string, rep *bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteJSON(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
