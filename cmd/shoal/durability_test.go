package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestDurabilityConfig: --sync and --commit-interval are the config keys
// sync and commit_interval of serve, mds and up, and an export's own sync
// key is read with the exports.
func TestDurabilityConfig(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		args       []string
		want       string // sync interval export-sync
		wantErr    string
	}{
		{name: "defaults", want: "true 100ms -"},
		{name: "file", file: "sync: false\ncommit_interval: 50ms\n", want: "false 50ms -"},
		{name: "command line wins", file: "sync: false\n", args: []string{"--sync=true"}, want: "true 100ms -"},
		{name: "export key", file: "exports:\n  - path: /scratch\n    sync: false\n", want: "true 100ms false"},
		{name: "interval zero", file: "commit_interval: 0s\n", wantErr: "--commit-interval 0s"},
		{name: "interval too long", args: []string{"--commit-interval", "2m"}, wantErr: "--commit-interval 2m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d durabilityFlags
			var config string
			cmd := &cobra.Command{Use: "srv", RunE: func(*cobra.Command, []string) error { return nil }}
			d.register(cmd)
			cmd.Flags().StringVar(&config, "config", "", "")
			args := tc.args
			if tc.file != "" {
				path := filepath.Join(t.TempDir(), "srv.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", path)
			}
			if err := cmd.ParseFlags(args); err != nil {
				t.Fatal(err)
			}
			file, err := loadConfig[exportsFile](cmd, config)
			if err == nil {
				err = d.check()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			exp := "-"
			if len(file.Exports) > 0 && file.Exports[0].Sync != nil {
				exp = map[bool]string{true: "true", false: "false"}[*file.Exports[0].Sync]
			}
			got := strings.Join([]string{map[bool]string{true: "true", false: "false"}[d.sync], d.interval.String(), exp}, " ")
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
