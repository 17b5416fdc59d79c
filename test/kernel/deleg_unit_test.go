package kernel

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseOpParts(t *testing.T) {
	detail := "1.16s pass1 OPEN=200 OPEN_NOATTR=0 GETATTR=0 CLOSE=200 READ=200 | pass2 OPEN=0 OPEN_NOATTR=3 DELEGRETURN=0 | drop DELEGRETURN=197"
	parts := parseOpParts(detail)
	if len(parts) != 3 {
		t.Fatalf("got %d parts %v, want 3", len(parts), parts)
	}
	p1, _ := part(parts, "pass1")
	if p1.opens() != 200 || p1.ops["READ"] != 200 {
		t.Errorf("pass1 = %v", p1.ops)
	}
	p2, _ := part(parts, "pass2")
	if p2.opens() != 3 {
		t.Errorf("pass2 opens = %d, want 3", p2.opens())
	}
	if got := sumOp(parts, "DELEGRETURN"); got != 197 {
		t.Errorf("DELEGRETURN over all parts = %d, want 197", got)
	}
	// Segments without counts (timings) are skipped.
	parts = parseOpParts("write+sync 30ms | write OPEN=0 OPEN_NOATTR=1")
	if len(parts) != 1 || parts[0].label != "write" || parts[0].opens() != 1 {
		t.Errorf("got %v", parts)
	}
}

func TestCheckPasses(t *testing.T) {
	mk := func(p1, p2, ret int) []opPart {
		return []opPart{
			{label: "pass1", ops: map[string]int{"OPEN": p1}},
			{label: "pass2", ops: map[string]int{"OPEN_NOATTR": p2}},
			{label: "drop", ops: map[string]int{"DELEGRETURN": ret}},
		}
	}
	for _, tc := range []struct {
		name    string
		on, off []opPart
		strict  bool
		want    []string // substrings of the problems, in order
	}{
		{"delegations used", mk(200, 0, 200), mk(200, 200, 0), true, nil},
		{"no delegations", mk(200, 200, 0), mk(200, 200, 0), true,
			[]string{"did not spare", "no DELEGRETURN", "fewer than half"}},
		{"not strict reports nothing on", mk(200, 200, 0), nil, false, nil},
		{"off returned delegations", mk(200, 0, 200), mk(200, 200, 5), true, []string{"returned 5 delegations"}},
		{"off baseline too low", mk(200, 0, 200), mk(200, 10, 0), true, []string{"only 10 OPENs"}},
		{"missing pass", []opPart{{label: "pass1", ops: map[string]int{}}}, nil, true, []string{"no pass1/pass2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := checkPasses(tc.on, tc.off, tc.strict)
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d matching %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to mention %q", i, got[i], w)
				}
			}
		})
	}
	table := formatPasses([]passRun{{name: "shoal delegations on", parts: mk(200, 0, 200)}})
	if !strings.Contains(table, "DELEGRETURN") || strings.Count(table, "\n") != 4 {
		t.Errorf("table:\n%s", table)
	}
}

func TestRendezvous(t *testing.T) {
	ctx := context.Background()
	rv := newRendezvous("", 5*time.Second)
	var wg sync.WaitGroup
	var reply string
	wg.Add(1)
	go func() {
		defer wg.Done()
		reply = rv.hook(ctx, "WAIT a-holds")
	}()
	if r := rv.hook(ctx, "POST a-holds 1234abcd"); r != "OK a-holds" {
		t.Errorf("POST reply %q", r)
	}
	wg.Wait()
	if reply != "OK a-holds 1234abcd" {
		t.Errorf("WAIT reply %q", reply)
	}
	// Posted before the WAIT: answered at once.
	if r := rv.hook(ctx, "WAIT a-holds"); r != "OK a-holds 1234abcd" {
		t.Errorf("second WAIT reply %q", r)
	}
	if r := rv.hook(ctx, "vm: something else"); r != "" {
		t.Errorf("reply to an ordinary line: %q", r)
	}
	// A WAIT for a tag of a VM that exited fails at once, not after the
	// timeout.
	rv.exit("b")
	start := time.Now()
	if r := rv.hook(ctx, "WAIT b-wrote"); !strings.HasPrefix(r, "ERR b-wrote ") {
		t.Errorf("WAIT for an exited VM: %q", r)
	}
	if time.Since(start) > 4*time.Second {
		t.Error("WAIT for an exited VM waited for the timeout")
	}
	short := newRendezvous("", 10*time.Millisecond)
	if r := short.hook(ctx, "WAIT c-never"); !strings.HasPrefix(r, "ERR c-never not posted") {
		t.Errorf("WAIT that times out: %q", r)
	}
	if _, _, err := short.window("a", "b"); err == nil {
		t.Error("window without metrics: no error")
	}
}

func TestParseCBRecalls(t *testing.T) {
	out := strings.Join([]string{
		"10.0.2.2\t0\t11,4\t",        // CB_SEQUENCE + CB_RECALL call
		"10.0.2.15\t1\t11,4\t0,0",    // the guest's reply, NFS4_OK
		"10.0.2.2\t1,0\t11,4\t0",     // a fore-channel reply and a call in one frame
		"10.0.2.15\t1\t11,4\t10008,", // NFS4ERR_DELAY
		"",
	}, "\n")
	calls, replies := parseCBRecalls(out)
	if calls != 2 {
		t.Errorf("calls = %d, want 2", calls)
	}
	if replies[0] != 1 || replies[10008] != 1 || len(replies) != 2 {
		t.Errorf("replies = %v", replies)
	}
}

func TestDelegMetrics(t *testing.T) {
	before, _ := parseMetrics(strings.NewReader(`shoal_nfs_ops_total{instance="mds",op="DELEGRETURN"} 1
shoal_nfs_delegations_total{event="recall",instance="mds"} 2
`))
	after, _ := parseMetrics(strings.NewReader(`shoal_nfs_ops_total{instance="mds",op="DELEGRETURN"} 3
shoal_nfs_delegations_total{event="recall",instance="mds"} 3
shoal_nfs_delegations{instance="mds"} 1
`))
	d := delegMetrics(before, after)
	if d["op DELEGRETURN"] != 2 || d["shoal_nfs_delegations_total event=recall"] != 1 || d["shoal_nfs_delegations"] != 1 {
		t.Errorf("delegMetrics = %v", d)
	}
}
