package kernel

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The delegation phases (README "Delegations"): for the kinds listed in
// SHOAL_KERNEL_DELEG (default "shoal"), each version starts a fresh server
// with delegations on and boots two VMs at once (phases recall-a and
// recall-b: two client IDs), which take turns holding a file under a read
// delegation while the other writes it; VM a then runs deleg/passes. A
// second fresh server with delegations off runs deleg/passes once more
// (phase deleg), and the driver compares the counts.

// delegKinds are the kinds that run the delegation phases.
func delegKinds() []string {
	v := env("SHOAL_KERNEL_DELEG", "shoal")
	if v == "none" || v == "0" {
		return nil
	}
	return strings.Split(v, ",")
}

// strictDeleg tells whether a kind is known to grant delegations (Shoal's
// servers by default), so that not getting one is a failure; other
// servers (Ganesha, a command) are only reported on.
func strictDeleg(kind string) bool { return strings.HasPrefix(kind, "shoal") }

// delegServer starts a fresh server of the kind for the delegation
// phases, with delegations on or off, and returns it with its metrics
// endpoint ("" if it has none). ok is false for a kind that cannot turn
// delegations off.
func delegServer(t *testing.T, kind, root, shoalBin, dir string, on bool) (srv server, port int, metrics string, ok bool) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	// Delegations are on by default; only "off" is a flag. Linux returns
	// a delegation it has not used for two runs of its lease renewal
	// (every 2/3 of the lease): with the harness's 15 s lease, 10-20 s
	// after the last use. A 60 s lease keeps the first pass's
	// delegations until the second pass on a loaded machine; these
	// servers are never restarted, so the lease lengthens no grace
	// period.
	flags := []string{"--lease", "60s"}
	if !on {
		flags = append(flags, "--delegations=false")
	}
	switch kind {
	case "shoal":
		mport, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		p := newServer(t, kind, root, shoalBin, dir, port).(*processServer)
		metrics = fmt.Sprintf("127.0.0.1:%d", mport)
		p.argv = append(append(p.argv, "--http", metrics), flags...)
		srv = p
	case "shoal-pnfs":
		p := newServer(t, kind, root, shoalBin, dir, port).(*pnfsServer)
		p.argv = append(p.argv, flags...)
		srv, metrics = p, p.metrics
	default:
		if !on {
			return nil, 0, "", false
		}
		srv = newServer(t, kind, root, shoalBin, dir, port)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop server: %v", err)
		}
	})
	t.Logf("server: %s", srv.Describe())
	return srv, port, metrics, true
}

// delegBoot is the boot configuration of one delegation-phase VM.
func delegBoot(img images, vmTimeout time.Duration, srv server, port int, vers, phase, out string, extra map[string]string) bootConfig {
	p := map[string]string{
		"t_host": "10.0.2.2", "t_port": strconv.Itoa(port), "t_path": srv.ExportPath(),
		"t_vers": vers, "t_phase": phase,
	}
	if idle := env("SHOAL_KERNEL_DELEG_IDLE", ""); idle != "" {
		p["t_deleg_idle"] = idle
	}
	for k, v := range extra {
		p[k] = v
	}
	return bootConfig{
		img: img, port: port, params: p, timeout: vmTimeout,
		capture: filepath.Join(out, "capture-"+phase+".pcap"),
		console: filepath.Join(out, "console-"+phase+".log"),
	}
}

// stepDetail returns the detail of a step that passed.
func stepDetail(res runResult, name string) (string, bool) {
	i := slices.IndexFunc(res.steps, func(s stepResult) bool { return s.name == name && s.pass })
	if i < 0 {
		return "", false
	}
	return res.steps[i].detail, true
}

func testDeleg(t *testing.T, kind, root, shoalBin string, img images, vmTimeout time.Duration, vers, out string) {
	t.Run("deleg", func(t *testing.T) {
		strict := strictDeleg(kind)
		var on, off []opPart
		t.Run("on", func(t *testing.T) {
			on = testRecallPair(t, kind, root, shoalBin, img, vmTimeout, vers, filepath.Join(out, "deleg-on"), strict)
		})
		t.Run("off", func(t *testing.T) {
			dir := filepath.Join(out, "deleg-off")
			srv, port, _, ok := delegServer(t, kind, root, shoalBin, filepath.Join(dir, "server"), false)
			if !ok {
				t.Skipf("kind %s: no way to turn delegations off", kind)
			}
			c := delegBoot(img, vmTimeout, srv, port, vers, "deleg", dir, nil)
			c.logf = t.Logf
			res := boot(context.Background(), c)
			report(t, "deleg", res)
			if d, ok := stepDetail(res, "deleg/passes"); ok {
				off = parseOpParts(d)
			}
		})
		t.Run("passes", func(t *testing.T) {
			runs := []passRun{{name: kind + " delegations on", parts: on}}
			if off != nil {
				runs = append(runs, passRun{name: kind + " delegations off", parts: off})
			}
			t.Logf("v%s: calls per operation (mountstats) while opening, reading and closing %d files, twice:\n%s",
				vers, delegFiles, formatPasses(runs))
			if on == nil {
				t.Fatal("no deleg/passes result with delegations on (see deleg/on)")
			}
			for _, p := range checkPasses(on, off, strict) {
				t.Error(p)
			}
		})
	})
}

