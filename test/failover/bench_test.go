package failover

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestFailoverBench is the failover benchmark (scripts/failover-bench.sh):
// SHOAL_FAILOVER_TRIALS trials (default 20) of each fault under Shoal's
// client workload, one cluster per fault whose leader is taken away again
// and again, printing each trial's times and the median and maximum, and
// writing them as JSON to SHOAL_FAILOVER_OUT if set. It reports, it does
// not judge: the targets are for the person reading the table. Without
// SHOAL_FAILOVER_BENCH=1 it is skipped.
func TestFailoverBench(t *testing.T) {
	if os.Getenv("SHOAL_FAILOVER_BENCH") != "1" {
		t.Skip("the failover benchmark runs with SHOAL_FAILOVER_BENCH=1 (scripts/failover-bench.sh)")
	}
	trials := 20
	if n, err := strconv.Atoi(os.Getenv("SHOAL_FAILOVER_TRIALS")); err == nil && n > 0 {
		trials = n
	}
	size := 32 << 20
	if n, err := strconv.Atoi(os.Getenv("SHOAL_FAILOVER_BIG_MB")); err == nil && n > 0 {
		size = n << 20
	}
	type summary struct {
		Fault                         Fault   `json:"fault"`
		Trials                        []Trial `json:"trials"`
		DetectMedian, DetectMax       float64
		FirstMetaMedian, FirstMetaMax float64
		IOResumeMedian, IOResumeMax   float64
		PauseMedian, PauseMax         float64
	}
	var all []summary
	for _, f := range []Fault{Kill, Stop, StepDown} {
		w := newCluster(t)
		s := summary{Fault: f}
		for i := range trials {
			tr := runTrial(t, w, f, size, fmt.Sprintf("/%s-%02d", f, i))
			fmt.Printf("trial %2d  %s\n", i+1, tr)
			s.Trials = append(s.Trials, tr)
		}
		s.DetectMedian, s.DetectMax = stats(s.Trials, func(t Trial) time.Duration { return t.Detect })
		s.FirstMetaMedian, s.FirstMetaMax = stats(s.Trials, func(t Trial) time.Duration { return t.FirstMeta })
		s.IOResumeMedian, s.IOResumeMax = stats(s.Trials, func(t Trial) time.Duration { return t.IOResume })
		s.PauseMedian, s.PauseMax = stats(s.Trials, func(t Trial) time.Duration { return t.Pause })
		all = append(all, s)
	}
	fmt.Printf("\nfailover, Shoal's client, %d trials each (%d CPUs, %s), seconds: median / max\n", trials, runtime.NumCPU(), runtime.Version())
	fmt.Printf("%-9s %15s %19s %15s %19s\n", "fault", "detect", "first metadata op", "I/O resumed", "longest I/O pause")
	for _, s := range all {
		fmt.Printf("%-9s %7.2f / %5.2f %11.2f / %5.2f %7.2f / %5.2f %11.2f / %5.2f\n", s.Fault,
			s.DetectMedian, s.DetectMax, s.FirstMetaMedian, s.FirstMetaMax, s.IOResumeMedian, s.IOResumeMax, s.PauseMedian, s.PauseMax)
	}
	if out := os.Getenv("SHOAL_FAILOVER_OUT"); out != "" {
		b, _ := json.MarshalIndent(all, "", "  ")
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// stats returns the median and the maximum of one time of the trials, in
// seconds.
func stats(trials []Trial, of func(Trial) time.Duration) (median, max float64) {
	var v []float64
	for _, t := range trials {
		v = append(v, of(t).Seconds())
	}
	if len(v) == 0 {
		return 0, 0
	}
	slices.Sort(v)
	return v[len(v)/2], v[len(v)-1]
}
