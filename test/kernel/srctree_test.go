package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKernelSrcTree is issue 27's count of what the Linux client sends for
// a source tree's small files: `tar x` of a tarball of a real source tree
// onto an NFSv4.2 (SHOAL_KERNEL_VERS) mount of `shoal serve`, synced, then
// `rm -r` of it, each bracketed by SYNC lines at which the driver scrapes
// the server's shoal_nfs_ops_total. It logs the operations per file of
// each part and writes them to srctree.json in the artifacts.
//
// The tarball is `git archive HEAD` of this repository (offline, about
// 570 files in 60 directories), or SHOAL_KERNEL_SRCTREE_TAR. It reaches
// the guest as /src.tar in a cpio archive appended to the initramfs,
// which Linux unpacks after the first. SHOAL_KERNEL_SRCTREE_ARGS adds
// flags to `shoal serve` (for example --sync=false).
//
//	SHOAL_KERNEL=1 SHOAL_KERNEL_SRCTREE=1 go test ./test/kernel -run TestKernelSrcTree -v -timeout 20m
//
// scripts/kernel-srctree.sh runs it.
func TestKernelSrcTree(t *testing.T) {
	if (!*kernelFlag && os.Getenv("SHOAL_KERNEL") != "1") || os.Getenv("SHOAL_KERNEL_SRCTREE") != "1" {
		t.Skip("opt-in: set SHOAL_KERNEL=1 and SHOAL_KERNEL_SRCTREE=1")
	}
	root := repoRoot(t)
	kernels, err := parseKernels(env("SHOAL_KERNELS", "6.1"))
	if err != nil {
		t.Fatal(err)
	}
	vmTimeout, err := time.ParseDuration(env("SHOAL_KERNEL_VM_TIMEOUT", "5m"))
	if err != nil {
		t.Fatalf("SHOAL_KERNEL_VM_TIMEOUT: %v", err)
	}
	shoalBin := buildShoal(t, root)
	tarball := os.Getenv("SHOAL_KERNEL_SRCTREE_TAR")
	if tarball == "" {
		tarball = filepath.Join(t.TempDir(), "src.tar")
		cmd := exec.Command("git", "archive", "--format=tar", "--prefix=shoal/", "-o", tarball, "HEAD")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git archive: %v: %s", err, out)
		}
	}
	for _, k := range kernels {
		img := setupImages(t, k)
		t.Run(img.label(), func(t *testing.T) {
			for _, vers := range strings.Split(env("SHOAL_KERNEL_VERS", "4.2"), ",") {
				t.Run("v"+vers, func(t *testing.T) {
					testSrcTree(t, shoalBin, img, tarball, vers, vmTimeout, artifactDir(t, img.label()+"-srctree", vers))
				})
			}
		})
	}
}

// srcTreeRow is one part's count: files, wall time in the guest and the
// MDS's operations per file.
type srcTreeRow struct {
	Part    string             `json:"part"`
	Files   int                `json:"files"`
	Detail  string             `json:"detail"`
	PerFile map[string]float64 `json:"ops_per_file"`
	Total   float64            `json:"ops_per_file_total"`
	// Compounds is COMPOUNDs per file (the SEQUENCE operations).
	Compounds float64 `json:"compounds_per_file"`
}

var srcFilesRE = regexp.MustCompile(`(\d+) files`)

