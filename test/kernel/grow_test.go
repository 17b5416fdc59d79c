package kernel

import (
	"context"
	"encoding/json"
	"errors"
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

// The shoal-pnfs-grow kind: a cluster of separate processes (`shoal mds`
// and `shoal ds`), to which the driver adds a data server while the guest
// has the file system mounted. The guest runs workload phase "grow".

// growFirstDS is how many data servers the cluster starts with; the
// driver adds one more at the guest's "SYNC grow-add-ds".
const growFirstDS = 2

// Sizes of the files the workload writes in phase grow (GROW_OLD and
// GROW_NEW in workload.sh).
var (
	growOld = []uint64{33554432, 33558528, 3158073, 1048064, 16777216}
	growNew = []uint64{16777216, 3158073}
)

// growCluster is `shoal mds --listen 127.0.0.1:PORT` and data servers
// `shoal ds --listen 127.0.0.1:P --advertise 10.0.2.2:P`, each on a port
// picked beforehand, so the address a data server listens on and the one
// the guest is told agree. Each process has its own metrics endpoint.
type growCluster struct {
	bin, dir string
	mds      *processServer
	metrics  string // the MDS's metrics endpoint
	ds       []*growDS
}

// growDS is one `shoal ds` process.
type growDS struct {
	*processServer
	metrics string
	id      string // its persistent identity (ds-identity.json)
}

func newGrowCluster(bin, dir string, port int) (*growCluster, error) {
	mport, err := freePort()
	if err != nil {
		return nil, err
	}
	mdsDir := filepath.Join(dir, "mds")
	metrics := fmt.Sprintf("127.0.0.1:%d", mport)
	return &growCluster{
		bin: bin, dir: dir, metrics: metrics,
		mds: &processServer{
			name: "shoal mds", dir: mdsDir, port: port, export: "/",
			// The workload runs as root and chowns files; the short lease
			// keeps a grace period short.
			argv: []string{bin, "mds", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--dir", mdsDir,
				"--no-root-squash", "--lease", "15s", "--http", metrics},
		},
	}, nil
}

func (g *growCluster) secretFile() string { return filepath.Join(g.mds.dir, "join-secret") }

// Start starts the MDS and the first data servers and waits until they
// are all in service.
func (g *growCluster) Start(ctx context.Context) error {
	if err := g.mds.Start(ctx); err != nil {
		return err
	}
	for range growFirstDS {
		if _, err := g.addDS(ctx); err != nil {
			return err
		}
	}
	_, err := g.waitUp(ctx, growFirstDS, time.Minute)
	return err
}

// addDS starts the next data server (directory dsN) on a fresh port,
// advertised to the guest as 10.0.2.2:PORT.
func (g *growCluster) addDS(ctx context.Context) (*growDS, error) {
	i := len(g.ds)
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	mport, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(g.dir, fmt.Sprintf("ds%d", i))
	metrics := fmt.Sprintf("127.0.0.1:%d", mport)
	d := &growDS{
		metrics: metrics,
		processServer: &processServer{
			name: fmt.Sprintf("shoal ds %d", i), dir: dir, port: port,
			argv: []string{g.bin, "ds", "--mds", fmt.Sprintf("127.0.0.1:%d", g.mds.port),
				"--join-secret-file", g.secretFile(), "--dir", dir,
				"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--advertise", fmt.Sprintf("10.0.2.2:%d", port),
				"--http", metrics},
		},
	}
	if err := d.Start(ctx); err != nil {
		return nil, err
	}
	g.ds = append(g.ds, d)
	b, err := os.ReadFile(filepath.Join(dir, "ds-identity.json"))
	if err != nil {
		return d, fmt.Errorf("%s: %w", d.name, err)
	}
	var ident struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &ident); err != nil || ident.ID == "" {
		return d, fmt.Errorf("%s: ds-identity.json %q: %v", d.name, b, err)
	}
	d.id = ident.ID
	return d, nil
}

