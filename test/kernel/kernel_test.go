package kernel

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var kernelFlag = flag.Bool("kernel", false, "run the Linux-kernel-client tests in qemu (also SHOAL_KERNEL=1)")

// env returns the environment variable or a default.
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// repoRoot is the module root: tests run in test/kernel.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from test/kernel: %v", err)
	}
	return root
}

func TestKernel(t *testing.T) {
	if !*kernelFlag && os.Getenv("SHOAL_KERNEL") != "1" {
		t.Skip("kernel-client tests are opt-in: set SHOAL_KERNEL=1 or pass -kernel")
	}
	root := repoRoot(t)
	kernels, err := parseKernels(env("SHOAL_KERNELS", "6.1"))
	if err != nil {
		t.Fatal(err)
	}
	// Every kernel is fetched before the first VM boots: a kernel that
	// cannot be had fails the run at once instead of after the others.
	imgs := make([]images, len(kernels))
	for i, k := range kernels {
		imgs[i] = setupImages(t, k)
	}
	// Subtests are TestKernel/KERNEL/KIND/vMINOR/..., KERNEL being the
	// kernel's major.minor (6.1, 7.2), so a failure names the kernel.
	kinds := slices.Compact(strings.Split(env("SHOAL_KERNEL_SERVER", "ganesha"), ","))
	vmTimeout, err := time.ParseDuration(env("SHOAL_KERNEL_VM_TIMEOUT", "5m"))
	if err != nil {
		t.Fatalf("SHOAL_KERNEL_VM_TIMEOUT: %v", err)
	}
	var shoalBin string
	if slices.ContainsFunc(kinds, func(k string) bool { return strings.HasPrefix(k, "shoal") }) {
		shoalBin = buildShoal(t, root)
	}
	for _, img := range imgs {
		t.Run(img.label(), func(t *testing.T) {
			t.Logf("kernel %s", img.kver)
			for _, kind := range kinds {
				t.Run(kind, func(t *testing.T) { testServer(t, kind, root, shoalBin, img, vmTimeout) })
			}
		})
	}
}

// The kernels SHOAL_KERNELS can name. Each is a setup.sh argument.
const (
	// kernelDebian12 is Debian 12's kernel (6.1), the default.
	kernelDebian12 = "6.1"
	// kernelNewest is the newest kernel Debian ships: what
	// linux-image-amd64 depends on in the unstable suite.
	kernelNewest = "newest"
)

// parseKernels reads SHOAL_KERNELS: a comma-separated list of 6.1 and
// newest, each at most once.
func parseKernels(s string) ([]string, error) {
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		switch k {
		case kernelDebian12, kernelNewest:
		default:
			return nil, fmt.Errorf("SHOAL_KERNELS=%q: %q is not a kernel; want a comma-separated list of %s and %s",
				s, k, kernelDebian12, kernelNewest)
		}
		if slices.Contains(out, k) {
			return nil, fmt.Errorf("SHOAL_KERNELS=%q names %s twice", s, k)
		}
		out = append(out, k)
	}
	return out, nil
}

