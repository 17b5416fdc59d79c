package kernel

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Delegations (RFC 8881 §10.4) seen from the Linux client: the workload
// counts the mount's calls per operation (/proc/self/mountstats) around
// two passes that open, read and close the same small files, and two VMs
// (two client IDs) take turns holding a file under a read delegation while
// the other writes it. The helpers here parse what the guests print and
// coordinate the two VMs.

// delegOps are the operations the workload's ops_delta reports
// (DELEG_OPS in workload.sh), in table order. Linux counts an OPEN by
// filehandle (CLAIM_FH, for an inode it has cached) as OPEN_NOATTR.
var delegOps = []string{"OPEN", "OPEN_NOATTR", "GETATTR", "ACCESS", "LOOKUP", "CLOSE", "DELEGRETURN"}

// opens is the OPEN calls of a part, by name and by filehandle.
func (p opPart) opens() int { return p.ops["OPEN"] + p.ops["OPEN_NOATTR"] }

// delegFiles is DELEG_FILES in workload.sh: the files of one pass.
const delegFiles = 200

// opPart is one measured part of a step: its label ("pass1", "drop",
// ...) and the calls per operation made during it.
type opPart struct {
	label string
	ops   map[string]int
}

// opPartRE is one "label OP=N OP=N ..." segment of a step's detail.
var opPartRE = regexp.MustCompile(`^(\S+)((?: [A-Za-z_]+=-?\d+)+)$`)

// parseOpParts reads the parts of a step's detail line, e.g.
// "pass1 OPEN=200 GETATTR=0 | pass2 OPEN=0 GETATTR=0 | drop ...". Segments
// that are not of that form (timings) are skipped. The step's detail may
// start with the elapsed time the workload's run() puts first.
func parseOpParts(detail string) []opPart {
	var parts []opPart
	for _, seg := range strings.Split(detail, "|") {
		f := strings.Fields(seg)
		// Drop a leading "12.34s" (run's elapsed time).
		if len(f) > 0 && strings.HasSuffix(f[0], "s") {
			if _, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "s"), 64); err == nil {
				f = f[1:]
			}
		}
		m := opPartRE.FindStringSubmatch(strings.Join(f, " "))
		if m == nil {
			continue
		}
		p := opPart{label: m[1], ops: map[string]int{}}
		for _, kv := range strings.Fields(m[2]) {
			k, v, _ := strings.Cut(kv, "=")
			p.ops[k], _ = strconv.Atoi(v)
		}
		parts = append(parts, p)
	}
	return parts
}

// part returns the part with the label, if any.
func part(parts []opPart, label string) (opPart, bool) {
	i := slices.IndexFunc(parts, func(p opPart) bool { return p.label == label })
	if i < 0 {
		return opPart{}, false
	}
	return parts[i], true
}

// sumOp adds one operation's calls over all parts.
func sumOp(parts []opPart, op string) int {
	n := 0
	for _, p := range parts {
		n += p.ops[op]
	}
	return n
}

// passRun is the deleg/passes result of one VM run, for the table.
type passRun struct {
	name  string // "delegations on", "delegations off", ...
	parts []opPart
}

