package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/spf13/cobra"
)

// addPprofFlag gives a long-running command (shoal mds, shoal ds, shoal
// mount) an opt-in --pprof ADDR that serves Go's runtime profiles
// (/debug/pprof/) while it runs, so that each process of a cluster can be
// profiled in place during a benchmark:
//
//	go tool pprof -top 'http://127.0.0.1:6060/debug/pprof/profile?seconds=10'
//
// Profiles show the process's internals and cost CPU while taken, so the
// address must be a loopback one; the handlers are on a mux of their own,
// never on http.DefaultServeMux.
func addPprofFlag(cmd *cobra.Command) {
	var addr string
	cmd.Flags().StringVar(&addr, "pprof", "", "serve Go runtime profiles (/debug/pprof/) on this loopback address, e.g. 127.0.0.1:6060 (off by default)")
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if addr != "" {
			_, stop, err := servePprof(addr)
			if err != nil {
				return err
			}
			defer stop()
		}
		return run(cmd, args)
	}
}

// servePprof listens on addr, a loopback address, and serves the pprof
// handlers until stop is called; bound is the address it listens on.
func servePprof(addr string) (bound string, stop func(), err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, fmt.Errorf("--pprof %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", nil, fmt.Errorf("--pprof %q: want a loopback address (127.0.0.1:PORT or [::1]:PORT)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("pprof server", "addr", ln.Addr().String(), "err", err)
		}
	}()
	slog.Info("serving profiles", "url", "http://"+ln.Addr().String()+"/debug/pprof/")
	return ln.Addr().String(), func() { srv.Close() }, nil
}
