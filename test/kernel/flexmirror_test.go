package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The shoal-flex-mirror kind's outage of one data server (issue 25): a
// flexfiles export with 2 copies, the client writing both mirrors, and a
// kill -9 of a data server that holds a copy while dd writes. The Linux
// client must report the failed I/O itself (LAYOUTERROR with NFSv4.2, the
// ff_ioerr4 of LAYOUTRETURN with 4.1), the MDS marks the copy stale, and
// when the data server comes back (same directory, same port) healing
// resyncs the copy onto it. The MDS runs with a long --ds-down-after, so
// that healing waits for the data server rather than copying the file
// elsewhere.
//
// What the kernel does (fs/nfs/flexfilelayout/flexfilelayout.c): a WRITE
// to the dead data server fails with a connection error (the reconnect is
// refused; the DS RPC client is SOFTCONN), which ff_layout_io_track_ds_error
// records as NFS4ERR_NXIO for that mirror's device and marks the layout
// for return. The layouts carry FF_FLAGS_NO_IO_THRU_MDS
// (flexReportArgs), so the write is resent through pNFS rather than the
// MDS, and ff_layout_write_release first sends the recorded errors in a
// LAYOUTERROR (only with NFS_CAP_LAYOUTERROR, i.e. NFSv4.2); with 4.1 they
// go in the LAYOUTRETURN. The MDS recalls the layouts of a leaving data
// server only 5 s later, so its recall does not overtake the failing
// write. docs/flexfiles.md has the runs.

// flexDownAfter is the MDS's --ds-down-after for the flexfiles outage:
// far longer than the outage, so healing waits for the data server.
const flexDownAfter = "10m"

// flexReportArgs make the client's report come first (server.Export
// FlexNoIOThruMDS, FlexRecallDelay): the layouts say not to resend
// through the MDS, whose own write would otherwise mark the copy stale
// before the client's LAYOUTRETURN arrives, and the MDS recalls them only
// 5 s after the data server left, so that the recall does not overtake
// the failing write (with 4.1, Linux 6.1 then reported nothing at all).
var flexReportArgs = []string{"--flex-no-io-thru-mds", "--flex-recall-delay", "5s"}

// flexOutage is what the driver saw of the outage.
type flexOutage struct {
	victim string
	// errors are the victim's shoal_pnfs_layout_errors_total series,
	// by "STATUS/OP"; staled its shoal_pnfs_flex_copies_staled_total,
	// by reason; staleCopies shoal_cluster_stale_copies while it was
	// down.
	errors      map[string]float64
	staled      map[string]float64
	staleCopies float64
	// After the data server's return: healing's counters, the scrub of
	// every copy, and the bytes in each data server's store directory.
	healedFiles, healBytes float64
	scrub                  scrubJob
	storeBytes             map[string]int64
	healed                 *adminStatus
}

// scrubJob is the part of `shoal admin scrub --wait --json` the test reads.
type scrubJob struct {
	Files  int   `json:"files"`
	Failed int   `json:"failed"`
	Chunks int64 `json:"chunks"`
	Bad    int   `json:"bad"`
}

// reported is the victim's error reports, "STATUS/OP=N ...".
func (o *flexOutage) reported() string { return formatCounts(o.errors) }

// staledBy is the copies marked stale on the victim, "REASON=N ...".
func (o *flexOutage) staledBy() string { return formatCounts(o.staled) }

