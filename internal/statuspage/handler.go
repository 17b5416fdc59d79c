package statuspage

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"
)

//go:embed page.html static
var files embed.FS

var page = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"bytes":     formatBytes,
	"rate":      formatRate,
	"ago":       formatAgo,
	"age":       func(t, now time.Time) string { return formatDuration(max(now.Sub(t), 0)) },
	"until":     formatUntil,
	"clock":     formatClock,
	"used":      usedPercent,
	"sub":       func(a, b uint64) uint64 { return a - min(a, b) },
	"join":      strings.Join,
	"stamp":     func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"upDown":    func(up bool) string { return map[bool]string{true: "up", false: "down"}[up] },
	"kindClass": func(kind string) string { return strings.ReplaceAll(kind, " ", "-") },
	"tail":      sessionTail,
	"latency":   formatLatency,
}).ParseFS(files, "page.html"))

// snapshotTimeout bounds one snapshot, so a stuck metadata engine makes
// a slow page rather than a pile of hung requests.
const snapshotTimeout = 10 * time.Second

// Handler serves the status page of src (see the package documentation
// for its routes). Errors are logged to log (nil: slog.Default()).
func Handler(src Source, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	h := &handler{src: src, log: log}
	static, _ := fs.Sub(files, "static")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.page)
	mux.HandleFunc("GET /status.json", h.json)
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	return mux
}

type handler struct {
	src Source
	log *slog.Logger
}

func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) (*Snapshot, bool) {
	ctx, cancel := context.WithTimeout(r.Context(), snapshotTimeout)
	defer cancel()
	s, err := h.src.Snapshot(ctx)
	if err != nil {
		h.log.Warn("status page: snapshot", "err", err)
		http.Error(w, fmt.Sprintf("cluster status unavailable: %v", err), http.StatusServiceUnavailable)
		return nil, false
	}
	return s, true
}

func (h *handler) page(w http.ResponseWriter, r *http.Request) {
	s, ok := h.snapshot(w, r)
	if !ok {
		return
	}
	// Rendered to a buffer first: a template error must not leave half a
	// page behind a 200.
	var b bytes.Buffer
	if err := page.Execute(&b, s); err != nil {
		h.log.Error("status page: rendering", "err", err)
		http.Error(w, "rendering the status page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b.Bytes())
}

func (h *handler) json(w http.ResponseWriter, r *http.Request) {
	s, ok := h.snapshot(w, r)
	if !ok {
		return
	}
	b, err := json.Marshal(s)
	if err != nil {
		h.log.Error("status page: encoding", "err", err)
		http.Error(w, "encoding the status failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b)
}

// The formatting below has a twin in static/status.js, which renders the
// same tables from /status.json: change both together.

var units = []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}

// formatBytes prints n in IEC units, as the CLI does: "512 B", "1.5 KiB",
// "12 MiB".
func formatBytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v < 10 {
		return fmt.Sprintf("%.1f %s", v, units[i])
	}
	return fmt.Sprintf("%.0f %s", v, units[i])
}

// formatRate prints a throughput in bytes per second.
func formatRate(r float64) string {
	if r <= 0 || math.IsNaN(r) {
		return "0 B/s"
	}
	return formatBytes(uint64(math.Round(min(r, math.MaxUint64/2)))) + "/s"
}

// formatDuration prints d coarsely: "3 s", "4 min", "2 h", "3 d".
func formatDuration(d time.Duration) string {
	switch s := int64(d / time.Second); {
	case s < 60:
		return fmt.Sprintf("%d s", s)
	case s < 3600:
		return fmt.Sprintf("%d min", s/60)
	case s < 86400:
		return fmt.Sprintf("%d h", s/3600)
	default:
		return fmt.Sprintf("%d d", s/86400)
	}
}

// formatAgo prints how long before now t was; "never" for a zero t.
func formatAgo(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return formatDuration(max(now.Sub(t), 0)) + " ago"
}

// formatUntil prints how long after now t is.
func formatUntil(t, now time.Time) string {
	if !t.After(now) {
		return "expired"
	}
	return "in " + formatDuration(t.Sub(now))
}

// formatClock prints t's time of day in UTC, as the script does (the
// browser's zone could differ from the server's).
func formatClock(t time.Time) string { return t.UTC().Format("15:04:05") }

// usedPercent is the share of capacity in use, 0 to 100.
func usedPercent(capacity, free uint64) int {
	if capacity == 0 || free >= capacity {
		return 0
	}
	return int(math.Round(float64(capacity-free) * 100 / float64(capacity)))
}

// sessionTail shortens a session ID (hex) to its last 8 digits: the first
// ones repeat the client ID.
func sessionTail(id string) string { return id[max(len(id)-8, 0):] }

// formatLatency shows a mean completion time to three significant
// figures, or "–" when none was reported (status.js latency).
func formatLatency(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Millisecond:
		return fmt.Sprintf("%.3g µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.3g ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.3g s", d.Seconds())
}
