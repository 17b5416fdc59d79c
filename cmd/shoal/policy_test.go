package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/client"
)

// TestPolicyFlags checks the command-line side of the client policy: every
// setting as a flag, --policy FILE, flags over the file, skipped flags
// absent, and invalid settings refused.
func TestPolicyFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("access: odirect\nblock_size: 2M\nmax_per_ds: 4\nreadahead: 8M\nkeep_layouts: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		skip    []string
		args    []string
		want    client.Policy
		wantErr string
	}{
		{name: "nothing given", want: client.Policy{}},
		{name: "every flag", args: []string{"--access=direct", "--block-size=1M", "--max-per-ds=3", "--layout-fetch=open",
			"--keep-layouts", "--small-io-threshold=64K", "--readahead=-1", "--cache-size=256M"},
			want: client.Policy{Access: client.AccessDirect, BlockSize: 1 << 20, MaxPerDS: 3, LayoutFetch: client.LayoutOnOpen,
				KeepLayouts: true, SmallIOThreshold: 64 << 10, Readahead: -1, CacheSize: 256 << 20}},
		{name: "file", args: []string{"--policy=" + file},
			want: client.Policy{Access: client.AccessODirect, BlockSize: 2 << 20, MaxPerDS: 4, Readahead: 8 << 20, KeepLayouts: true}},
		{name: "flags over the file", args: []string{"--policy=" + file, "--block-size=4M", "--readahead=0"},
			want: client.Policy{Access: client.AccessODirect, BlockSize: 4 << 20, MaxPerDS: 4, Readahead: 0, KeepLayouts: true}},
		{name: "skipped flag", skip: []string{"access"}, args: []string{"--access=direct"}, wantErr: "unknown flag: --access"},
		{name: "invalid", args: []string{"--block-size=128M"}, wantErr: "block_size"},
		{name: "missing file", args: []string{"--policy=" + file + ".none"}, wantErr: "no such file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
			p := addPolicyFlags(cmd, tt.skip...)
			err := cmd.ParseFlags(tt.args)
			var got client.Policy
			if err == nil {
				got, err = p.policy()
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("policy = %+v, want %+v", got, tt.want)
			}
		})
	}
}
