package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/statuspage"
)

// webServer is a server's HTTP listener (--http): Prometheus metrics at
// /metrics, and on a metadata server the status page at / and
// /status.json. One listener for both, so an operator opens one port.
type webServer struct {
	reg *prometheus.Registry
	mux *http.ServeMux
	url string // http://HOST:PORT/
	// src is the status page's source: an elected MDS serves a new one
	// each term it leads, behind the one handler.
	src atomic.Pointer[statuspage.Source]
}

// Snapshot makes the web server the status page's source, passing on to
// the current term's.
func (w *webServer) Snapshot(ctx context.Context) (*statuspage.Snapshot, error) {
	return (*w.src.Load()).Snapshot(ctx)
}

// startWeb serves metrics on addr and returns the server, whose registry
// the servers register their collectors with; "" disables it (nil, which
// the methods accept).
func startWeb(addr string) (*webServer, error) {
	if addr == "" {
		return nil, nil
	}
	w := &webServer{reg: prometheus.NewRegistry(), mux: http.NewServeMux()}
	w.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve HTTP on %s: %w", addr, err)
	}
	w.url = fmt.Sprintf("http://%s/", ln.Addr())
	w.mux.Handle("GET /metrics", promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{}))
	go func() {
		if err := http.Serve(ln, w.mux); err != nil && !errors.Is(err, net.ErrClosed) {
			slog.Warn("http server", "err", err)
		}
	}()
	slog.Info("metrics", "url", w.url+"metrics")
	return w, nil
}

// registerer returns the registry for the servers' collectors; nil (not
// an interface holding a nil pointer) without --http.
func (w *webServer) registerer() prometheus.Registerer {
	if w == nil {
		return nil
	}
	return w.reg
}

// serveStatus adds the status page of src. The listener is up before the
// MDS is (the MDS registers its collectors on start), so until this runs
// the page is a 404.
func (w *webServer) serveStatus(src statuspage.Source) {
	if w == nil {
		return
	}
	if w.src.Swap(&src) != nil {
		return // the handler is in place
	}
	h := statuspage.Handler(w, slog.Default())
	w.mux.Handle("GET /{$}", h)
	w.mux.Handle("GET /status.json", h)
	w.mux.Handle("GET /static/", h)
}

// statusURL is the status page's address, "" without --http.
func (w *webServer) statusURL() string {
	if w == nil {
		return ""
	}
	return w.url
}

// httpFlag defines --http, and --metrics as its deprecated alias (the
// flag's name before the listener served more than metrics).
func httpFlag(cmd *cobra.Command, addr *string, usage string) {
	cmd.Flags().StringVar(addr, "http", "", usage)
	cmd.Flags().StringVar(addr, "metrics", "", usage)
	_ = cmd.Flags().MarkDeprecated("metrics", "use --http")
}

// startMetrics serves Prometheus metrics on addr ("" disables them) and
// returns the registry servers register their collectors with, for the
// servers that have no status page (shoal ds and serve).
func startMetrics(addr string) (*prometheus.Registry, error) {
	w, err := startWeb(addr)
	if err != nil || w == nil {
		return nil, err
	}
	return w.reg, nil
}

// registerer converts a possibly nil registry without producing a non-nil
// interface holding a nil pointer.
func registerer(r *prometheus.Registry) prometheus.Registerer {
	if r == nil {
		return nil
	}
	return r
}

// statusAttr is the status page's address for a ready log line; an empty
// attribute, which slog leaves out, without --http.
func statusAttr(w *webServer) slog.Attr {
	if w == nil {
		return slog.Attr{}
	}
	return slog.String("status", w.url)
}
