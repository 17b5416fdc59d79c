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
// the three), the second kill one of the two that hold it after healing.
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
	// is healed around.
	g.mds.argv = append(g.mds.argv, "--mirrors", "2", "--ds-down-after", "3s")
	if flex {
		g.mds.argv = append(g.mds.argv, "--layout", "flexfiles")
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
			victim := g.ds[2]
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
			watching = true
			go w.run(ctx, g)
		case "mirror-heal":
			st, err := g.waitHealed(ctx, survivors, 4*time.Minute)
			if err != nil {
				return fail(err)
			}
			healed = st
			maxDegraded, _, _ = w.snapshot()
			t.Logf("healed; status:\n%s", st)
			if flex {
				// How the copy went stale: a client's error report
				// (LAYOUTERROR, LAYOUTRETURN) or the MDS's own write
				// after the client fell back to it. Informational.
				if s, err := scrape(ctx, g.metrics); err == nil {
					t.Logf("client error reports: %.0f; copies staled on them: %.0f",
						s.get("shoal_pnfs_layout_errors_total"), s.get("shoal_pnfs_flex_copies_staled_total"))
				}
			}
		case "mirror-kill2":
			victim := survivors[1]
			if err := g.killDS(ctx, victim); err != nil {
				return fail(err)
			}
			t.Logf("killed a second data server %s (kill -9)", victim.id)
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