// testServer runs the workload against one kind of server, once per minor
// version: a fresh server, the main VM run with the live crash, a kill -9
// and restart, the verify run and the wire check.
func testServer(t *testing.T, kind, root, shoalBin string, img images, vmTimeout time.Duration) {
	if kind == "shoal-failover" {
		// MDS failover under the mounted client (failover_test.go): 4.2
		// unless SHOAL_KERNEL_FAILOVER_VERS says otherwise.
		for _, vers := range strings.Split(env("SHOAL_KERNEL_FAILOVER_VERS", "4.2"), ",") {
			t.Run("v"+vers, func(t *testing.T) {
				testFailover(t, shoalBin, img, vers, artifactDir(t, img.label()+"-"+kind, vers))
			})
		}
		return
	}
	for _, vers := range strings.Split(env("SHOAL_KERNEL_VERS", "4.1,4.2"), ",") {
		t.Run("v"+vers, func(t *testing.T) {
			out := artifactDir(t, img.label()+"-"+kind, vers)
			switch kind {
			case "shoal-pnfs-grow":
				// A cluster of separate processes that grows under the
				// mounted client; its own workload phase (grow_test.go).
				testGrow(t, shoalBin, img, vmTimeout, vers, out)
				return
			case "shoal-pnfs-mirror":
				// Replicated stripes under data-server failures
				// (mirror_test.go).
				testMirror(t, shoalBin, img, vmTimeout, vers, out, false)
				return
			case "shoal-flex-mirror":
				// The same with flexfiles layouts: the client writes
				// both copies (mirror_test.go).
				testMirror(t, shoalBin, img, vmTimeout, vers, out, true)
				return
			case "shoal-flex-ganesha":
				// Flexfiles on two NFS-Ganesha NFSv3 data servers
				// (flexganesha_test.go).
				testFlexGanesha(t, shoalBin, img, vmTimeout, vers, out)
				return
			case "shoal-flex":
				// Flexfiles layouts, the client writing both copies
				// (flex_test.go).
				testFlex(t, shoalBin, img, vmTimeout, vers, out)
				return
			}
			// Delegations: a recall between two VMs and the passes with
			// delegations on and off, each on fresh servers (deleg_test.go).
			delegPhases := slices.Contains(delegKinds(), kind)
			if delegPhases {
				testDeleg(t, kind, root, shoalBin, img, vmTimeout, vers, out)
			}
			if env("SHOAL_KERNEL_DELEG_ONLY", "0") == "1" {
				return
			}
			port, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			srv := newServer(t, kind, root, shoalBin, filepath.Join(out, "server"), port)
			ctx := context.Background()
			if err := srv.Start(ctx); err != nil {
				t.Fatalf("start server: %v", err)
			}
			t.Cleanup(func() {
				if err := srv.Stop(); err != nil {
					t.Errorf("stop server: %v", err)
				}
			})
			t.Logf("server: %s; artifacts in %s", srv.Describe(), out)

			params := map[string]string{
				"t_host": "10.0.2.2", "t_port": strconv.Itoa(port),
				"t_path": srv.ExportPath(), "t_vers": vers,
			}
			// Without the delegation phases, the main run measures the
			// passes with the server's default (delegations on).
			if !delegPhases {
				params["t_deleg_passes"] = "1"
			}
			// pNFS: the workload adds its pNFS steps and brackets the
			// 64 MiB and recall steps with SYNC lines, at which the driver
			// snapshots the servers' counters.
			pnfs, _ := srv.(*pnfsServer)
			var snaps *snapshots
			if pnfs != nil {
				params["t_pnfs"] = "1"
				snaps = &snapshots{addr: pnfs.metrics}
			}
			cfg := func(phase string) bootConfig {
				p := map[string]string{"t_phase": phase}
				for k, v := range params {
					p[k] = v
				}
				return bootConfig{
					img: img, port: port, params: p, timeout: vmTimeout, logf: t.Logf,
					capture: filepath.Join(out, "capture-"+phase+".pcap"),
					console: filepath.Join(out, "console-"+phase+".log"),
				}
			}

			main := cfg("main")
			// Live crash: at KILLPOINT the guest holds an open file with
			// unwritten data and a byte-range lock; kill -9 and restart the
			// server under it, then let the guest continue.
			var liveErr error
			killed := false
			live := env("SHOAL_KERNEL_LIVE_CRASH", "1") == "1"
			if live {
				main.params["t_live"] = "1"
			}
			main.hook = func(line string) string {
				if snaps != nil {
					if reply := snaps.hook(ctx, line); reply != "" {
						return reply
					}
				}
				if live && line == "KILLPOINT" {
					killed = true
					if err := srv.Kill(); err != nil {
						liveErr = fmt.Errorf("kill -9: %w", err)
					} else if err := srv.Start(ctx); err != nil {
						liveErr = fmt.Errorf("restart after kill -9: %w", err)
					}
					return "GO"
				}
				return ""
			}
			res := boot(ctx, main)
			if live {
				t.Run("crash/live-kill-restart", func(t *testing.T) {
					if liveErr != nil {
						t.Fatal(liveErr)
					}
				})
			}
			report(t, "main", res)
			if killed && !slices.ContainsFunc(res.steps, func(s stepResult) bool { return s.name == "crash/live" }) {
				t.Run("crash/live", func(t *testing.T) {
					t.Error("the guest printed no crash/live result after the server restart (hung; see vm/main)")
				})
			}
			if pnfs != nil {
				checkPNFS(t, snaps, main.capture, append([]int{port}, pnfs.dsPorts...))
			}
			if !delegPhases {
				t.Run("deleg/passes-counts", func(t *testing.T) {
					d, ok := stepDetail(res, "deleg/passes")
					if !ok {
						t.Fatal("deleg/passes did not pass")
					}
					parts := parseOpParts(d)
					t.Logf("v%s: calls per operation (mountstats) while opening, reading and closing %d files, twice:\n%s",
						vers, delegFiles, formatPasses([]passRun{{name: kind + " (default)", parts: parts}}))
					for _, p := range checkPasses(parts, nil, strictDeleg(kind)) {
						t.Error(p)
					}
				})
			}
			var captures = []string{main.capture}

			if res.crashpoint && len(res.sums) > 0 {
				ok := t.Run("crash/kill-restart", func(t *testing.T) {
					if err := srv.Kill(); err != nil {
						t.Fatalf("kill -9: %v", err)
					}
					if err := srv.Start(ctx); err != nil {
						t.Fatalf("restart after kill -9: %v", err)
					}
				})
				if ok {
					verify := cfg("verify")
					var sums []string
					for _, name := range res.sumOrder {
						sums = append(sums, name+":"+res.sums[name])
					}
					verify.params["t_sums"] = strings.Join(sums, ",")
					report(t, "verify", boot(ctx, verify))
					captures = append(captures, verify.capture)
				}
			} else {
				t.Run("crash", func(t *testing.T) {
					t.Error("phase main did not reach CRASHPOINT; crash test not run")
				})
			}

			ports := []int{port}
			perDS := 0
			if pnfs != nil {
				ports = append(ports, pnfs.dsPorts...)
				perDS = nDS
			}
			t.Run("wire", func(t *testing.T) { checkWire(t, captures, ports, perDS) })
		})
	}
}

