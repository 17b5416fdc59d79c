package pcopy

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// Report writes progress() to w every interval until ctx ends, then once
// more if it wrote anything (a copy shorter than interval, or one that
// failed at once, shows no progress). On a terminal (tty) it redraws one
// status line in place; on anything else it prints a plain line each
// time, for logs.
func Report(ctx context.Context, w io.Writer, tty bool, interval time.Duration, progress func() Progress) {
	t := time.NewTicker(interval)
	defer t.Stop()
	wrote := false
	for {
		select {
		case <-ctx.Done():
			if !wrote {
				return
			}
			if tty {
				fmt.Fprintf(w, "\r%s\x1b[K\n", FormatProgress(progress(), true))
			} else {
				fmt.Fprintln(w, FormatProgress(progress(), false))
			}
			return
		case <-t.C:
			wrote = true
			if tty {
				fmt.Fprintf(w, "\r%s\x1b[K", FormatProgress(progress(), true))
			} else {
				fmt.Fprintln(w, FormatProgress(progress(), false))
			}
		}
	}
}

// FormatProgress renders a progress snapshot: a bar for terminals, or a
// plain line. The rate counts only bytes this run copied, so a resumed
// copy's ETA is not flattered by what an earlier run did.
func FormatProgress(p Progress, bar bool) string {
	var b strings.Builder
	pct := 0.0
	if p.TotalBytes > 0 {
		pct = float64(p.Bytes) / float64(p.TotalBytes)
	} else if !p.Scanning && p.TotalFiles == p.Files {
		pct = 1
	}
	if bar {
		const width = 24
		fill := int(pct * width)
		b.WriteString("[" + strings.Repeat("#", fill) + strings.Repeat(".", width-fill) + "] ")
	}
	rate := 0.0
	if s := p.Elapsed.Seconds(); s > 0 {
		rate = float64(p.Copied) / s
	}
	fmt.Fprintf(&b, "%3.0f%% %s/%s  %d/%d files  %.1f MB/s", pct*100, FormatBytes(p.Bytes), FormatBytes(p.TotalBytes),
		p.Files, p.TotalFiles, rate/1e6)
	switch {
	case p.Scanning:
		b.WriteString("  scanning...")
	case rate > 0 && p.TotalBytes > p.Bytes:
		eta := time.Duration(float64(p.TotalBytes-p.Bytes) / rate * float64(time.Second))
		fmt.Fprintf(&b, "  ETA %s", formatDuration(eta))
	default:
		fmt.Fprintf(&b, "  %s", formatDuration(p.Elapsed))
	}
	return b.String()
}

// FormatBytes renders n in binary units (KiB, MiB, ...).
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func formatDuration(d time.Duration) string {
	d = d.Round(time.Second)
	h, m, s := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60
	if h > 0 {
		return fmt.Sprintf("%d:%02d:%02d", h, m, s)
	}
	return fmt.Sprintf("%d:%02d", m, s)
}
