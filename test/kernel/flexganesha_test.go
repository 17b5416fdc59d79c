package kernel

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/ganeshatest"
	"github.com/shoalfs/shoal/internal/nfs3"
)

// The shoal-flex-ganesha kind: `shoal mds --layout flexfiles
// --flex-v3-server ...` with two NFS-Ganesha processes as loosely coupled
// NFSv3 data servers (RFC 8435 with ffdv_version 3). Ganesha needs an
// rpcbind to serve NFSv3, so everything runs in a network namespace of
// the test's own (internal/ganeshatest): the two Ganeshas and their
// rpcbind, the MDS, and qemu itself, whose user networking then takes the
// guest's 10.0.2.2 to the namespace's 127.0.0.1. The data servers are
// advertised to the guest as 10.0.2.2:PORT.
//
// The guest runs the flex workload phase (mountstats must say
// pnfs=LAYOUT_FLEX_FILES; the DIRECT_SIZES files written O_DIRECT or
// buffered and read back by sha256 after cache drops). Then the driver
// checks on the host:
//   - every file has a data file of its size on each Ganesha export, the
//     two copies identical, owned by a synthetic uid (not root), mode 0640;
//   - the capture shows RPC traffic between the guest and both Ganesha
//     ports (the client did its I/O with the data servers, not only
//     through the MDS), and nothing malformed;
//   - fencing: an NFSv3 WRITE with the data file's owner uid (the
//     layout's ffds_user) succeeds, `shoal admin fence-file` changes the
//     owner, and the same WRITE is then refused (NFS3ERR_ACCES/PERM).

const (
	flexGaneshaMDSPort = 2049
	flexGaneshaPort0   = 20490 // Ganesha i: NFS on 20490+10i, MOUNT on the next port
)

