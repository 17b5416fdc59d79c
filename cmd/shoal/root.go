package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/shoalfs/shoal/client"
)

var logLevel string

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "shoal",
		Short:         "Shoal: a parallel NFS (pNFS) server and client",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return setLogLevel(logLevel)
		},
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newServeCmd())
	mds, ds, up, mount := newMDSCmd(), newDSCmd(), newUpCmd(), newMountCmd()
	for _, c := range []*cobra.Command{mds, ds, up, mount} {
		addPprofFlag(c)
	}
	root.AddCommand(mds, ds, up, newAdminCmd())
	root.AddCommand(newVIPCmd())
	root.AddCommand(newBenchCmd())
	root.AddCommand(newTestbedCmd())
	root.AddCommand(mount, newUmountCmd())
	root.AddCommand(newCpCmd())
	root.AddCommand(newVersionCmd())
	addFileCmds(root)
	usageOnArgErrors(root)
	return root
}

// setLogLevel sets up the default logger at a level named as --log-level
// names it. It runs again when a server's configuration file sets
// log_level.
func setLogLevel(level string) error {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("bad --log-level %q: %w", level, err)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})))
	return nil
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

// describe turns an error into a message for humans: failures to reach or
// recognise a server, and listen addresses in use, get a hint about what to
// check instead of a raw syscall error.
func describe(err error) string {
	const servers = "shoal serve, shoal up or shoal mds"
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		addr := ""
		if op.Addr != nil {
			addr = op.Addr.String()
		}
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return fmt.Sprintf("connection refused to %s: is a Shoal server (%s) listening there?", addr, servers)
		case errors.Is(err, syscall.ETIMEDOUT), os.IsTimeout(err):
			return fmt.Sprintf("timed out connecting to %s: is the address right and reachable?", addr)
		}
	}
	if errors.As(err, &op) && op.Op == "listen" && errors.Is(err, syscall.EADDRINUSE) && op.Addr != nil {
		return fmt.Sprintf("%s is in use by another process (another shoal server?): stop it, or choose another address", op.Addr)
	}
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		// Servers started by this binary claim their --dir first
		// (claimDir), so this is another process on the same database
		// through another directory, such as `shoal mds --dir D/mds`
		// beside `shoal up --dir D`.
		return err.Error() + "\n  hint: another process has this metadata database open (a shoal server using the same directory?): stop it, or use another --dir"
	case errors.Is(err, client.ErrNotNFS):
		return fmt.Sprintf("%s: is that the address of a Shoal server (%s)?", err, servers)
	case errors.Is(err, client.ErrDataServer):
		return strings.Replace(err.Error(), client.ErrDataServer.Error(),
			"use the metadata server's address instead (the MDS address that shoal up or shoal mds printed)", 1)
	}
	return err.Error()
}

// checkAddr checks the port of a HOST:PORT flag before anything starts, so
// that a typo reads "--listen 127.0.0.1:99999: port 99999 is not a number
// from 0 to 65535" rather than the net package's "listen on ...: listen
// tcp: address 99999: invalid port". Port 0 (any free port) is allowed
// where listening, not where dialing.
func checkAddr(flag, addr string, listen bool) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %s: want HOST:PORT, such as 127.0.0.1:2049", flag, addr)
	}
	low := 1
	if listen {
		low = 0
	}
	if n, err := strconv.Atoi(port); err != nil || n < low || n > 65535 {
		return fmt.Errorf("%s %s: port %s is not a number from %d to 65535", flag, addr, port, low)
	}
	return nil
}
