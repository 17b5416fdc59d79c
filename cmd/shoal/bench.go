package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/bench"
)

func newBenchCmd() *cobra.Command {
	var (
		targets, size, block, addr, root, jsonOut, profDir, script string
		groups                                                     []string
		depth, files, reps, serverPID                              int
		timeout                                                    time.Duration
		quick, keep                                                bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark shoal serve against NFS-Ganesha on this machine",
		Long: `bench starts each target server on a free 127.0.0.1 port in a temporary
directory (Shoal as a child "shoal serve", NFS-Ganesha through
scripts/ganesha.sh), drives it with Shoal's client and prints, per target:
sequential write and read throughput of one file, and small-file create,
stat and remove rates. Each number is the median of --reps runs with the
minimum and maximum. With --addr it benchmarks a running server instead.`,
		Example: `  shoal bench
  shoal bench --quick --targets shoal
  shoal bench --size 1GiB --block 1MiB --reps 3 --json out.json --cpuprofile prof/
  shoal bench --addr 127.0.0.1:2049 --root /export`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg := bench.DefaultConfig()
			if quick {
				cfg = bench.QuickConfig()
			}
			f := cmd.Flags()
			var err error
			if f.Changed("size") || !quick {
				if cfg.Size, err = bench.ParseSize(size); err != nil {
					return fmt.Errorf("--size: %w", err)
				}
			}
			b, err := bench.ParseSize(block)
			if err != nil {
				return fmt.Errorf("--block: %w", err)
			}
			cfg.Block = int(min(b, 1<<30))
			cfg.Depth, cfg.Timeout, cfg.Groups = depth, timeout, groups
			if f.Changed("files") || !quick {
				cfg.Files = files
			}
			if f.Changed("reps") || !quick {
				cfg.Reps = reps
			}
			cfg.Progress = cmd.ErrOrStderr()
			if err := cfg.Validate(); err != nil {
				return err
			}
			return runBench(cmd.Context(), cmd, cfg, benchSetup{
				targets: targets, addr: addr, root: root, jsonOut: jsonOut,
				profDir: profDir, script: script, keep: keep,
				targetsSet: f.Changed("targets"), serverPID: serverPID,
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&targets, "targets", "shoal,ganesha", "comma-separated servers to start and benchmark: shoal, ganesha")
	fl.StringVar(&addr, "addr", "", "benchmark the already running server at host:port instead of starting any")
	fl.StringVar(&root, "root", "/", "with --addr: directory of the server's pseudo file system to work in (Ganesha: /export)")
	fl.IntVar(&serverPID, "server-pid", 0, "with --addr: pid of the server if it runs on this machine, to report its CPU time")
	fl.StringVar(&size, "size", "1GiB", "size of the sequentially written and read file")
	fl.StringVar(&block, "block", "1MiB", "size of each READ and WRITE request")
	fl.IntVar(&depth, "depth", 16, "sequential READ/WRITE requests in flight at once")
	fl.IntVar(&files, "files", 2000, "number of files for the create, stat and remove rates")
	fl.IntVar(&reps, "reps", 3, "repetitions of each measurement (the median is reported)")
	fl.StringSliceVar(&groups, "workloads", nil, "workload groups to run: seq (write+read), small (create, stat, remove); default all")
	fl.DurationVar(&timeout, "timeout", 10*time.Minute, "limit for the whole run")
	fl.BoolVar(&quick, "quick", false, "smoke run: 64MiB, 200 files, 1 rep (explicit flags still win)")
	fl.StringVar(&jsonOut, "json", "", "also write the report as JSON to this file")
	fl.StringVar(&profDir, "cpuprofile", "", "write CPU profiles of the Shoal server and of this client into this directory")
	fl.StringVar(&script, "ganesha-script", "", "path of scripts/ganesha.sh (default: looked up from the working directory)")
	fl.BoolVar(&keep, "keep", false, "keep the servers' temporary directories (data, logs) for inspection")
	return cmd
}

type benchSetup struct {
	targets, addr, root, jsonOut, profDir, script string
	keep, targetsSet                              bool
	serverPID                                     int
}

func runBench(ctx context.Context, cmd *cobra.Command, cfg bench.Config, s benchSetup) error {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
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
			case "shoal":
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the shoal binary: %w", err)
				}
				sp := &bench.ShoalProcess{Exe: exe, Dir: filepath.Join(tmp, "shoal")}
				if s.profDir != "" {
					sp.CPUProfile = filepath.Join(s.profDir, "shoal-serve.cpu.pprof")
				}
				targets = append(targets, bench.Target{Name: "shoal", Starter: sp})
			case "ganesha":
				script := s.script
				if script == "" {
					script = bench.FindScript(filepath.Join("scripts", "ganesha.sh"))
				}
				targets = append(targets, bench.Target{Name: "ganesha", Starter: &bench.Ganesha{Script: script, Dir: filepath.Join(tmp, "ganesha")}})
			default:
				return fmt.Errorf("unknown target %q (want shoal or ganesha)", name)
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