// Stop stops the data servers, then the MDS.
func (g *growCluster) Stop() error {
	var errs []error
	for i := len(g.ds) - 1; i >= 0; i-- {
		errs = append(errs, g.ds[i].Stop())
	}
	errs = append(errs, g.mds.Stop())
	return errors.Join(errs...)
}

func (g *growCluster) Describe() string {
	var ds []string
	for _, d := range g.ds {
		ds = append(ds, fmt.Sprintf("%s 127.0.0.1:%d as 10.0.2.2:%d", d.id, d.port, d.port))
	}
	return fmt.Sprintf("shoal mds on 127.0.0.1:%d (metrics %s) with data servers [%s]; logs in %s/*.log",
		g.mds.port, g.metrics, strings.Join(ds, ", "), g.dir)
}

// ports are the MDS port, then the data servers' ports.
func (g *growCluster) ports() []int {
	ps := []int{g.mds.port}
	for _, d := range g.ds {
		ps = append(ps, d.port)
	}
	return ps
}

// adminStatus is the part of `shoal admin status --json` the test reads.
type adminStatus struct {
	DataServers []dsStatus        `json:"data_servers"`
	Files       int               `json:"files"`
	Unavailable int               `json:"unavailable_files"`
	Replication replicationStatus `json:"replication"`
}

// replicationStatus is the replication section of the status.
type replicationStatus struct {
	DegradedFiles   int `json:"degraded_files"`
	DegradedStripes int `json:"degraded_stripes"`
}

type dsStatus struct {
	ID    string
	Addrs []string
	State string
	Up    bool
	Files int    `json:"files"`
	Bytes uint64 `json:"bytes"`
}

func (s *adminStatus) ds(id string) (dsStatus, bool) {
	i := slices.IndexFunc(s.DataServers, func(d dsStatus) bool { return d.ID == id })
	if i < 0 {
		return dsStatus{}, false
	}
	return s.DataServers[i], true
}

func (s *adminStatus) up() int {
	n := 0
	for _, d := range s.DataServers {
		if d.Up && d.State == "active" {
			n++
		}
	}
	return n
}

func (s *adminStatus) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d files placed, %d not fully available, %d degraded (%d stripes)\n",
		s.Files, s.Unavailable, s.Replication.DegradedFiles, s.Replication.DegradedStripes)
	fmt.Fprintf(&b, "%-20s %-18s %-8s %-4s %6s %12s\n", "ID", "ADDRESS", "STATE", "UP", "FILES", "BYTES")
	for _, d := range s.DataServers {
		fmt.Fprintf(&b, "%-20s %-18s %-8s %-4v %6d %12d\n", d.ID, strings.Join(d.Addrs, ","), d.State, d.Up, d.Files, d.Bytes)
	}
	return b.String()
}

// status runs `shoal admin status --json`.
func (g *growCluster) status(ctx context.Context) (*adminStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, "admin", "status", "--mds", fmt.Sprintf("127.0.0.1:%d", g.mds.port),
		"--join-secret-file", g.secretFile(), "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("shoal admin status: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var st adminStatus
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("shoal admin status --json: %w\n%s", err, out)
	}
	return &st, nil
}

