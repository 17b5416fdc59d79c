package kernel

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pnfsServer is `shoal up`: one metadata server and nDS data servers in
// one process. The client mounts the MDS; the data servers listen on
// 127.0.0.1 on ports the kernel picks at the first start and are
// advertised to the guest as 10.0.2.2:PORT. A crash kills the whole
// process; the restart on the same --dir keeps each data server's identity
// and port (ds-identity.json and ds-port in its directory). The metrics
// name each data server by its identity (instance="ds-<hex>").
type pnfsServer struct {
	*processServer
	metrics string // host:port of the Prometheus endpoint
	dsPorts []int  // every data-server port seen since the first start
}

// nDS is the number of data servers the pNFS kind starts.
const nDS = 4

func newPNFSServer(bin, dir string, port, metricsPort int, export string) *pnfsServer {
	metrics := fmt.Sprintf("127.0.0.1:%d", metricsPort)
	return &pnfsServer{
		metrics: metrics,
		processServer: &processServer{
			name: "shoal up", dir: dir, port: port, export: export, ready: "shoal up: ready:",
			// Root is not squashed by default in `up`; the short lease keeps
			// the post-crash grace period short.
			argv: []string{bin, "up", "--dir", dir, "--ds", strconv.Itoa(nDS),
				"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--advertise-host", "10.0.2.2",
				"--lease", "15s", "--http", metrics},
		},
	}
}

func (p *pnfsServer) Start(ctx context.Context) error {
	if err := p.processServer.Start(ctx); err != nil {
		return err
	}
	ports, err := parseReadyPorts(p.readyLine)
	if err != nil {
		return fmt.Errorf("shoal up: %w", err)
	}
	if len(ports) != nDS {
		return fmt.Errorf("shoal up: %d data servers in %q, want %d", len(ports), p.readyLine, nDS)
	}
	for _, port := range ports {
		if !slices.Contains(p.dsPorts, port) {
			p.dsPorts = append(p.dsPorts, port)
		}
	}
	return nil
}

func (p *pnfsServer) Describe() string {
	return fmt.Sprintf("shoal up (MDS 127.0.0.1:%d, %d data servers %v, metrics %s; log %s.log)",
		p.port, nDS, p.dsPorts, p.metrics, p.dir)
}

// readyDSRE picks the data-server list out of
// "shoal up: ready: MDS 127.0.0.1:P, 4 data servers [127.0.0.1:P1 ...], ...".
var readyDSRE = regexp.MustCompile(`data servers \[([^\]]*)\]`)

func parseReadyPorts(line string) ([]int, error) {
	m := readyDSRE.FindStringSubmatch(line)
	if m == nil {
		return nil, fmt.Errorf("no data-server list in ready line %q", line)
	}
	var ports []int
	for _, a := range strings.Fields(m[1]) {
		i := strings.LastIndexByte(a, ':')
		port, err := strconv.Atoi(a[i+1:])
		if i < 0 || err != nil {
			return nil, fmt.Errorf("bad data-server address %q in ready line", a)
		}
		ports = append(ports, port)
	}
	return ports, nil
}

// sample is one line of Prometheus text output.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// snapshot is one scrape of the metrics endpoint.
type snapshot []sample

// parseMetrics reads the Prometheus text format: comments and blank lines
// are skipped, label values are taken as written (Shoal's contain no
// escapes).
func parseMetrics(r io.Reader) (snapshot, error) {
	var s snapshot
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(l, ' ')
		if sp < 0 {
			return nil, fmt.Errorf("metrics line %q has no value", l)
		}
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", l, err)
		}
		series := l[:sp]
		smp := sample{name: series, value: v}
		if i := strings.IndexByte(series, '{'); i >= 0 && strings.HasSuffix(series, "}") {
			smp.name = series[:i]
			smp.labels = map[string]string{}
			for _, kv := range strings.Split(series[i+1:len(series)-1], ",") {
				k, val, ok := strings.Cut(kv, "=")
				if !ok {
					continue
				}
				smp.labels[k] = strings.Trim(val, `"`)
			}
		}
		s = append(s, smp)
	}
	return s, sc.Err()
}

// get sums the samples of name whose labels include all of match
// (given as key, value pairs).
func (s snapshot) get(name string, match ...string) float64 {
	var sum float64
	for _, smp := range s {
		if smp.name != name {
			continue
		}
		ok := true
		for i := 0; i+1 < len(match); i += 2 {
			if smp.labels[match[i]] != match[i+1] {
				ok = false
				break
			}
		}
		if ok {
			sum += smp.value
		}
	}
	return sum
}