// setupImages runs setup.sh (idempotent) for one of the kernels
// SHOAL_KERNELS names and returns the boot artifacts.
func setupImages(t *testing.T, kernel string) images {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("bash", "setup.sh", kernel)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("setup.sh %s: %v\n%s", kernel, err, out)
	}
	img, err := parseSetup(string(out))
	if err != nil {
		t.Fatalf("setup.sh %s: %v", kernel, err)
	}
	t.Logf("kernel %s (%s), initramfs %s (setup %v)", img.kver, kernel, img.initrd, time.Since(start).Round(time.Millisecond))
	return img
}

// artifactDir holds the server's directory, console logs and captures.
// SHOAL_KERNEL_ARTIFACTS keeps them after the test; otherwise they live in
// t.TempDir (the captures are a few hundred MB).
func artifactDir(t *testing.T, name, vers string) string {
	t.Helper()
	base := os.Getenv("SHOAL_KERNEL_ARTIFACTS")
	if base == "" {
		return t.TempDir()
	}
	dir := filepath.Join(base, time.Now().UTC().Format("20060102-150405")+"-"+name+"-v"+vers)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newServer builds the server under test from SHOAL_KERNEL_SERVER:
//   - ganesha: NFS-Ganesha via scripts/ganesha.sh (export /export);
//   - shoal:   `shoal serve --listen 127.0.0.1:PORT --dir DIR`;
//   - shoal-pnfs: `shoal up` with 4 data servers (pnfsServer);
//   - shoal-pnfs-grow: not built here, see testGrow (grow.go);
//   - cmd:     SHOAL_KERNEL_SERVER_CMD with {port} and {dir} substituted.
//
// SHOAL_KERNEL_EXPORT overrides the path the client mounts.
func newServer(t *testing.T, kind, root, shoalBin, dir string, port int) server {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	switch kind {
	case "ganesha":
		return &ganeshaServer{script: filepath.Join(root, "scripts", "ganesha.sh"), dir: dir, port: port}
	case "shoal":
		return &processServer{
			name: "shoal", dir: dir, port: port, export: env("SHOAL_KERNEL_EXPORT", "/"),
			// The workload runs as root and chowns files, so root is not squashed;
			// a short lease keeps the post-crash grace period short.
			argv: []string{shoalBin, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--dir", dir, "--no-root-squash", "--lease", "15s"},
		}
	case "shoal-pnfs":
		mport, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		return newPNFSServer(shoalBin, dir, port, mport, env("SHOAL_KERNEL_EXPORT", "/"))
	case "cmd":
		tmpl := os.Getenv("SHOAL_KERNEL_SERVER_CMD")
		if tmpl == "" {
			t.Fatal("SHOAL_KERNEL_SERVER=cmd needs SHOAL_KERNEL_SERVER_CMD, e.g. 'mysrv -p {port} -d {dir}'")
		}
		return &processServer{
			name: "server", dir: dir, port: port, export: env("SHOAL_KERNEL_EXPORT", "/"),
			argv: expandArgs(tmpl, port, dir),
		}
	default:
		t.Fatalf("SHOAL_KERNEL_SERVER=%q: want ganesha, shoal, shoal-pnfs, shoal-pnfs-grow, shoal-pnfs-mirror, shoal-flex, shoal-flex-mirror, shoal-flex-ganesha, shoal-failover or cmd", kind)
		return nil
	}
}

// buildShoal compiles ./cmd/shoal into a temporary directory, or returns
// SHOAL_KERNEL_SHOAL_BIN, a binary built beforehand.
func buildShoal(t *testing.T, root string) string {
	t.Helper()
	if bin := os.Getenv("SHOAL_KERNEL_SHOAL_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "shoal")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/shoal")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/shoal: %v\n%s", err, out)
	}
	return bin
}

// report turns one VM run into subtests: "vm/PHASE" for the run itself
// (exit, timeout, RESULT line) and one subtest per workload step.
func report(t *testing.T, phase string, res runResult) {
	t.Helper()
	t.Run("vm/"+phase, func(t *testing.T) {
		t.Logf("VM run took %v; %s", res.elapsed.Round(time.Millisecond), res.result)
		if res.err != nil {
			t.Errorf("%v; last console lines:\n%s", res.err, strings.Join(res.tail, "\n"))
		}
		if res.result != "" && (res.passed != countSteps(res, true) || res.failed != countSteps(res, false)) {
			t.Errorf("%s, but the console shows %d PASS and %d FAIL lines",
				res.result, countSteps(res, true), countSteps(res, false))
		}
	})
	for _, s := range res.steps {
		t.Run(s.name, func(t *testing.T) {
			if s.pass {
				t.Log(s.detail)
				return
			}
			t.Errorf("%s", s.detail)
			for _, l := range s.output {
				t.Log(l)
			}
		})
	}
}

func countSteps(res runResult, pass bool) int {
	n := 0
	for _, s := range res.steps {
		if s.pass == pass {
			n++
		}
	}
	return n
}

// checkWire dissects the captures of one version's VM runs with tshark,
// decoding every server port (the MDS or server port, then the data
// servers' ports, if any) as ONC RPC. The first capture must also show
// NFS traffic to each of the first perDS data-server ports.
func checkWire(t *testing.T, captures []string, ports []int, perDS int) {
	if !tsharkAvailable() {
		t.Skip("tshark not installed")
	}
	for i, c := range captures {
		rep, err := dissect(context.Background(), c, ports)
		if err != nil {
			t.Errorf("%s: %v", c, err)
			continue
		}
		t.Logf("%s: %d NFS/RPC packets (per port %v), %d malformed, %d problem packets",
			filepath.Base(c), rep.rpcPackets, rep.perPort, rep.malformed, len(rep.problems))
		if rep.rpcPackets == 0 {
			t.Errorf("%s: no NFS/RPC packets decoded on ports %v", c, ports)
		}
		if perDS > 0 && i == 0 {
			// The data servers of the first start carried the main run's I/O.
			for _, p := range ports[1 : 1+perDS] {
				if rep.perPort[p] == 0 {
					t.Errorf("%s: no NFS/RPC packets to or from data server port %d", c, p)
				}
			}
		}
		if rep.malformed > 0 {
			t.Errorf("%s: %d packets with [Malformed Packet]", c, rep.malformed)
		}
		const show = 20
		for i, l := range rep.problems {
			if i == show {
				t.Errorf("... and %d more", len(rep.problems)-show)
				break
			}
			t.Errorf("%s: %s", filepath.Base(c), l)
		}
	}
}

// checkPNFS turns the metrics snapshots of the main run into subtests:
// the 64 MiB file's I/O went to the data servers in equal shares, and the
// truncate and remove steps recalled the layout, which the client gave
// back: by LAYOUTRETURN, or (Linux, for a layout it is not using) by
// answering the recall with NFS4ERR_NOMATCHING_LAYOUT, seen in the capture.
func checkPNFS(t *testing.T, snaps *snapshots, capture string, ports []int) {
	t.Run("pnfs/io-split", func(t *testing.T) {
		before, after, err := snaps.window("io64")
		if err != nil {
			t.Fatal(err)
		}
		rows := ioSplit(before, after)
		t.Logf("64 MiB written and read back once:\n%s", formatSplit(rows))
		// The MDS may carry a few small I/Os but none of the file's stripes.
		for _, p := range checkSplit(rows, nDS, 64<<20, 0.15, 1<<20) {
			t.Error(p)
		}
	})
	// The direct steps' new files of 1–32 MiB, most written with
	// O_DIRECT: every byte goes to the data servers. With only a size
	// hint in mdsthreshold, Linux sent the first O_DIRECT write of each
	// new (still empty) file through the MDS.
	t.Run("pnfs/direct-split", func(t *testing.T) {
		before, after, err := snaps.window("direct")
		if err != nil {
			t.Fatal(err)
		}
		rows := ioSplit(before, after)
		t.Logf("pnfs/direct/* (files of 1–32 MiB written, read back twice):\n%s", formatSplit(rows))
		for _, r := range rows {
			if r.instance == "mds" && (r.readBytes > 64<<10 || r.writeBytes > 64<<10) {
				t.Errorf("MDS carried read %.0f / write %.0f bytes of large files, want at most 64 KiB each", r.readBytes, r.writeBytes)
			}
		}
	})
	// Small files (tar x, read back, rm -r): the MDS keeps files up to
	// its inline limit and tells the client with the mdsthreshold
	// attribute to do their I/O through it, so no data server sees
	// their bytes.
	t.Run("pnfs/small-files", func(t *testing.T) {
		files := float64(smallFiles)
		for _, part := range smallParts {
			before, after, err := snaps.window("small-" + part)
			if err != nil {
				t.Fatal(err)
			}
			c := opDelta(before, after)
			t.Logf("%-4s per file: MDS%s\n     data servers%s", part, formatOps(c["mds"], files), formatOps(c["ds"], files))
			if n := c.sum("ds", dataOps...); part != "rm" && n > 0 {
				t.Errorf("%s of %d small files: the data servers evaluated %.0f READ/WRITE/COMMIT operations, want 0", part, smallFiles, n)
			}
		}
	})
	// rm -r of files the client had read (and whose layouts it keeps):
	// every REMOVE recalls a layout and is answered once the client gave
	// it back, not with NFS4ERR_DELAY and a retry.
	t.Run("pnfs/mid-rm-counts", func(t *testing.T) {
		before, after, err := snaps.window("mid-rm")
		if err != nil {
			t.Fatal(err)
		}
		c := opDelta(before, after)
		d := recallSplit(before, after)
		t.Logf("rm -r of %d files read before: %v; MDS ops:%s", midFiles, d, formatOps(c["mds"], 1))
		if d.recalls < 1 {
			t.Errorf("no CB_LAYOUTRECALL: the client held no layouts, so the step tests nothing")
		}
		if n := c["mds"]["REMOVE"]; n != midFiles+1 {
			t.Errorf("%.0f REMOVEs for %d files and their directory: retried after NFS4ERR_DELAY", n, midFiles)
		}
	})
	var events []wireEvent
	var wireErr error
	if tsharkAvailable() {
		events, wireErr = recallEvents(context.Background(), capture, ports)
	} else {
		wireErr = errors.New("tshark not installed")
	}
	for _, name := range []string{"truncate", "rm"} {
		t.Run("pnfs/recall-"+name, func(t *testing.T) {
			before, after, err := snaps.window("recall-" + name)
			if err != nil {
				t.Fatal(err)
			}
			d := recallSplit(before, after)
			byStatus, marked := recallsBetween(events, "recall-"+name)
			werr := wireErr
			if werr == nil && !marked {
				werr = errors.New("step markers not found in the capture")
			}
			t.Logf("during pnfs/%s: %v; client's CB_LAYOUTRECALL replies by status: %v (0 OK, 10060 NOMATCHING_LAYOUT, 10008 DELAY)",
				name, d, byStatus)
			if d.recalls < 1 {
				t.Errorf("no CB_LAYOUTRECALL sent during %s of a file with a layout", name)
			}
			if d.fences > 0 {
				t.Errorf("%.0f clients fenced: the layout was not given back in time", d.fences)
			}
			switch {
			case werr != nil && !tsharkAvailable():
				t.Logf("capture not checked (%v); LAYOUTRETURN +%.0f", werr, d.returns)
			case werr != nil:
				t.Errorf("capture not checked (%v); LAYOUTRETURN +%.0f", werr, d.returns)
			case d.returns < 1 && byStatus[10060] < 1:
				t.Errorf("the layout was neither returned (LAYOUTRETURN +0) nor answered NOMATCHING_LAYOUT in the capture")
			}
			for st, n := range byStatus {
				if st != 0 && st != 10060 && st != 10008 {
					t.Errorf("%d CB_LAYOUTRECALL replies with status %d", n, st)
				}
			}
		})
	}
}