// waitUp polls the status until n data servers are up and active.
func (g *growCluster) waitUp(ctx context.Context, n int, timeout time.Duration) (*adminStatus, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := g.status(ctx)
		if err == nil && st.up() == n {
			return st, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("%d data servers not in service after %v: %w", n, timeout, err)
			}
			return st, fmt.Errorf("%d data servers not in service after %v; status:\n%s", n, timeout, st)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// growSnap is what the driver records at one of the guest's SYNC lines:
// the cluster status and the metrics of every process.
type growSnap struct {
	status  *adminStatus
	metrics snapshot
}

func (g *growCluster) snapshot(ctx context.Context) (growSnap, error) {
	st, err := g.status(ctx)
	if err != nil {
		return growSnap{}, err
	}
	all, err := scrape(ctx, g.metrics)
	if err != nil {
		return growSnap{}, err
	}
	for _, d := range g.ds {
		s, err := scrape(ctx, d.metrics)
		if err != nil {
			return growSnap{}, err
		}
		all = append(all, s...)
	}
	return growSnap{status: st, metrics: all}, nil
}

// testGrow is one minor version of the shoal-pnfs-grow kind: the cluster
// starts with two data servers, the guest writes files, the driver adds a
// third data server at "SYNC grow-add-ds" while the guest stays mounted,
// the guest reads the old files and writes new ones, remounts and reads
// everything. The driver then checks from `shoal admin status` that the
// old files stayed on the first two data servers and the new ones were
// striped over all three, and from the metrics that the third one carried
// a third of the new files' I/O.
func testGrow(t *testing.T, shoalBin string, img images, vmTimeout time.Duration, vers, out string) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGrowCluster(shoalBin, filepath.Join(out, "server"), port)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		if err := g.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	if err := g.Start(ctx); err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Logf("server: %s; artifacts in %s", g.Describe(), out)

	snaps := map[string]growSnap{}
	var errs []error
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
		if tag == "grow-add-ds" {
			before, err := g.snapshot(ctx)
			if err != nil {
				return fail(err)
			}
			snaps["grow-add-ds-before"] = before
			start := time.Now()
			d, err := g.addDS(ctx)
			if err != nil {
				return fail(fmt.Errorf("start a data server: %w", err))
			}
			if _, err := g.waitUp(ctx, growFirstDS+1, time.Minute); err != nil {
				return fail(err)
			}
			t.Logf("data server %s (127.0.0.1:%d as 10.0.2.2:%d) in service after %v",
				d.id, d.port, d.port, time.Since(start).Round(time.Millisecond))
		}
		s, err := g.snapshot(ctx)
		if err != nil {
			return fail(err)
		}
		snaps[tag] = s
		return "OK " + tag
	}
	capture := filepath.Join(out, "capture-grow.pcap")
	res := boot(ctx, bootConfig{
		img: img, port: port, timeout: vmTimeout, logf: t.Logf, hook: hook,
		params: map[string]string{
			"t_host": "10.0.2.2", "t_port": strconv.Itoa(port), "t_path": "/",
			"t_vers": vers, "t_phase": "grow", "t_pnfs": "1",
		},
		capture: capture,
		console: filepath.Join(out, "console-grow.log"),
	})
	report(t, "grow", res)
	for _, err := range errs {
		t.Errorf("driver: %v", err)
	}
	checkGrow(t, g, snaps)
	t.Run("wire", func(t *testing.T) { checkWire(t, []string{capture}, g.ports(), len(g.ds)) })
}

