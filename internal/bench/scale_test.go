package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestScalePlace checks that exactly DirFiles files go to the large
// directory, spread over the numbers, and that no small directory holds
// more than SmallDirFiles.
func TestScalePlace(t *testing.T) {
	for _, c := range []ScaleConfig{
		{Files: 10, DirFiles: 1, SmallDirFiles: 3},
		{Files: 10, DirFiles: 10, SmallDirFiles: 1},
		{Files: 2000, DirFiles: 500, SmallDirFiles: 250},
		{Files: 1_000_000, DirFiles: 100_000, SmallDirFiles: 1000},
		{Files: 999_983, DirFiles: 77_777, SmallDirFiles: 1000},
	} {
		big, perDir := 0, map[int]int{}
		bigInFirstTenth := 0
		for i := range c.Files {
			b, d := c.place(i)
			if b {
				big++
				if i < c.Files/10 {
					bigInFirstTenth++
				}
				continue
			}
			perDir[d]++
		}
		if big != c.DirFiles {
			t.Errorf("%+v: %d files in the large directory, want %d", c, big, c.DirFiles)
		}
		if len(perDir) != c.smallDirs() {
			t.Errorf("%+v: %d small directories used, smallDirs says %d", c, len(perDir), c.smallDirs())
		}
		for d, n := range perDir {
			if n > c.SmallDirFiles || d < 0 || d >= c.smallDirs() {
				t.Errorf("%+v: small directory %d holds %d files", c, d, n)
			}
		}
		// Spread evenly: the first tenth of the numbers holds a tenth of
		// the large directory, give or take one.
		if want := c.DirFiles / 10; bigInFirstTenth < want-1 || bigInFirstTenth > want+1 {
			t.Errorf("%+v: %d large-directory files in the first tenth, want about %d", c, bigInFirstTenth, want)
		}
	}
}

// TestRunScaleInProcess runs a tiny scale workload on an in-process
// cluster and checks that every phase did all its files (rates are not
// asserted).
func TestRunScaleInProcess(t *testing.T) {
	cfg := QuickScaleConfig()
	cfg.Files, cfg.DirFiles, cfg.SmallDirFiles, cfg.Sessions = 300, 60, 50, 3
	dir := t.TempDir()
	rep, err := RunScale(context.Background(), cfg, ScaleSetup{Cluster: &ClusterInProcess{Dir: dir}, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]ScaleRate{
		"create all": rep.CreateAll, "create first": rep.CreateFirst, "create last": rep.CreateLast,
		"stat first": rep.StatFirst, "stat last": rep.StatLast,
	} {
		want := cfg.Files / 10
		if name == "create all" {
			want = cfg.Files
		}
		if r.Files != want || r.Rate <= 0 {
			t.Errorf("%s: %+v, want %d files at a positive rate", name, r, want)
		}
	}
	if rep.ListEntries != cfg.DirFiles {
		t.Errorf("ls -l listed %d entries, want %d", rep.ListEntries, cfg.DirFiles)
	}
	if rep.MetaDBBytes <= 0 {
		t.Errorf("meta.db size %d: not found under %s", rep.MetaDBBytes, dir)
	}
	var tab, js bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), "create, last 10%") {
		t.Errorf("table lacks the last-10%% row:\n%s", tab.String())
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back ScaleReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Kind != "scale" || back.ListEntries != cfg.DirFiles {
		t.Errorf("JSON round trip: %v, %+v", err, back)
	}
}