func testFlexGanesha(t *testing.T, shoalBin string, img images, vmTimeout time.Duration, vers, out string) {
	if why := ganeshatest.Available(); why != "" {
		t.Skip("ganesha: " + why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout+5*time.Minute)
	defer cancel()
	ns, err := ganeshatest.NewNetns(ctx, fmt.Sprintf("shoal-kfg-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	var gs []*ganeshatest.Server
	mdsArgs := []string{"mds", "--listen", fmt.Sprintf("127.0.0.1:%d", flexGaneshaMDSPort), "--dir", filepath.Join(out, "mds"),
		"--layout", "flexfiles", "--flex-stripe", "off", "--no-root-squash", "--lease", "20s"}
	for i := range 2 {
		port := flexGaneshaPort0 + 10*i
		dir := filepath.Join(out, fmt.Sprintf("ganesha%d", i))
		g, err := ganeshatest.Start(ctx, ns, dir, port)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		gs = append(gs, g)
		mdsArgs = append(mdsArgs, "--flex-v3-server",
			fmt.Sprintf("127.0.0.1:%d%s?mount=%d&advertise=10.0.2.2:%d", port, g.Path, g.MountPort, port))
	}
	mdsLog, err := os.Create(filepath.Join(out, "mds.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer mdsLog.Close()
	mds := exec.Command("ip", append([]string{"netns", "exec", ns.Name, shoalBin}, mdsArgs...)...)
	mds.Stdout, mds.Stderr = mdsLog, mdsLog
	if err := mds.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mds.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { mds.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			mds.Process.Kill()
			<-done
		}
	})
	if err := waitDial(ctx, ns, fmt.Sprintf("127.0.0.1:%d", flexGaneshaMDSPort)); err != nil {
		t.Fatalf("MDS: %v", err)
	}
	t.Logf("server: shoal %s (in netns %s); artifacts in %s", strings.Join(mdsArgs, " "), ns.Name, out)

	capture := filepath.Join(out, "capture-flex-ganesha.pcap")
	res := boot(ctx, bootConfig{
		img: img, port: flexGaneshaMDSPort, timeout: vmTimeout, logf: t.Logf, netns: ns.Name,
		hook: func(line string) string {
			if m := syncRE.FindStringSubmatch(line); m != nil {
				return "OK " + m[1]
			}
			return ""
		},
		params: map[string]string{
			"t_host": "10.0.2.2", "t_port": strconv.Itoa(flexGaneshaMDSPort), "t_path": "/",
			"t_vers": vers, "t_phase": "flex", "t_pnfs": "1",
		},
		capture: capture,
		console: filepath.Join(out, "console-flex-ganesha.log"),
	})
	report(t, "flex", res)

	t.Run("flex-ganesha/data-files", func(t *testing.T) {
		checkGaneshaDataFiles(t, gs)
	})
	t.Run("flex-ganesha/wire", func(t *testing.T) {
		if !tsharkAvailable() {
			t.Skip("tshark not installed")
		}
		ports := []int{flexGaneshaMDSPort}
		for _, g := range gs {
			ports = append(ports, g.Port)
		}
		rep, err := dissect(ctx, capture, ports)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("RPC packets per port: %v", rep.perPort)
		for _, g := range gs {
			if rep.perPort[g.Port] == 0 {
				t.Errorf("no RPC traffic with the Ganesha data server on port %d: the client did not use the layout", g.Port)
			}
		}
		if rep.malformed > 0 || len(rep.problems) > 0 {
			t.Errorf("%d malformed packets; problems: %v", rep.malformed, rep.problems)
		}
	})
	t.Run("flex-ganesha/fence", func(t *testing.T) {
		name := fmt.Sprintf("/w%s/direct.1048064", vers)
		checkGaneshaFence(t, ctx, ns, gs, shoalBin, filepath.Join(out, "mds"), 1048064, name)
	})
}

// waitDial dials addr inside ns until it answers (at most 60 s).
func waitDial(ctx context.Context, ns *ganeshatest.Netns, addr string) error {
	var err error
	for range 600 {
		var c net.Conn
		if c, err = ns.Dial(ctx, "tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

type dataFile struct {
	path     string
	size     int64
	sum      [32]byte
	uid, gid uint32
	mode     os.FileMode
}

func listDataFiles(t *testing.T, g *ganeshatest.Server) []dataFile {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(g.Export, "shoal-*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []dataFile
	for _, p := range m {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		fi, _ := f.Stat()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		d := dataFile{path: p, size: n, uid: st.Uid, gid: st.Gid, mode: fi.Mode().Perm()}
		copy(d.sum[:], h.Sum(nil))
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return filepath.Base(out[i].path) < filepath.Base(out[j].path) })
	return out
}

// checkGaneshaDataFiles: each DIRECT_SIZES file has a data file of its
// size on both Ganeshas (one data server per mirror holds the whole
// file), with the same bytes, a synthetic owner and mode 0640.
func checkGaneshaDataFiles(t *testing.T, gs []*ganeshatest.Server) {
	a, b := listDataFiles(t, gs[0]), listDataFiles(t, gs[1])
	byName := map[string]dataFile{}
	for _, d := range b {
		byName[filepath.Base(d.path)] = d
	}
	sizes := map[int64]bool{}
	for _, d := range a {
		o, ok := byName[filepath.Base(d.path)]
		if !ok {
			t.Errorf("%s has no mirror on the second Ganesha", d.path)
			continue
		}
		if o.size != d.size || o.sum != d.sum {
			t.Errorf("%s: the mirrors differ (%d bytes %x, %d bytes %x)", filepath.Base(d.path), d.size, d.sum[:6], o.size, o.sum[:6])
		}
		if d.uid == 0 || d.mode != 0o640 {
			t.Errorf("%s: uid %d mode %v; want a synthetic owner and 0640", d.path, d.uid, d.mode)
		}
		t.Logf("%s: %d bytes, sha256 %x on both, uid %d gid %d", filepath.Base(d.path), d.size, d.sum[:8], d.uid, d.gid)
		sizes[d.size] = true
	}
	for _, n := range []int64{33554432, 33558528, 3158073, 1048064} {
		if !sizes[n] {
			t.Errorf("no data file of %d bytes (a DIRECT_SIZES file) on the Ganeshas", n)
		}
	}
}

// checkGaneshaFence writes with the data file's owner uid (the
// layout's), fences the file with `shoal admin fence-file`, and checks
// the same write is refused.
func checkGaneshaFence(t *testing.T, ctx context.Context, ns *ganeshatest.Netns, gs []*ganeshatest.Server, shoalBin, mdsDir string, size int64, name string) {
	var target *dataFile
	for _, d := range listDataFiles(t, gs[0]) {
		if d.size == size {
			target = &d
			break
		}
	}
	if target == nil {
		t.Fatalf("no data file of %d bytes", size)
	}
	g := gs[0]
	root, err := nfs3.Mount(ctx, g.MountAddr(), g.Path, nfs3.Options{Dial: ns.Dial})
	if err != nil {
		t.Fatal(err)
	}
	rootCl, err := nfs3.Dial(ctx, g.Addr(), nfs3.Options{Dial: ns.Dial})
	if err != nil {
		t.Fatal(err)
	}
	defer rootCl.Close()
	fh, err := rootCl.Lookup(ctx, root, filepath.Base(target.path))
	if err != nil {
		t.Fatal(err)
	}
	old := rootCl.As(target.uid, target.gid)
	// Rewrite the first byte with itself: the data stays as it is.
	first, _, err := old.Read(ctx, fh, 0, 1)
	if err != nil || len(first) != 1 {
		t.Fatalf("READ with the layout's ids: %v", err)
	}
	if _, err := old.Write(ctx, fh, 0, first, nfs3.FILE_SYNC); err != nil {
		t.Fatalf("WRITE with the layout's ids before the fence: %v", err)
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, shoalBin, "admin", "fence-file", name,
		"--mds", fmt.Sprintf("127.0.0.1:%d", flexGaneshaMDSPort), "--join-secret-file", filepath.Join(mdsDir, "join-secret"))
	outp, err := cmd.CombinedOutput()
	t.Logf("shoal admin fence-file %s: %s", name, bytes.TrimSpace(outp))
	if err != nil {
		t.Fatalf("shoal admin fence-file: %v", err)
	}
	fi, err := os.Stat(target.path)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid == target.uid {
		t.Fatalf("the data file is still owned by %d", uid)
	}
	_, err = old.Write(ctx, fh, 0, first, nfs3.FILE_SYNC)
	if s := nfs3.Status(err); s != nfs3.NFS3ERR_ACCES && s != nfs3.NFS3ERR_PERM {
		t.Fatalf("WRITE with the fenced ids: %v, want NFS3ERR_ACCES or NFS3ERR_PERM", err)
	}
	t.Logf("after the fence Ganesha answers the old ids (uid %d): %v", target.uid, err)
}