// checkGrow turns the snapshots of a grow run into subtests.
func checkGrow(t *testing.T, g *growCluster, snaps map[string]growSnap) {
	if len(g.ds) != growFirstDS+1 {
		t.Run("grow/placement", func(t *testing.T) {
			t.Fatalf("%d data servers were started, want %d", len(g.ds), growFirstDS+1)
		})
		return
	}
	oldIDs := []string{g.ds[0].id, g.ds[1].id}
	newID := g.ds[2].id
	sum := func(sizes []uint64) (n uint64) {
		for _, s := range sizes {
			n += s
		}
		return n
	}
	logged := map[string]bool{}
	get := func(t *testing.T, tags ...string) []growSnap {
		t.Helper()
		var out []growSnap
		for _, tag := range tags {
			s, ok := snaps[tag]
			if !ok {
				t.Fatalf("no snapshot taken at SYNC %s", tag)
			}
			if !logged[tag] {
				// Each status once, in the first subtest that uses it.
				t.Logf("status at %s:\n%s", tag, s.status)
				logged[tag] = true
			}
			out = append(out, s)
		}
		return out
	}

	// Adding a data server leaves the placement of existing files alone.
	t.Run("grow/old-unmoved", func(t *testing.T) {
		s := get(t, "grow-add-ds-before", "grow-add-ds", "grow-new-before")
		if got, want := s[0].status.Files, len(growOld); got != want {
			t.Errorf("%d files placed before the data server was added, want %d", got, want)
		}
		var total uint64
		for _, id := range oldIDs {
			d0, ok := s[0].status.ds(id)
			if !ok {
				t.Fatalf("data server %s missing from the status", id)
			}
			if d0.Bytes == 0 {
				t.Errorf("data server %s holds no bytes of the old files", id)
			}
			total += d0.Bytes
			for i, tag := range []string{"grow-add-ds", "grow-new-before"} {
				d, _ := s[i+1].status.ds(id)
				if d.Files != d0.Files || d.Bytes != d0.Bytes {
					t.Errorf("data server %s at %s: %d files, %d bytes; before the add: %d files, %d bytes",
						id, tag, d.Files, d.Bytes, d0.Files, d0.Bytes)
				}
			}
		}
		if total != sum(growOld) {
			t.Errorf("the two data servers hold %d bytes, the old files have %d", total, sum(growOld))
		}
		for i, tag := range []string{"grow-add-ds", "grow-new-before"} {
			d, ok := s[i+1].status.ds(newID)
			switch {
			case !ok:
				t.Errorf("the new data server %s is missing from the status at %s", newID, tag)
			case !d.Up:
				t.Errorf("the new data server %s is not up at %s", newID, tag)
			case d.Files != 0 || d.Bytes != 0:
				t.Errorf("the new data server %s holds %d files, %d bytes at %s; want none of the old files",
					newID, d.Files, d.Bytes, tag)
			}
		}
	})

	// New files stripe over all three data servers. With a 1 MiB stripe
	// unit, the 16 MiB file alone puts at least 5 MiB on each.
	t.Run("grow/new-placement", func(t *testing.T) {
		s := get(t, "grow-new-before", "grow-new-after")
		if got, want := s[1].status.Files-s[0].status.Files, len(growNew); got != want {
			t.Errorf("%d files placed while writing the new files, want %d", got, want)
		}
		const least = 5 << 20
		var total uint64
		for _, id := range append(oldIDs, newID) {
			b, _ := s[0].status.ds(id)
			a, ok := s[1].status.ds(id)
			if !ok {
				t.Fatalf("data server %s missing from the status", id)
			}
			grew := int64(a.Bytes) - int64(b.Bytes)
			total += uint64(grew)
			t.Logf("data server %s: +%d files, %+d bytes", id, a.Files-b.Files, grew)
			if a.Files-b.Files != len(growNew) {
				t.Errorf("data server %s holds stripes of %d of the %d new files", id, a.Files-b.Files, len(growNew))
			}
			if grew < least {
				t.Errorf("data server %s holds %d bytes of the new files, want at least %d", id, grew, least)
			}
		}
		if total != sum(growNew) {
			t.Errorf("the data servers hold %d bytes of the new files, which have %d", total, sum(growNew))
		}
	})

	// The I/O of the new files (written once, read once with O_DIRECT)
	// went to the data servers, a third to each.
	t.Run("grow/new-io", func(t *testing.T) {
		s := get(t, "grow-new-before", "grow-new-after")
		rows := ioSplit(s[0].metrics, s[1].metrics)
		t.Logf("new files (%d bytes) written and read back once:\n%s", sum(growNew), formatSplit(rows))
		const least = 5 << 20
		if len(rows) != growFirstDS+2 {
			t.Errorf("%d data servers in the metrics, want %d", len(rows)-1, growFirstDS+1)
		}
		for _, r := range rows {
			if r.instance == "mds" {
				if r.readBytes > 1<<20 || r.writeBytes > 1<<20 {
					t.Errorf("MDS carried read %.0f / write %.0f bytes of the new files, want at most 1 MiB each", r.readBytes, r.writeBytes)
				}
				continue
			}
			if r.writeBytes < least || r.readBytes < least {
				t.Errorf("DS %s: read %.0f / write %.0f bytes, want at least %d each", r.instance, r.readBytes, r.writeBytes, least)
			}
		}
	})
}