// testRecallPair boots VMs a and b at once against a fresh server with
// delegations on, checks that each holder's delegation was recalled and
// returned while the other wrote, and returns the deleg/passes counts of
// VM a.
func testRecallPair(t *testing.T, kind, root, shoalBin string, img images, vmTimeout time.Duration, vers, dir string, strict bool) []opPart {
	srv, port, metrics, _ := delegServer(t, kind, root, shoalBin, filepath.Join(dir, "server"), true)
	ctx := context.Background()
	rv := newRendezvous(metrics, 150*time.Second)
	ids := []string{"a", "b"}
	res := make([]runResult, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		extra := map[string]string{"t_id": id}
		if id == "a" {
			extra["t_deleg_passes"] = "1"
		}
		c := delegBoot(img, vmTimeout, srv, port, vers, "recall-"+id, dir, extra)
		c.logf = func(format string, args ...any) { t.Logf(id+": "+format, args...) }
		c.hook = func(line string) string { return rv.hook(ctx, line) }
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = boot(ctx, c)
			rv.exit(id)
		}()
	}
	wg.Wait()
	for i, id := range ids {
		report(t, "recall-"+id, res[i])
	}
	// Each direction: the holder's view (did it hold a delegation, what
	// did it send while the other wrote), its capture (CB_RECALL), the
	// server's counters.
	for _, d := range []struct{ holder, writer int }{{0, 1}, {1, 0}} {
		h, w := ids[d.holder], ids[d.writer]
		t.Run("recall/"+h+"-recalled", func(t *testing.T) {
			detail, ok := stepDetail(res[d.holder], "recall/"+h+"-holds")
			if !ok {
				t.Fatalf("recall/%s-holds did not pass", h)
			}
			parts := parseOpParts(detail)
			reopen, okh := part(parts, "reopen")
			during, okd := part(parts, "while-other-wrote")
			if !okh || !okd {
				t.Fatalf("recall/%s-holds printed no counts: %q", h, detail)
			}
			if metrics != "" {
				if before, after, err := rv.window(h+"-holds", w+"-wrote"); err != nil {
					t.Error(err)
				} else {
					t.Logf("server metrics from %s-holds to %s-wrote: %v", h, w, delegMetrics(before, after))
				}
			}
			delegated := reopen.opens() == 0
			t.Logf("VM %s re-opened the file with %d OPENs (0: under a delegation); while VM %s wrote it, VM %s sent %v",
				h, reopen.opens(), w, h, during.ops)
			if !delegated {
				if strict {
					t.Errorf("VM %s's second open of the file went to the server: no read delegation was granted", h)
				} else {
					t.Logf("the server granted VM %s no delegation; nothing to recall", h)
				}
				return
			}
			if during.ops["DELEGRETURN"] < 1 {
				t.Errorf("VM %s held a delegation but sent no DELEGRETURN while VM %s wrote the file", h, w)
			}
			if tsharkAvailable() {
				capture := filepath.Join(dir, "capture-recall-"+h+".pcap")
				calls, replies, err := cbRecalls(ctx, capture, port)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("capture of VM %s: %d CB_RECALL calls from the server; the client's replies by status %v", h, calls, replies)
				if calls < 1 {
					t.Errorf("the server sent VM %s no CB_RECALL", h)
				}
				for st, n := range replies {
					if st != 0 {
						t.Errorf("VM %s answered %d CB_RECALLs with status %d", h, n, st)
					}
				}
			}
		})
	}
	if tsharkAvailable() {
		t.Run("wire", func(t *testing.T) {
			var caps []string
			for _, id := range ids {
				caps = append(caps, filepath.Join(dir, "capture-recall-"+id+".pcap"))
			}
			checkWire(t, caps, []int{port}, 0)
		})
	}
	d, ok := stepDetail(res[0], "deleg/passes")
	if !ok {
		return nil
	}
	return parseOpParts(d)
}
