package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// startMetrics serves Prometheus metrics on addr ("" disables them) and
// returns the registry servers register their collectors with.
func startMetrics(addr string) (*prometheus.Registry, error) {
	if addr == "" {
		return nil, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	go func() {
		if err := http.Serve(ln, mux); err != nil && !errors.Is(err, net.ErrClosed) {
			slog.Warn("metrics server", "err", err)
		}
	}()
	slog.Info("metrics", "url", fmt.Sprintf("http://%s/metrics", ln.Addr()))
	return reg, nil
}

// registerer converts a possibly nil registry without producing a non-nil
// interface holding a nil pointer.
func registerer(r *prometheus.Registry) prometheus.Registerer {
	if r == nil {
		return nil
	}
	return r
}
