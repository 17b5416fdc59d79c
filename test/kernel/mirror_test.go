package kernel

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The shoal-pnfs-mirror kind: `shoal mds --mirrors 2` and three `shoal ds`
// processes. The guest (workload phase "mirror") writes a 64 MiB file with
// dd; while dd runs, the driver kill -9s one data server. dd must exit 0
// and the file must read back identical from a fresh mount. The driver
// then waits until `shoal admin status` has reported degraded stripes and
// healing has brought every stripe back to two copies on the survivors,
// kills a second data server, and the guest reads the file back once
// more. The mount must keep the files layout throughout.

const (
	mirrorDS   = 3
	mirrorSize = 64 << 20
)

// mirrorWatch polls `shoal admin status` in the background from the first
// kill on, so that degraded stripes are seen even if healing is quick.
type mirrorWatch struct {
	mu          sync.Mutex
	maxDegraded int
	lastStatus  *adminStatus
	lastErr     error
	stop, done  chan struct{}
}

func (w *mirrorWatch) run(ctx context.Context, g *growCluster) {
	defer close(w.done)
	for {
		st, err := g.status(ctx)
		w.mu.Lock()
		w.lastErr = err
		if err == nil {
			w.lastStatus = st
			w.maxDegraded = max(w.maxDegraded, st.Replication.DegradedStripes)
		}
		w.mu.Unlock()
		select {
		case <-w.stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (w *mirrorWatch) snapshot() (int, *adminStatus, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxDegraded, w.lastStatus, w.lastErr
}

// killDS kill -9s data server d and waits until the MDS has it out of
// service.
func (g *growCluster) killDS(ctx context.Context, d *growDS) error {
	if err := d.Kill(); err != nil {
		return fmt.Errorf("kill -9 %s: %w", d.name, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := g.status(ctx)
		if err == nil {
			if s, ok := st.ds(d.id); ok && !s.Up {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("data server %s still in service a minute after kill -9 (%v)", d.id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitHealed waits until the status shows no degraded stripe and no heal
// running, and every survivor in survivors holding the whole file.
func (g *growCluster) waitHealed(ctx context.Context, survivors []*growDS, timeout time.Duration) (*adminStatus, error) {
	deadline := time.Now().Add(timeout)
	var last *adminStatus
	var lastErr error
	for time.Now().Before(deadline) {
		st, err := g.status(ctx)
		if err == nil {
			last = st
			ok := st.Replication.DegradedStripes == 0 && st.Replication.DegradedFiles == 0
			for _, d := range survivors {
				s, found := st.ds(d.id)
				ok = ok && found && s.Bytes == mirrorSize
			}
			if ok {
				return st, nil
			}
		}
		lastErr = err
		time.Sleep(250 * time.Millisecond)
	}
	if last == nil {
		return nil, fmt.Errorf("not healed after %v: %v", timeout, lastErr)
	}
	return last, fmt.Errorf("not healed after %v (want no degraded stripes and the whole file on each survivor); status:\n%s", timeout, last)
}

// testMirror runs the mirror phase; with flex the export hands out
// flexfiles layouts (the shoal-flex-mirror kind): the client writes both
// copies, and the data server killed first is one that holds a copy of
// the file (a client that cannot stripe a mirror gets it placed on two of
// the three). The client must report the failure itself, and the killed
// data server is restarted and healed (flexmirror_test.go) rather than
// healed around; the second kill is of the other data server holding the
// file, so that the last read comes from the healed copy.
func testMirror(t *testing.T, shoalBin string, img images, vmTimeout time.Duration, vers, out string, flex bool) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGrowCluster(shoalBin, filepath.Join(out, "server"), port)
	if err != nil {
		t.Fatal(err)
	}
	// Two copies of every stripe; a data server out of service for 3 s
	// is healed around. On a flexfiles export the killed data server
	// comes back instead, and healing waits for it (flexmirror_test.go).
	downAfter := "3s"
	if flex {
		downAfter = flexDownAfter
	}
	g.mds.argv = append(g.mds.argv, "--mirrors", "2", "--ds-down-after", downAfter)
	if flex {
		g.mds.argv = append(g.mds.argv, "--layout", "flexfiles")
		g.mds.argv = append(g.mds.argv, flexReportArgs...)
	}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		if err := g.Stop(); err != nil && !strings.Contains(err.Error(), "killed") {
			t.Logf("stop cluster: %v", err)
		}
	})
	if err := g.mds.Start(ctx); err != nil {
		t.Fatalf("start MDS: %v", err)
	}
	for range mirrorDS {
		if _, err := g.addDS(ctx); err != nil {
			t.Fatalf("start data server: %v", err)
		}
	}
	if _, err := g.waitUp(ctx, mirrorDS, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("server: %s; artifacts in %s", g.Describe(), out)

	w := &mirrorWatch{stop: make(chan struct{}), done: make(chan struct{})}
	watching := false
	defer func() {
		if watching {
			close(w.stop)
			<-w.done
		}
	}()
	var errs []error
	var healed *adminStatus
	maxDegraded := 0
	survivors := []*growDS{g.ds[0], g.ds[1]}
	var outage *flexOutage
	var victim *growDS
	hook := func(line string) string {
		m := syncRE.FindStringSubmatch(line)
		if m == nil {
			return ""
		}
		tag := m[1]
		fail := func(err error) string {
			errs = append(errs, fmt.Errorf("SYNC %s: %w", tag, err))
			return "ERR " + tag + " " + strings.Join(strings.Fields(err.Error()), " ")
		}
		switch tag {
		case "mirror-kill":
			victim = g.ds[2]
			if flex {
				// The last data server the client has written to (its
				// own counter; the status's per-server file counts
				// follow heartbeats) goes first; the other two are the
				// survivors.
				victim = nil
				for i := len(g.ds) - 1; i >= 0 && victim == nil; i-- {
					s, err := scrape(ctx, g.ds[i].metrics)
					if err != nil {
						return fail(err)
					}
					if s.get("shoal_nfs_bytes_total", "dir", "write") > 0 {
						victim = g.ds[i]
					}
				}
				if victim == nil {
					return fail(fmt.Errorf("no data server has taken a write from the client"))
				}
				survivors = slices.DeleteFunc(slices.Clone(g.ds), func(d *growDS) bool { return d == victim })
			}
			if err := g.killDS(ctx, victim); err != nil {
				return fail(err)
			}
			t.Logf("killed data server %s (kill -9) while dd was writing", victim.id)
			outage = &flexOutage{victim: victim.id}
			watching = true
			go w.run(ctx, g)
		case "mirror-heal":
			if flex {
				if outage == nil {
					return fail(fmt.Errorf("no data server was killed"))
				}
				err := g.flexHeal(ctx, outage, victim)
				maxDegraded, _, _ = w.snapshot()
				t.Logf("errors clients reported for %s: [%s]; its copies marked stale: [%s]; stale copies while it was down: %.0f",
					outage.victim, outage.reported(), outage.staledBy(), outage.staleCopies)
				if err != nil {
					return fail(err)
				}
				healed = outage.healed
				t.Logf("%s restarted and healed (%.0f files, %.0f bytes copied); status:\n%s", victim.id, outage.healedFiles, outage.healBytes, healed)
				t.Logf("scrub: %d files, %d chunks, %d bad, %d failed; bytes in each store: %v",
					outage.scrub.Files, outage.scrub.Chunks, outage.scrub.Bad, outage.scrub.Failed, outage.storeBytes)
				break
			}
			st, err := g.waitHealed(ctx, survivors, 4*time.Minute)
			if err != nil {
				return fail(err)
			}
			healed = st
			maxDegraded, _, _ = w.snapshot()
			t.Logf("healed; status:\n%s", st)
		case "mirror-kill2":
			second := survivors[1]
			if flex {
				// The other holder of the file: reads must then come
				// from the copy healed onto the restarted data server.
				if healed == nil {
					return fail(fmt.Errorf("not healed"))
				}
				if second = holder(healed, g.ds, victim.id); second == nil {
					return fail(fmt.Errorf("no other data server holds the file; status:\n%s", healed))
				}
			}
			if err := g.killDS(ctx, second); err != nil {
				return fail(err)
			}
			t.Logf("killed a second data server %s (kill -9)", second.id)
		}
		return "OK " + tag
	}
	params := map[string]string{
		"t_host": "10.0.2.2", "t_port": strconv.Itoa(port), "t_path": "/",
		"t_vers": vers, "t_phase": "mirror", "t_pnfs": "1",
	}
	if flex {
		params["t_layout"] = "flex"
	}
	// SHOAL_KERNEL_DD_WAIT: tenths of a second the guest waits for dd
	// (default 2000).
	if v := os.Getenv("SHOAL_KERNEL_DD_WAIT"); v != "" {
		params["t_dd_wait"] = v
	}
	capture := filepath.Join(out, "capture-mirror.pcap")
	res := boot(ctx, bootConfig{
		img: img, port: port, timeout: vmTimeout, logf: t.Logf, hook: hook,
		params:  params,
		capture: capture,
		console: filepath.Join(out, "console-mirror.log"),
	})
	report(t, "mirror", res)
	for _, err := range errs {
		t.Errorf("driver: %v", err)
	}
	if flex {
		t.Run("mirror/flex-reported", func(t *testing.T) {
			if outage == nil || outage.errors == nil {
				t.Skip("no data server was killed (see mirror/kill-ds)")
			}
			// The client's own report, by LAYOUTERROR or in
			// LAYOUTRETURN, names the dead data server.
			if len(outage.errors) == 0 {
				t.Errorf("no client reported an error about %s (shoal_pnfs_layout_errors_total)", outage.victim)
			}
			if outage.staleCopies == 0 {
				t.Errorf("no copy was stale while %s was down (shoal_cluster_stale_copies)", outage.victim)
			}
			// Which marks the copy stale first is a race inside the
			// client: with NFSv4.2 the LAYOUTERROR goes out before
			// anything else (client_report); with 4.1 Linux 6.1 sent
			// the LAYOUTGET for its next layout before the
			// LAYOUTRETURN carrying the error, and that layout left
			// the copy out (layout_left_out).
			if len(outage.staled) == 0 {
				t.Errorf("no copy on %s was marked stale through a flexfiles layout (shoal_pnfs_flex_copies_staled_total)", outage.victim)
			}
			t.Logf("reported for %s: [%s]; its copies marked stale: [%s]", outage.victim, outage.reported(), outage.staledBy())
		})
		t.Run("mirror/flex-healed-on-return", func(t *testing.T) {
			if outage == nil || outage.healed == nil {
				t.Skip("not healed (see mirror/healed)")
			}
			if outage.healedFiles == 0 || outage.healBytes == 0 {
				t.Errorf("healing copied nothing: %.0f files, %.0f bytes", outage.healedFiles, outage.healBytes)
			}
			if outage.scrub.Bad != 0 || outage.scrub.Failed != 0 || outage.scrub.Chunks == 0 {
				t.Errorf("scrub after healing: %d chunks checked, %d bad copies, %d files failed; want chunks checked and none bad",
					outage.scrub.Chunks, outage.scrub.Bad, outage.scrub.Failed)
			}
			if outage.storeBytes[outage.victim] == 0 {
				t.Errorf("the restarted data server's store is empty")
			}
		})
	}
	t.Run("mirror/degraded-reported", func(t *testing.T) {
		if healed == nil {
			t.Skip("the cluster never healed (see mirror/healed)")
		}
		if maxDegraded == 0 {
			t.Errorf("shoal admin status never reported a degraded stripe after the kill")
		}
		t.Logf("most degraded stripes reported after the first kill: %d", maxDegraded)
	})
}
