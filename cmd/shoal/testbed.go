package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/testbed"
)

// The testbed commands emulate a cluster on one machine with network
// namespaces and rate-limited links; see docs/testbed.md.

type testbedFlags struct {
	name, dir string
}

func (f *testbedFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.name, "name", testbed.DefaultName, "testbed name: prefix of its namespaces")
	cmd.Flags().StringVar(&f.dir, "dir", "", "testbed directory: state file, server data, logs (default $TMPDIR/NAME)")
}

func (f *testbedFlags) load() (*testbed.State, error) {
	dir := testbed.DirFor(f.name, f.dir)
	s, err := testbed.Load(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no testbed in %s: run `shoal testbed up` first", dir)
	}
	return s, err
}

func newTestbedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "testbed",
		Short: "Emulate a cluster on this machine: one network namespace and rate-limited link per role",
		Long: `Emulate a cluster on this machine (needs root, ip and tc): the MDS, each data
server and each client get a network namespace with one tc-limited link to a
switch namespace. Nothing touches the host's interfaces or routes.`,
	}
	cmd.AddCommand(newTestbedUpCmd(), newTestbedExecCmd(), newTestbedDownCmd(), newTestbedCheckCmd())
	return cmd
}

func newTestbedUpCmd() *cobra.Command {
	var (
		tf            testbedFlags
		ds, clients   int
		mirrors       int
		rate, binPath string
		storage, size string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create the namespaces and links and start the MDS and data servers",
		Example: `  shoal testbed up --ds 4 --clients 2 --rate 1gbit
  shoal testbed up --ds 4 --clients 8 --mirrors 2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if binPath == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the shoal binary: %w (pass --shoal)", err)
				}
				binPath = exe
			}
			s, err := testbed.Up(cmd.Context(), testbed.Config{
				Name: tf.name, Dir: tf.dir, DataServers: ds, Clients: clients, Mirrors: mirrors, Rate: rate,
				Storage: storage, TmpfsSize: size, Binary: binPath, Logger: slog.Default(),
			})
			if err != nil {
				return err
			}
			printTestbed(s, tf)
			return nil
		},
	}
	tf.register(cmd)
	cmd.Flags().IntVar(&ds, "ds", 2, "number of data servers")
	cmd.Flags().IntVar(&clients, "clients", 1, "number of client namespaces")
	cmd.Flags().IntVar(&mirrors, "mirrors", 1, "copies of every stripe unit, the MDS's --mirrors (1-3, at most --ds); data servers forward the extra copies to each other over their own links")
	cmd.Flags().StringVar(&rate, "rate", testbed.DefaultRate, "rate limit of every link, each direction (tc notation: 800mbit, 1gbit, ...)")
	cmd.Flags().StringVar(&binPath, "shoal", "", "shoal binary to run in the server namespaces (default: this one)")
	cmd.Flags().StringVar(&storage, "storage", testbed.StorageTmpfs, "where data servers keep file data: tmpfs (one per testbed, like each DS having its own fast disk) or disk (all share this machine's disk)")
	cmd.Flags().StringVar(&size, "tmpfs-size", testbed.DefaultTmpfsSize, "size limit of the data tmpfs")
	return cmd
}

func printTestbed(s *testbed.State, tf testbedFlags) {
	flags := ""
	if tf.name != testbed.DefaultName {
		flags += " --name " + tf.name
	}
	if tf.dir != "" {
		flags += " --dir " + tf.dir
	}
	fmt.Printf("shoal testbed %s: up, %s per link, data on %s, %s of every stripe unit, state in %s/%s\n",
		s.Name, s.Rate, s.Storage, plural(int64(s.Copies()), "copy", "copies"), s.Dir, testbed.StateFile)
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  NODE\tNAMESPACE\tIP\tSERVICE\tPID")
	for _, n := range s.Nodes {
		svc, pid := "-", "-"
		if n.Addr != "" {
			svc = n.Addr
		}
		if n.PID != 0 {
			pid = fmt.Sprint(n.PID)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", n.Name, n.Namespace, n.IP, svc, pid)
	}
	w.Flush()
	self := selfCommand()
	fmt.Printf("  files:  %s testbed exec%s c0 -- %s ls nfs://%s/\n", self, flags, self, s.MDS)
	fmt.Printf("  shell:  %s testbed exec%s c0 -- bash   ($SHOAL_TESTBED_MDS=%s)\n", self, flags, s.MDS)
	fmt.Printf("  check:  %s testbed check%s\n", self, flags)
	fmt.Printf("  stop:   %s testbed down%s\n", self, flags)
}

func newTestbedExecCmd() *cobra.Command {
	var tf testbedFlags
	cmd := &cobra.Command{
		Use:     "exec NODE -- CMD [ARG...]",
		Short:   "Run a command in a node's namespace (mds, ds0.., c0..)",
		Example: "  shoal testbed exec c0 -- shoal ls nfs://10.77.0.1/",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return errors.New("usage: shoal testbed exec NODE -- CMD [ARG...]")
			}
			s, err := tf.load()
			if err != nil {
				return err
			}
			c, err := s.Command(context.Background(), args[0], args[1:]...)
			if err != nil {
				return err
			}
			// Hand the terminal over: the command gets our stdio and we
			// become it, so its exit status and signals are its own.
			return syscall.Exec(c.Path, c.Args, c.Env)
		},
	}
	tf.register(cmd)
	return cmd
}

func newTestbedDownCmd() *cobra.Command {
	var tf testbedFlags
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop the testbed's servers and delete its namespaces (safe to repeat)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Finish tearing down even if interrupted again.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 2*time.Minute)
			defer cancel()
			if err := testbed.Down(ctx, tf.name, tf.dir, slog.Default()); err != nil {
				return err
			}
			fmt.Printf("shoal testbed %s: down\n", tf.name)
			return nil
		},
	}
	tf.register(cmd)
	return cmd
}

func newTestbedCheckCmd() *cobra.Command {
	var (
		tf    testbedFlags
		rates string
		secs  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Measure every link's throughput and the aggregate, and say which rate this machine sustains",
		Example: `  shoal testbed check
  shoal testbed check --rates 800mbit,1gbit,2gbit --duration 3s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := tf.load()
			if err != nil {
				return err
			}
			list := []testbed.Rate{s.RateBits}
			if rates != "" {
				list = nil
				for _, r := range strings.Split(rates, ",") {
					v, err := testbed.ParseRate(r)
					if err != nil {
						return err
					}
					list = append(list, v)
				}
			}
			var best testbed.Rate
			for _, r := range list {
				fmt.Printf("== %s per link, %s per test ==\n", r, secs)
				fmt.Printf("%-12s %5s %9s %9s %8s %9s %5s\n", "test", "flows", "Mbit/s", "ideal", "of ideal", "slowest", "cpu")
				fmt.Printf("%-12s %5s %9s %9s %8s %9s %5s\n", "", "", "total", "Mbit/s", "", "flow", "busy")
				rep, err := testbed.Check(cmd.Context(), s, r, secs, func(row testbed.CheckRow) {
					slowest := -1.0
					for _, f := range row.Results {
						if v := f.BitsPerSec(); slowest < 0 || v < slowest {
							slowest = v
						}
					}
					note := ""
					if row.Tries > 1 {
						note = fmt.Sprintf("  (best of %d)", row.Tries)
					}
					if row.Ceiling {
						note += "  (ceiling, not in verdict)"
					}
					fmt.Printf("%-12s %5d %9.0f %9.0f %7.1f%% %9.0f %4.0f%%%s\n", row.Test, len(row.Results),
						row.Total()/1e6, row.Ideal/1e6, 100*row.Efficiency(), slowest/1e6, 100*row.CPUBusy, note)
				})
				if err != nil {
					return err
				}
				if rep.Sustains() {
					fmt.Printf("-> %s: sustained (every test at least %.0f%% of ideal)\n", r, 100*testbed.Sustained)
					if r > best {
						best = r
					}
				} else {
					fmt.Printf("-> %s: NOT sustained (some test below %.0f%% of ideal: CPU-bound or a busy machine)\n", r, 100*testbed.Sustained)
				}
				if c, ok := rep.Ceiling(); ok {
					if c.Efficiency() >= testbed.Sustained {
						fmt.Printf("   all %d links full at once: %.2f Gbit/s, not CPU-bound\n", len(c.Results), c.Total()/1e9)
					} else {
						fmt.Printf("   all %d links full at once: %.2f Gbit/s of %.2f: CPU-bound; keep a benchmark's total traffic below ~%.1f Gbit/s\n",
							len(c.Results), c.Total()/1e9, c.Ideal/1e9, c.Total()/1e9)
					}
				}
			}
			if best == 0 {
				return fmt.Errorf("no tested rate is sustained by this machine with %d nodes; try a lower --rate or fewer nodes", len(s.Nodes))
			}
			fmt.Printf("highest sustained rate with %d nodes: %s per link\n", len(s.Nodes), best)
			return nil
		},
	}
	tf.register(cmd)
	cmd.Flags().StringVar(&rates, "rates", "", "comma-separated rates to try (default: the testbed's own rate); the links are restored afterwards")
	cmd.Flags().DurationVar(&secs, "duration", 3*time.Second, "length of each test")
	return cmd
}