func formatCounts(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.0f", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// reports reads the MDS's metrics about data server id: the errors
// clients reported for it, the copies marked stale on those reports, and
// the stale copies in the cluster.
func (g *growCluster) reports(ctx context.Context, o *flexOutage) error {
	s, err := scrape(ctx, g.metrics)
	if err != nil {
		return err
	}
	o.errors, o.staled = map[string]float64{}, map[string]float64{}
	for _, smp := range s {
		if smp.labels["ds"] != o.victim || smp.value == 0 {
			continue
		}
		switch smp.name {
		case "shoal_pnfs_layout_errors_total":
			o.errors[smp.labels["status"]+"/"+smp.labels["op"]] += smp.value
		case "shoal_pnfs_flex_copies_staled_total":
			o.staled[smp.labels["reason"]] += smp.value
		}
	}
	o.staleCopies = s.get("shoal_cluster_stale_copies")
	return nil
}

// waitReported waits until a client has reported an error about the
// victim and its copy is stale.
func (g *growCluster) waitReported(ctx context.Context, o *flexOutage, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := g.reports(ctx, o)
		if err == nil && len(o.errors) > 0 && o.staleCopies > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: errors reported for %s: [%s], its copies marked stale: [%s], stale copies %.0f (%v)",
				timeout, o.victim, o.reported(), o.staledBy(), o.staleCopies, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// restartDS starts a killed data server again (same directory and port)
// and waits until the MDS has it in service.
func (g *growCluster) restartDS(ctx context.Context, d *growDS) error {
	if err := d.Start(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := g.status(ctx)
		if err == nil {
			if s, ok := st.ds(d.id); ok && s.Up {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("data server %s not in service a minute after its restart (%v)", d.id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitHealedOnto waits until no stripe is degraded and the data servers
// hold two copies of the file between them, the victim its part again.
func (g *growCluster) waitHealedOnto(ctx context.Context, victim string, timeout time.Duration) (*adminStatus, error) {
	deadline := time.Now().Add(timeout)
	var last *adminStatus
	var lastErr error
	for time.Now().Before(deadline) {
		st, err := g.status(ctx)
		if err == nil {
			last = st
			var total uint64
			for _, d := range st.DataServers {
				total += d.Bytes
			}
			v, ok := st.ds(victim)
			if st.Replication.DegradedStripes == 0 && st.Replication.DegradedFiles == 0 &&
				total == 2*mirrorSize && ok && v.Up && v.Bytes > 0 {
				return st, nil
			}
		}
		lastErr = err
		time.Sleep(250 * time.Millisecond)
	}
	if last == nil {
		return nil, fmt.Errorf("not healed after %v: %v", timeout, lastErr)
	}
	return last, fmt.Errorf("not healed onto %s after %v (want no degraded stripes, two copies in all, part of them on %s); status:\n%s",
		victim, timeout, victim, last)
}

// scrub runs `shoal admin scrub --wait --json`: every copy of every
// replicated file checked against the others.
func (g *growCluster) scrub(ctx context.Context) (scrubJob, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, "admin", "scrub", "--wait", "--json", "--mds", fmt.Sprintf("127.0.0.1:%d", g.mds.port),
		"--join-secret-file", g.secretFile())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return scrubJob{}, fmt.Errorf("shoal admin scrub: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var j scrubJob
	if err := json.Unmarshal(out, &j); err != nil {
		return scrubJob{}, fmt.Errorf("shoal admin scrub --json: %w\n%s", err, out)
	}
	return j, nil
}

// dirBytes is the size of the regular files under dir.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			info, err := e.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}

// flexHeal is the driver's "mirror-heal" step on a flexfiles export:
// the client's report and the stale copy, then the data server's return,
// healing onto it, a scrub, and the store sizes.
func (g *growCluster) flexHeal(ctx context.Context, o *flexOutage, victim *growDS) error {
	if err := g.waitReported(ctx, o, time.Minute); err != nil {
		return err
	}
	if err := g.restartDS(ctx, victim); err != nil {
		return err
	}
	st, err := g.waitHealedOnto(ctx, o.victim, 4*time.Minute)
	if err != nil {
		return err
	}
	o.healed = st
	// The map switches before the healer counts the file: wait for
	// the count.
	for deadline := time.Now().Add(30 * time.Second); ; {
		s, err := scrape(ctx, g.metrics)
		if err != nil {
			return err
		}
		o.healedFiles, o.healBytes = s.get("shoal_cluster_healed_files_total"), s.get("shoal_cluster_heal_bytes_total")
		if o.healedFiles > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if o.scrub, err = g.scrub(ctx); err != nil {
		return err
	}
	o.storeBytes = map[string]int64{}
	for _, d := range g.ds {
		n, err := dirBytes(filepath.Join(d.dir, "data"))
		if err != nil {
			return err
		}
		o.storeBytes[d.id] = n
	}
	return nil
}

// holder is the data server other than not that holds the most bytes:
// the one a second kill leaves the file to the healed copy on.
func holder(st *adminStatus, ds []*growDS, not string) *growDS {
	var best *growDS
	var most uint64
	for _, d := range ds {
		if s, ok := st.ds(d.id); ok && d.id != not && s.Up && (best == nil || s.Bytes > most) {
			best, most = d, s.Bytes
		}
	}
	return best
}