// scrape fetches the metrics endpoint once.
func scrape(ctx context.Context, addr string) (snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// dsInstances are the metric instance labels of the data servers in a
// snapshot, sorted: each data server's persistent ID ("ds-<hex>", kept in
// its directory, so the same across restarts).
func dsInstances(s snapshot) []string {
	var in []string
	for _, smp := range s {
		if smp.name == "shoal_nfs_bytes_total" && smp.labels["role"] == "ds" && !slices.Contains(in, smp.labels["instance"]) {
			in = append(in, smp.labels["instance"])
		}
	}
	slices.Sort(in)
	return in
}

// ioRow is one server's share of a window of I/O.
type ioRow struct {
	instance                    string
	readBytes, writeBytes       float64
	readOps, writeOps, layoutOp float64
}

// ioSplit is the per-server difference of READ/WRITE bytes and ops between
// two snapshots: one row per data server found in after, then the MDS.
func ioSplit(before, after snapshot) []ioRow {
	d := func(name string, match ...string) float64 {
		return after.get(name, match...) - before.get(name, match...)
	}
	var rows []ioRow
	for _, in := range append(dsInstances(after), "mds") {
		rows = append(rows, ioRow{
			instance:   in,
			readBytes:  d("shoal_nfs_bytes_total", "instance", in, "dir", "read"),
			writeBytes: d("shoal_nfs_bytes_total", "instance", in, "dir", "write"),
			// A 4.2 client may read with READ_PLUS where the server takes it.
			readOps: d("shoal_nfs_ops_total", "instance", in, "op", "READ") +
				d("shoal_nfs_ops_total", "instance", in, "op", "READ_PLUS"),
			writeOps: d("shoal_nfs_ops_total", "instance", in, "op", "WRITE"),
		})
	}
	return rows
}

// checkSplit reports what is wrong with a split of size bytes written and
// read once over nds data servers: there must be nds data-server rows,
// every one must carry size/nds ± tol of each, and the MDS at most mdsMax
// bytes.
func checkSplit(rows []ioRow, nds int, size, tol, mdsMax float64) []string {
	var bad []string
	if got := len(rows) - 1; got != nds {
		bad = append(bad, fmt.Sprintf("%d data servers in the metrics, want %d", got, nds))
	}
	share := size / float64(nds)
	for _, r := range rows {
		if r.instance == "mds" {
			if r.readBytes > mdsMax || r.writeBytes > mdsMax {
				bad = append(bad, fmt.Sprintf("MDS carried read %.0f / write %.0f bytes, want at most %.0f each",
					r.readBytes, r.writeBytes, mdsMax))
			}
			continue
		}
		for _, x := range []struct {
			dir string
			v   float64
		}{{"read", r.readBytes}, {"write", r.writeBytes}} {
			if math.Abs(x.v-share) > tol*share {
				bad = append(bad, fmt.Sprintf("DS %s: %s %.0f bytes, want %.0f ± %.0f%%",
					r.instance, x.dir, x.v, share, tol*100))
			}
		}
	}
	return bad
}

// formatSplit renders the rows as a table for the test log.
func formatSplit(rows []ioRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %12s %12s %8s %8s\n", "server", "READ bytes", "WRITE bytes", "READs", "WRITEs")
	for _, r := range rows {
		name := "DS " + r.instance
		if r.instance == "mds" {
			name = "MDS"
		}
		fmt.Fprintf(&b, "%-22s %12.0f %12.0f %8.0f %8.0f\n", name, r.readBytes, r.writeBytes, r.readOps, r.writeOps)
	}
	return b.String()
}

// recallDelta is what a window did to the MDS's layout state.
type recallDelta struct {
	recalls, returns, layoutgets, fences float64
}

func recallSplit(before, after snapshot) recallDelta {
	d := func(name string, match ...string) float64 {
		return after.get(name, match...) - before.get(name, match...)
	}
	return recallDelta{
		recalls:    d("shoal_pnfs_events_total", "role", "mds", "event", "layout_recall"),
		fences:     d("shoal_pnfs_events_total", "role", "mds", "event", "fence"),
		returns:    d("shoal_nfs_ops_total", "role", "mds", "op", "LAYOUTRETURN"),
		layoutgets: d("shoal_nfs_ops_total", "role", "mds", "op", "LAYOUTGET"),
	}
}

func (r recallDelta) String() string {
	return fmt.Sprintf("CB_LAYOUTRECALL sent +%.0f, LAYOUTRETURN +%.0f, LAYOUTGET +%.0f, fences +%.0f",
		r.recalls, r.returns, r.layoutgets, r.fences)
}

// syncRE is the guest's request for a metrics snapshot: "SYNC tag". The
// driver answers "OK tag" on the console once it has scraped.
var syncRE = regexp.MustCompile(`^SYNC (\S+)$`)

// snapshots collects the scrapes taken at the guest's SYNC lines.
type snapshots struct {
	addr  string
	taken map[string]snapshot
	errs  []error
}

// hook handles a console line; it returns the reply for SYNC lines.
func (s *snapshots) hook(ctx context.Context, line string) string {
	m := syncRE.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	snap, err := scrape(ctx, s.addr)
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("SYNC %s: %w", m[1], err))
	} else {
		if s.taken == nil {
			s.taken = map[string]snapshot{}
		}
		s.taken[m[1]] = snap
	}
	return "OK " + m[1]
}

