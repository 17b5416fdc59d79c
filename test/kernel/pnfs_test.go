package kernel

import (
	"slices"
	"strings"
	"testing"
)

// These tests cover the pNFS driver code (ready line, metrics, split
// check) without a VM.

func TestParseReadyPorts(t *testing.T) {
	tests := []struct {
		line    string
		want    []int
		wantErr bool
	}{
		{line: "shoal up: ready: MDS 127.0.0.1:41571, 4 data servers [127.0.0.1:45787 127.0.0.1:45581 127.0.0.1:46711 127.0.0.1:38619], stripe unit 1048576, data in /d",
			want: []int{45787, 45581, 46711, 38619}},
		{line: "shoal up: ready: MDS 127.0.0.1:1, 0 data servers [], stripe unit 1", want: nil},
		{line: "shoal up: ready: MDS 127.0.0.1:1", wantErr: true},
		{line: "shoal up: ready: 1 data servers [127.0.0.1:x]", wantErr: true},
	}
	for _, tc := range tests {
		got, err := parseReadyPorts(tc.line)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("parseReadyPorts(%q) = %v, %v; want %v, err %v", tc.line, got, err, tc.want, tc.wantErr)
		}
	}
}

const metricsText = `# HELP shoal_nfs_bytes_total NFS payload bytes.
# TYPE shoal_nfs_bytes_total counter
shoal_nfs_bytes_total{dir="read",instance="0",role="ds"} 100
shoal_nfs_bytes_total{dir="read",instance="1",role="ds"} 1.5e+02
shoal_nfs_bytes_total{dir="read",instance="mds",role="mds"} 7
shoal_nfs_ops_total{instance="mds",op="LAYOUTRETURN",role="mds"} 3
shoal_pnfs_events_total{event="layout_recall",instance="mds",role="mds"} 2
go_goroutines 42
`

func TestParseMetrics(t *testing.T) {
	s, err := parseMetrics(strings.NewReader(metricsText))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		match []string
		want  float64
	}{
		{"shoal_nfs_bytes_total", []string{"dir", "read"}, 257},
		{"shoal_nfs_bytes_total", []string{"dir", "read", "role", "ds"}, 250},
		{"shoal_nfs_bytes_total", []string{"instance", "1"}, 150},
		{"shoal_nfs_ops_total", []string{"op", "LAYOUTRETURN"}, 3},
		{"shoal_pnfs_events_total", []string{"event", "fence"}, 0},
		{"go_goroutines", nil, 42},
	} {
		if got := s.get(tc.name, tc.match...); got != tc.want {
			t.Errorf("get(%s, %v) = %v, want %v", tc.name, tc.match, got, tc.want)
		}
	}
	if _, err := parseMetrics(strings.NewReader("novalue\n")); err == nil {
		t.Error("a line without a value parsed")
	}
}

func TestCheckSplit(t *testing.T) {
	even := func(ds, mds float64) []ioRow {
		var rows []ioRow
		for _, in := range []string{"ds-a", "ds-b", "ds-c", "ds-d", "mds"} {
			v := ds
			if in == "mds" {
				v = mds
			}
			rows = append(rows, ioRow{instance: in, readBytes: v, writeBytes: v})
		}
		return rows
	}
	const size = 64 << 20
	tests := []struct {
		name string
		rows []ioRow
		bad  int
	}{
		{"even", even(size/nDS, 0), 0},
		{"small MDS share", even(size/nDS, 4096), 0},
		{"through the MDS", even(0, size), 2*nDS + 1},
	}
	skew := even(size/nDS, 0)
	skew[0].writeBytes *= 1.5
	tests = append(tests, struct {
		name string
		rows []ioRow
		bad  int
	}{"one DS skewed", skew, 1})
	// A data server missing from the metrics is a problem of its own.
	tests = append(tests, struct {
		name string
		rows []ioRow
		bad  int
	}{"a DS missing", even(size/nDS, 0)[1:], 1})
	for _, tc := range tests {
		if got := checkSplit(tc.rows, nDS, size, 0.15, 1<<20); len(got) != tc.bad {
			t.Errorf("%s: %d problems %v, want %d", tc.name, len(got), got, tc.bad)
		}
	}
}

// The data servers' metric instances are their IDs, found in the scrape.
func TestIOSplitInstances(t *testing.T) {
	parse := func(text string) snapshot {
		s, err := parseMetrics(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := parse(`shoal_nfs_bytes_total{dir="write",instance="ds-0b",role="ds"} 10
shoal_nfs_bytes_total{dir="write",instance="mds",role="mds"} 1
`)
	after := parse(`shoal_nfs_bytes_total{dir="write",instance="ds-0b",role="ds"} 110
shoal_nfs_bytes_total{dir="read",instance="ds-0b",role="ds"} 5
shoal_nfs_bytes_total{dir="write",instance="ds-0a",role="ds"} 200
shoal_nfs_ops_total{instance="ds-0a",op="WRITE",role="ds"} 2
shoal_nfs_bytes_total{dir="write",instance="mds",role="mds"} 1
`)
	if got := dsInstances(after); !slices.Equal(got, []string{"ds-0a", "ds-0b"}) {
		t.Errorf("dsInstances = %v", got)
	}
	rows := ioSplit(before, after)
	want := []ioRow{
		{instance: "ds-0a", writeBytes: 200, writeOps: 2},
		{instance: "ds-0b", readBytes: 5, writeBytes: 100},
		{instance: "mds"},
	}
	if !slices.Equal(rows, want) {
		t.Errorf("ioSplit = %+v, want %+v", rows, want)
	}
}

func TestLineTap(t *testing.T) {
	var log strings.Builder
	tap := &lineTap{w: &log, prefix: "shoal up: ready:", found: make(chan string, 1)}
	for _, chunk := range []string{"time=1 msg=x\nshoal up: re", "ady: MDS 1, 4 data servers []\n  mount: ...\n", "shoal up: ready: again\n"} {
		if n, err := tap.Write([]byte(chunk)); err != nil || n != len(chunk) {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	select {
	case l := <-tap.found:
		if l != "shoal up: ready: MDS 1, 4 data servers []" {
			t.Errorf("ready line %q", l)
		}
	default:
		t.Fatal("no ready line reported")
	}
	if !strings.Contains(log.String(), "again") {
		t.Error("output after the ready line was not copied to the log")
	}
}

func TestRecallsBetween(t *testing.T) {
	out := "\t.mark-recall-truncate-before\t\n" +
		"10060,0,10060\t\t11,5\n" +
		"\t.mark-recall-truncate-after\t\n" +
		"\t.mark-recall-rm-before\t\n" +
		"0,0,0\t\t11,5\n" +
		"10008,0,10008\t\t11,5\n" +
		"\t.mark-recall-rm-after\t\n" +
		"10060,0,10060\t\t11,5\n"
	evs := parseRecallEvents(out)
	for _, tc := range []struct {
		tag    string
		want   map[int]int
		marked bool
	}{
		{"recall-truncate", map[int]int{10060: 1}, true},
		{"recall-rm", map[int]int{0: 1, 10008: 1}, true},
		{"io64", map[int]int{}, false},
	} {
		got, ok := recallsBetween(evs, tc.tag)
		if ok != tc.marked || len(got) != len(tc.want) {
			t.Errorf("%s: %v, %v; want %v, %v", tc.tag, got, ok, tc.want, tc.marked)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%s: status %d: %d, want %d", tc.tag, k, got[k], v)
			}
		}
	}
}