// formatPasses renders the runs as one table for the test log.
func formatPasses(runs []passRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-26s %-9s", "server", "part")
	for _, op := range delegOps {
		fmt.Fprintf(&b, " %11s", op)
	}
	b.WriteByte('\n')
	for _, r := range runs {
		for _, p := range r.parts {
			fmt.Fprintf(&b, "%-26s %-9s", r.name, p.label)
			for _, op := range delegOps {
				fmt.Fprintf(&b, " %11d", p.ops[op])
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// checkPasses lists what is wrong with the deleg/passes counts. on is a
// run against a server that grants delegations (strict: it must have
// granted them; otherwise only the table is shown), off (optional) the
// same step against one that does not.
func checkPasses(on, off []opPart, strict bool) []string {
	var bad []string
	p1, ok1 := part(on, "pass1")
	p2, ok2 := part(on, "pass2")
	if !ok1 || !ok2 {
		return []string{fmt.Sprintf("deleg/passes printed no pass1/pass2 counts (parts %v)", on)}
	}
	if strict {
		// The first pass opens every file at the server (the caches were
		// dropped); the second must be served mostly from delegations.
		if p1.opens() < delegFiles/2 {
			bad = append(bad, fmt.Sprintf("first pass sent %d OPENs for %d files: the files were not opened at the server", p1.opens(), delegFiles))
		}
		if 2*p2.opens() >= p1.opens() {
			bad = append(bad, fmt.Sprintf("second pass sent %d OPENs, first pass %d: delegations did not spare the second pass's opens", p2.opens(), p1.opens()))
		}
		if sumOp(on, "DELEGRETURN") < 1 {
			bad = append(bad, "no DELEGRETURN during the passes and the final cache drop: no delegation was granted or none returned")
		}
	}
	if off == nil {
		return bad
	}
	q2, ok := part(off, "pass2")
	if !ok {
		return append(bad, fmt.Sprintf("deleg/passes with delegations off printed no pass2 counts (parts %v)", off))
	}
	// Without delegations every open(2) of a closed file is an OPEN.
	if q2.opens() < delegFiles/2 {
		bad = append(bad, fmt.Sprintf("with delegations off the second pass sent only %d OPENs for %d files", q2.opens(), delegFiles))
	}
	if n := sumOp(off, "DELEGRETURN"); n != 0 {
		bad = append(bad, fmt.Sprintf("with delegations off the client returned %d delegations", n))
	}
	if strict && 2*p2.opens() >= q2.opens() {
		bad = append(bad, fmt.Sprintf("second-pass OPENs: %d with delegations, %d without; want fewer than half", p2.opens(), q2.opens()))
	}
	return bad
}

// rendezvous lets VMs that run at the same time wait for each other. A
// guest prints "POST tag value" when it has reached a point, and "WAIT
// tag" to wait until some guest has posted tag. The driver answers a POST
// with "OK tag" (after scraping the server's metrics, if it has an
// endpoint) and a WAIT with "OK tag value" once tag is posted. Tags start
// with the ID of the VM that posts them ("a-holds"); a WAIT for a tag of
// a VM that has exited, or one that takes longer than wait, is answered
// "ERR tag reason", so a guest never waits for a peer that is gone.
type rendezvous struct {
	metrics string // host:port of the server's metrics, or ""
	wait    time.Duration

	mu      sync.Mutex
	posted  map[string]string
	snaps   map[string]snapshot
	errs    []error
	exited  map[string]bool
	changed chan struct{} // closed and replaced on every post and exit
}

func newRendezvous(metrics string, wait time.Duration) *rendezvous {
	return &rendezvous{
		metrics: metrics, wait: wait,
		posted: map[string]string{}, snaps: map[string]snapshot{},
		exited: map[string]bool{}, changed: make(chan struct{}),
	}
}

var (
	postRE = regexp.MustCompile(`^POST (\S+) ?(.*)$`)
	waitRE = regexp.MustCompile(`^WAIT (\S+)$`)
)

// hook handles one console line of a VM; it blocks on a WAIT.
func (r *rendezvous) hook(ctx context.Context, line string) string {
	if m := postRE.FindStringSubmatch(line); m != nil {
		r.post(ctx, m[1], strings.TrimSpace(m[2]))
		return "OK " + m[1]
	}
	if m := waitRE.FindStringSubmatch(line); m != nil {
		v, err := r.await(ctx, m[1])
		if err != nil {
			return fmt.Sprintf("ERR %s %v", m[1], err)
		}
		return "OK " + m[1] + " " + v
	}
	return ""
}

func (r *rendezvous) post(ctx context.Context, tag, value string) {
	var snap snapshot
	var err error
	if r.metrics != "" {
		snap, err = scrape(ctx, r.metrics)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("POST %s: %w", tag, err))
	} else if snap != nil {
		r.snaps[tag] = snap
	}
	r.posted[tag] = value
	close(r.changed)
	r.changed = make(chan struct{})
}

// exit records that the VM with this ID is gone.
func (r *rendezvous) exit(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exited[id] = true
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *rendezvous) await(ctx context.Context, tag string) (string, error) {
	timer := time.NewTimer(r.wait)
	defer timer.Stop()
	owner, _, _ := strings.Cut(tag, "-")
	for {
		r.mu.Lock()
		v, ok := r.posted[tag]
		gone := r.exited[owner]
		ch := r.changed
		r.mu.Unlock()
		switch {
		case ok:
			return v, nil
		case gone:
			return "", fmt.Errorf("VM %s exited without posting %s", owner, tag)
		}
		select {
		case <-ch:
		case <-timer.C:
			return "", fmt.Errorf("not posted within %v", r.wait)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// window returns the metrics scraped at two posts.
func (r *rendezvous) window(from, to string) (before, after snapshot, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	before, okb := r.snaps[from]
	after, oka := r.snaps[to]
	if !okb || !oka {
		return nil, nil, fmt.Errorf("no metrics at POST %s (%v) or %s (%v); scrape errors %v", from, okb, to, oka, r.errs)
	}
	return before, after, nil
}

// delegMetrics is the difference of the server's delegation-related
// counters between two scrapes: the DELEGRETURN and OPEN operations it
// served, and every series whose name mentions delegations (what the
// server exports about grants, recalls, returns and revocations).
func delegMetrics(before, after snapshot) map[string]float64 {
	d := map[string]float64{
		"op DELEGRETURN": after.get("shoal_nfs_ops_total", "op", "DELEGRETURN") - before.get("shoal_nfs_ops_total", "op", "DELEGRETURN"),
		"op OPEN":        after.get("shoal_nfs_ops_total", "op", "OPEN") - before.get("shoal_nfs_ops_total", "op", "OPEN"),
	}
	key := func(s sample) string {
		var ls []string
		for k, v := range s.labels {
			if k != "instance" && k != "role" {
				ls = append(ls, k+"="+v)
			}
		}
		slices.Sort(ls)
		return strings.TrimSpace(s.name + " " + strings.Join(ls, ","))
	}
	for _, s := range after {
		if strings.Contains(strings.ToLower(s.name), "deleg") {
			d[key(s)] += s.value
		}
	}
	for _, s := range before {
		if strings.Contains(strings.ToLower(s.name), "deleg") {
			d[key(s)] -= s.value
		}
	}
	return d
}

// cbRecalls counts, in a VM's capture, the CB_RECALL calls the server
// sent to the guest and the guest's replies by status.
func cbRecalls(ctx context.Context, capture string, port int) (calls int, replies map[int]int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "tshark", "-n", "-r", capture,
		"-d", "tcp.port=="+strconv.Itoa(port)+",rpc",
		"-Y", "nfs.cb.operation == 4",
		"-T", "fields", "-E", "separator=/t",
		"-e", "ip.src", "-e", "rpc.msgtyp", "-e", "nfs.cb.operation", "-e", "nfs.nfsstat4").Output()
	if err != nil {
		return 0, nil, fmt.Errorf("tshark -r %s: %w", capture, err)
	}
	calls, replies = parseCBRecalls(string(out))
	return calls, replies, nil
}

// parseCBRecalls reads cbRecalls' tshark fields: one line per frame with
// the source address, the RPC message types (0 call, 1 reply), the
// callback operations and the NFS status codes, each comma-separated.
// A frame may carry several RPC messages.
func parseCBRecalls(out string) (calls int, replies map[int]int) {
	replies = map[int]int{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(l, "\t")
		if len(f) < 4 {
			continue
		}
		recalls := 0
		for _, op := range strings.Split(f[2], ",") {
			if strings.TrimSpace(op) == "4" {
				recalls++
			}
		}
		switch f[0] {
		case "10.0.2.15": // the guest's reply
			st := -1
			if s := strings.Split(f[3], ",")[0]; s != "" {
				st, _ = strconv.Atoi(s)
			}
			replies[st] += recalls
		default: // the server's call
			calls += recalls
		}
	}
	return calls, replies
}
