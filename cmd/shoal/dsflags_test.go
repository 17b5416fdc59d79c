package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDSMDSList: shoal ds takes one MDS address or several (failover),
// comma-separated, on the command line and under the mds key alike.
func TestDSMDSList(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		file string
		want []string
	}{
		{"one address", []string{"--mds", "10.0.0.1:2049"}, "", []string{"10.0.0.1:2049"}},
		{"several", []string{"--mds", "10.0.0.1:2049,10.0.0.5:2049"}, "", []string{"10.0.0.1:2049", "10.0.0.5:2049"}},
		{"flag given twice", []string{"--mds", "10.0.0.1:2049", "--mds", "10.0.0.5:2049"}, "", []string{"10.0.0.1:2049", "10.0.0.5:2049"}},
		{"key, one address", nil, "mds: 10.0.0.1:2049\n", []string{"10.0.0.1:2049"}},
		{"key, several", nil, "mds: 10.0.0.1:2049,10.0.0.5:2049\n", []string{"10.0.0.1:2049", "10.0.0.5:2049"}},
		{"command line wins", []string{"--mds", "10.0.0.9:2049"}, "mds: 10.0.0.1:2049,10.0.0.5:2049\n", []string{"10.0.0.9:2049"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { _ = setLogLevel("info") })
			cmd, _, err := newRootCmd().Find([]string{"ds"})
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			path := ""
			if tc.file != "" {
				path = filepath.Join(t.TempDir(), "ds.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := loadConfig[struct{}](cmd, path); err != nil {
				t.Fatal(err)
			}
			got, err := cmd.Flags().GetStringSlice("mds")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("--mds %q, want %q", got, tc.want)
			}
		})
	}
}
