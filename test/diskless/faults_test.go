package diskless

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDisklessFaults is the "nodes survive failures": one node
// boots from Shoal and runs programs from its root in a loop
// (run-loop.sh, shoal.loop=SECS) while the host kills -9 a server under
// it and starts it again: a data server (ds: shoal mds and 3 shoal ds,
// --mirrors 2) and the leading MDS (mds: the failover topology, 3 etcd
// members, 2 shoal mds with shoal vip, the node mounting the service
// address). The loop must not see a single error, and must go on after
// the kill. The longest gap between two of its rounds is logged (not
// asserted: it depends on the machine's load).
//
//	SHOAL_DISKLESS_FAULTS=1 go test ./test/diskless -run TestDisklessFaults -v -timeout 60m
//
// SHOAL_DISKLESS_KERNELS (6.1 by default; newest), SHOAL_DISKLESS_FAULT_KINDS
// (ds,mds by default) and SHOAL_DISKLESS_LOOP (seconds, default 60)
// choose the runs.
func TestDisklessFaults(t *testing.T) {
	if os.Getenv("SHOAL_DISKLESS_FAULTS") != "1" {
		t.Skip("set SHOAL_DISKLESS_FAULTS=1 to kill servers under a diskless node in qemu (root, qemu, etcd)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("SHOAL_DISKLESS_FAULTS=1 needs root: debootstrap, network namespaces, tap devices")
	}
	kernels, kinds, loop := "6.1", "ds,mds", "60"
	if s := os.Getenv("SHOAL_DISKLESS_KERNELS"); s != "" {
		kernels = s
	}
	if s := os.Getenv("SHOAL_DISKLESS_FAULT_KINDS"); s != "" {
		kinds = s
	}
	if s := os.Getenv("SHOAL_DISKLESS_LOOP"); s != "" {
		if n, err := strconv.Atoi(s); err != nil || n < 20 {
			t.Fatalf("SHOAL_DISKLESS_LOOP=%q: want seconds, at least 20", s)
		}
		loop = s
	}
	root := repoRoot(t)
	bin := filepath.Join(t.TempDir(), "shoal")
	build := exec.Command("go", "build", "-o", bin, "./cmd/shoal")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/shoal: %v\n%s", err, out)
	}
	for _, k := range strings.Split(kernels, ",") {
		for _, kind := range strings.Split(kinds, ",") {
			t.Run(k+"/"+kind, func(t *testing.T) {
				out, err := runBoot(t, root, bin, k, "--loop", loop, "--kill", kind)
				r := parse(out)
				t.Logf("RESULT %v", r.result)
				if err != nil {
					t.Errorf("scripts/diskless.sh boot: %v", err)
				}
				checkFaults(t, r, kind)
			})
		}
	}
}

// checkFaults holds a --loop --kill report against the issue: the node
// booted from Shoal over pNFS, the host killed and restarted the server,
// and the loop ran on to its end without an error.
func checkFaults(t testing.TB, r *report, kind string) {
	t.Helper()
	if r.result["ok"] != "1" {
		t.Errorf("RESULT: node0 did not run the boot check to its end (ok=%s)", r.result["ok"])
	}
	want := map[string]string{"ds": "killed ds0 ", "mds": "killed the leading MDS "}[kind]
	var killed bool
	restartedAt := -1.0 // node0's console time at the restart
	for _, f := range r.faults {
		killed = killed || strings.HasPrefix(f, want)
		if m := restartRE.FindStringSubmatch(f); m != nil {
			restartedAt, _ = strconv.ParseFloat(m[1], 64)
		}
	}
	if !killed || restartedAt < 0 {
		t.Errorf("the host did not kill and restart the %s (FAULT lines %q)", kind, r.faults)
	}
	n := r.nodes["node0"]
	if n == nil {
		t.Fatal("node0: no report")
	}
	// The loop went on past the restart (it ran while the server was
	// down, and after it came back).
	if restartedAt >= 0 && n.loopEnd <= restartedAt {
		t.Errorf("node0: the loop ended at console time %.2f s, before the restart at %.2f s", n.loopEnd, restartedAt)
	}
	if !strings.Contains(n.nfsv4, "pnfs=LAYOUT_NFSV4_1_FILES") {
		t.Errorf("node0: root mount's nfsv4 line %q: want pnfs=LAYOUT_NFSV4_1_FILES", n.nfsv4)
	}
	if n.loop == nil {
		t.Fatal("node0: the loop printed no summary")
	}
	t.Logf("%s: loop iterations=%s errors=%s max_gap_s=%s max_iter_s=%s", kind,
		n.loop["iterations"], n.loop["errors"], n.loop["max_gap_s"], n.loop["max_iter_s"])
	for _, e := range n.loopErrors {
		t.Errorf("node0: loop %s", e)
	}
	if n.loop["errors"] != "0" {
		t.Errorf("node0: loop summary errors=%s", n.loop["errors"])
	}
	// The kill comes after round 3, and run-loop.sh runs at least 8
	// rounds however slow the machine: at least 5 rounds ran after it.
	if it, _ := strconv.Atoi(n.loop["iterations"]); it < 8 || n.loopIters != it {
		t.Errorf("node0: loop ran %s rounds (%d iter lines): want at least 8, each logged", n.loop["iterations"], n.loopIters)
	}
}

// restartRE finds node0's console time in the FAULT line of the restart.
var restartRE = regexp.MustCompile(`^restarted .* at console ([0-9.]+) s`)