func testSrcTree(t *testing.T, shoalBin string, img images, tarball, vers string, vmTimeout time.Duration, out string) {
	initrd, err := appendToInitramfs(img.initrd, tarball, out)
	if err != nil {
		t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	mport, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", mport)
	dir := filepath.Join(out, "server")
	argv := []string{shoalBin, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--dir", dir,
		"--no-root-squash", "--lease", "15s", "--http", metrics}
	argv = append(argv, strings.Fields(os.Getenv("SHOAL_KERNEL_SRCTREE_ARGS"))...)
	srv := &processServer{name: "shoal", dir: dir, port: port, export: "/", argv: argv}
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop server: %v", err)
		}
	})
	t.Logf("server: %s; artifacts in %s", strings.Join(argv[1:], " "), out)
	snaps := &snapshots{addr: metrics}
	simg := img
	simg.initrd = initrd
	res := boot(ctx, bootConfig{
		img: simg, port: port, timeout: vmTimeout, logf: t.Logf,
		params: map[string]string{"t_host": "10.0.2.2", "t_port": strconv.Itoa(port), "t_path": "/",
			"t_vers": vers, "t_phase": "srctree", "t_sync": "1"},
		console: filepath.Join(out, "console-srctree.log"),
		capture: filepath.Join(out, "capture-srctree.pcap"),
		hook:    func(line string) string { return snaps.hook(ctx, line) },
	})
	if res.err != nil {
		t.Fatalf("VM run: %v\n%s", res.err, strings.Join(res.tail, "\n"))
	}
	files := 0
	for _, s := range res.steps {
		if !s.pass {
			t.Errorf("%s: FAIL %s\n%s", s.name, s.detail, strings.Join(s.output, "\n"))
		}
		if m := srcFilesRE.FindStringSubmatch(s.detail); s.name == "src/tar" && m != nil {
			files, _ = strconv.Atoi(m[1])
		}
	}
	if files == 0 {
		t.Fatalf("src/tar reported no file count (steps %+v)", res.steps)
	}
	var rows []srcTreeRow
	for _, part := range []string{"tar", "rm"} {
		before, after, err := snaps.window("src-" + part)
		if err != nil {
			t.Fatal(err)
		}
		ops := serverOpDelta(before, after)
		if ops["SEQUENCE"] == 0 {
			t.Fatalf("src/%s: the server counted no COMPOUND between the SYNC lines", part)
		}
		row := srcTreeRow{Part: part, Files: files, PerFile: map[string]float64{}, Compounds: ops["SEQUENCE"] / float64(files)}
		for _, s := range res.steps {
			if s.name == "src/"+part {
				row.Detail = s.detail
			}
		}
		for op, n := range ops {
			row.PerFile[op] = n / float64(files)
			row.Total += n / float64(files)
		}
		rows = append(rows, row)
		t.Logf("src/%s: %d files (%s), %.2f COMPOUNDs and %.2f operations per file at the MDS:%s",
			part, files, row.Detail, row.Compounds, row.Total, formatOps(ops, float64(files)))
	}
	b, err := json.MarshalIndent(map[string]any{"kernel": img.kver, "vers": vers, "server_args": argv[2:], "rows": rows}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "srctree.json"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// appendToInitramfs writes initrd followed by a newc cpio archive holding
// tarball as /src.tar into dir, and returns its path: Linux unpacks
// every archive of a concatenation, compressed or not.
func appendToInitramfs(initrd, tarball, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base, err := os.ReadFile(initrd)
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(tarball)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	b.Write(base)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	writeCPIOEntry(&b, 1, "src.tar", 0o100644, data)
	writeCPIOEntry(&b, 2, "TRAILER!!!", 0, nil)
	for b.Len()%512 != 0 {
		b.WriteByte(0)
	}
	path := filepath.Join(dir, "initrd-srctree")
	return path, os.WriteFile(path, b.Bytes(), 0o644)
}

// writeCPIOEntry appends one entry in the "newc" format (ASCII hex
// header, name and data each padded to 4 bytes).
func writeCPIOEntry(b *bytes.Buffer, ino int, name string, mode uint32, data []byte) {
	start := b.Len()
	fmt.Fprintf(b, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	b.WriteString(name)
	b.WriteByte(0)
	for (b.Len()-start)%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(data)
	for (b.Len()-start)%4 != 0 {
		b.WriteByte(0)
	}
}

// serverOpDelta is shoal_nfs_ops_total's growth per operation between two
// scrapes of one server (`shoal serve`: role "server").
func serverOpDelta(before, after snapshot) map[string]float64 {
	d := map[string]float64{}
	for _, smp := range after {
		if smp.name != "shoal_nfs_ops_total" {
			continue
		}
		op := smp.labels["op"]
		if n := smp.value - before.get("shoal_nfs_ops_total", "op", op); n > 0 {
			d[op] += n
		}
	}
	return d
}
