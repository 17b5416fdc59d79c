package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"syscall"

	"github.com/spf13/cobra"
)

var logLevel string

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "shoal",
		Short:         "Shoal: a parallel NFS (pNFS) server and client",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("bad --log-level %q: %w", logLevel, err)
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})))
			return nil
		},
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newServeCmd())
	root.AddCommand(newMDSCmd(), newDSCmd(), newUpCmd(), newAdminCmd())
	root.AddCommand(newBenchCmd())
	root.AddCommand(newTestbedCmd())
	root.AddCommand(newMountCmd(), newUmountCmd())
	root.AddCommand(newCpCmd())
	root.AddCommand(newVersionCmd())
	addFileCmds(root)
	usageOnArgErrors(root)
	return root
}

// usageOnArgErrors makes a command given the wrong arguments say how it is
// used: the root silences cobra's full usage dump on every error, which is
// right for errors from running a command but leaves "accepts 2 arg(s),
// received 1" alone on the screen.
func usageOnArgErrors(cmd *cobra.Command) {
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				return fmt.Errorf("%w\nusage: %s (see %s --help)", err, c.UseLine(), c.CommandPath())
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		usageOnArgErrors(sub)
	}
}

// describe turns an error into a message for humans: network failures get a
// hint about what to check instead of a raw syscall error.
func describe(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		addr := ""
		if op.Addr != nil {
			addr = op.Addr.String()
		}
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return fmt.Sprintf("connection refused to %s: is a Shoal server (shoal serve, shoal up or shoal mds) listening there?", addr)
		case errors.Is(err, syscall.ETIMEDOUT), os.IsTimeout(err):
			return fmt.Sprintf("timed out connecting to %s: is the address right and reachable?", addr)
		}
	}
	return err.Error()
}