// window returns the snapshots taken at "SYNC name-before" and
// "SYNC name-after".
func (s *snapshots) window(name string) (before, after snapshot, err error) {
	before, okb := s.taken[name+"-before"]
	after, oka := s.taken[name+"-after"]
	if !okb || !oka {
		return nil, nil, fmt.Errorf("no metrics snapshots for %s (before %v, after %v; scrape errors %v)", name, okb, oka, s.errs)
	}
	return before, after, nil
}

// wireEvent is one frame of interest in a capture, in capture order:
// either a marker LOOKUP of ".mark-TAG" (the guest's host_sync) or the
// guest's reply to a CB_LAYOUTRECALL.
type wireEvent struct {
	mark   string // TAG of a marker, or ""
	status int    // CB_COMPOUND status of a recall reply
}

// recallEvents lists the markers and CB_LAYOUTRECALL replies in a capture.
// The markers delimit the workload's steps on the wire (the capture's
// clock is qemu's virtual clock, which is not the driver's).
//
// The Linux 6.1 client answers a recall of a layout it is not using with
// NFS4ERR_NOMATCHING_LAYOUT and forgets the layout (initiate_file_draining:
// no segment in use, nothing to return), which RFC 8881 §12.5.5.1 lets the
// server treat as returned; only a layout with I/O in flight is answered
// NFS4_OK and followed by a LAYOUTRETURN.
func recallEvents(ctx context.Context, capture string, ports []int) ([]wireEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	args := []string{"-n", "-r", capture}
	for _, p := range ports {
		args = append(args, "-d", "tcp.port=="+strconv.Itoa(p)+",rpc")
	}
	// Replies come from the guest; the server's calls can share a frame
	// with a reply of the fore channel, so select by source.
	args = append(args, "-Y", `(nfs.cb.operation == 5 && ip.src == 10.0.2.15) || nfs.pathname.component contains ".mark-"`,
		"-T", "fields", "-E", "separator=/t", "-e", "nfs.nfsstat4", "-e", "nfs.pathname.component", "-e", "nfs.cb.operation")
	out, err := exec.CommandContext(ctx, "tshark", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("tshark -r %s: %w", capture, err)
	}
	return parseRecallEvents(string(out)), nil
}

func parseRecallEvents(out string) []wireEvent {
	var evs []wireEvent
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(l, "\t")
		if len(f) < 3 {
			continue
		}
		for _, name := range strings.Split(f[1], ",") {
			if tag, ok := strings.CutPrefix(name, ".mark-"); ok {
				evs = append(evs, wireEvent{mark: tag})
			}
		}
		if strings.TrimSpace(f[2]) != "" && f[0] != "" {
			if st, err := strconv.Atoi(strings.Split(f[0], ",")[0]); err == nil {
				evs = append(evs, wireEvent{status: st})
			}
		}
	}
	return evs
}

// recallsBetween counts the recall replies by status between the markers
// TAG-before and TAG-after; ok is false if a marker is missing.
func recallsBetween(evs []wireEvent, tag string) (byStatus map[int]int, ok bool) {
	in, seenBefore := false, false
	byStatus = map[int]int{}
	for _, e := range evs {
		switch {
		case e.mark == tag+"-before":
			in, seenBefore = true, true
		case e.mark == tag+"-after":
			return byStatus, seenBefore
		case in && e.mark == "":
			byStatus[e.status]++
		}
	}
	return byStatus, false
}

// smallParts are the parts of the small-file steps (workload.sh
// step_small_*), each bracketed by "SYNC small-PART-before/after".
var smallParts = []string{"tar", "read", "rm"}

// smallFiles is how many files the small-file steps unpack
// (SMALL_DIRS x SMALL_PER in workload.sh).
const smallFiles = 200

// midFiles is how many files past the inline limit step_mid_rm removes
// (MID_FILES in workload.sh).
const midFiles = 20

// opCounts is a window's operations by role ("mds" or "ds") and name.
type opCounts map[string]map[string]float64

// opDelta counts the NFSv4 operations each role evaluated between two
// snapshots (SEQUENCE, PUTFH and the like included).
func opDelta(before, after snapshot) opCounts {
	d := opCounts{"mds": {}, "ds": {}}
	for _, smp := range after {
		if smp.name != "shoal_nfs_ops_total" || d[smp.labels["role"]] == nil {
			continue
		}
		role, op := smp.labels["role"], smp.labels["op"]
		n := smp.value - before.get("shoal_nfs_ops_total", "role", role, "instance", smp.labels["instance"], "op", op)
		if n > 0 {
			d[role][op] += n
		}
	}
	return d
}

// dataOps are the operations that move file data (or make it durable) on
// a server.
var dataOps = []string{"READ", "READ_PLUS", "WRITE", "COMMIT"}

func (c opCounts) sum(role string, ops ...string) float64 {
	var n float64
	for _, op := range ops {
		n += c[role][op]
	}
	return n
}

// formatOps renders per-file counts, sorted by operation name.
func formatOps(m map[string]float64, files float64) string {
	ops := make([]string, 0, len(m))
	for op := range m {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	var b strings.Builder
	for _, op := range ops {
		fmt.Fprintf(&b, " %s=%.2f", op, m[op]/files)
	}
	if b.Len() == 0 {
		return " none"
	}
	return b.String()
}
