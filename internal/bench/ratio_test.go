package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestRatios: every target's median is divided by Ganesha's on the same
// workload, the goals of issue 27 are attached to create and remove, and
// the table says whether each goal is met.
func TestRatios(t *testing.T) {
	res := func(workload string, median float64) Result {
		return Result{Workload: workload, Unit: "ops/s", Samples: []float64{median}, Summary: Summary{Median: median}}
	}
	targets := []TargetReport{
		{Name: TargetShoal, Results: []Result{res("create 10 files", 300), res("stat 10 files", 50), res("remove 10 files", 100)}},
		{Name: TargetShoalAsync, Results: []Result{res("create 10 files", 500), res("remove 10 files", 150)}},
		{Name: TargetGanesha, Results: []Result{res("create 10 files", 100), res("stat 10 files", 100), res("remove 10 files", 100)}},
	}
	got := computeRatios(targets, TargetGanesha)
	want := []Ratio{
		{TargetShoal, TargetGanesha, "create 10 files", 3, 1.5},
		{TargetShoal, TargetGanesha, "stat 10 files", 0.5, 0},
		{TargetShoal, TargetGanesha, "remove 10 files", 1, 1.5},
		{TargetShoalAsync, TargetGanesha, "create 10 files", 5, 2},
		{TargetShoalAsync, TargetGanesha, "remove 10 files", 1.5, 2},
	}
	if len(got) != len(want) {
		t.Fatalf("ratios %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("ratio %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	var b bytes.Buffer
	if err := writeRatios(&b, got); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"shoal        create 10 files  3.00×  ≥ 1.5× (met)", "shoal-async  remove 10 files  1.50×  ≥ 2.0× (NOT met)"} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, b.String())
		}
	}
	if r := computeRatios(targets[:2], TargetGanesha); r != nil {
		t.Errorf("without Ganesha: %+v, want none", r)
	}
}
