package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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

// TestPolicyFile covers the YAML file and the flags of every setting:
// units, off values, bad input, a file loaded after parsing overridden by
// the flags given.
func TestPolicyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	yml := "access: odirect\nblock_size: 2M\nmax_per_ds: 4\nlayout_fetch: open\nkeep_layouts: true\nsmall_io_threshold: 8K\nreadahead: -1\ncache_size: 32M\n"
	if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := loadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	want := client.Policy{Access: client.AccessODirect, BlockSize: 2 << 20, MaxPerDS: 4, LayoutFetch: client.LayoutOnOpen,
		KeepLayouts: true, SmallIOThreshold: 8 << 10, Readahead: -1, CacheSize: 32 << 20}
	if p != want {
		t.Fatalf("loadPolicy = %+v\nwant %+v", p, want)
	}
	for _, bad := range []string{"access: fast\n", "block_size: -4\n", "nonsense: 1\n", "cache_size: 3X\n",
		"io_retry_timeout: -1s\n", "io_retry_timeout: soon\n", "unstable_limit: -1\n"} {
		if _, err := parsePolicy([]byte(bad)); err == nil {
			t.Errorf("parsePolicy(%q) succeeded", bad)
		}
	}
	if p, err := parsePolicy(nil); err != nil || p != (client.Policy{}) {
		t.Errorf("empty policy: %+v, %v", p, err)
	}
	for _, tc := range []struct {
		yaml string
		want client.Policy
	}{
		{"io_retry_timeout: 45s\n", client.Policy{IORetryTimeout: 45 * time.Second}},
		{"io_retry_timeout: 2m\n", client.Policy{IORetryTimeout: 2 * time.Minute}},
		{"io_retry_timeout: 12\n", client.Policy{IORetryTimeout: 12 * time.Second}},
		{"io_retry_timeout: 0\n", client.Policy{}},
		{"unstable_limit: 16M\n", client.Policy{UnstableLimit: 16 << 20}},
		{"unstable_limit: 1048576\n", client.Policy{UnstableLimit: 1 << 20}},
		{"small_io_threshold: -1\n", client.Policy{SmallIOThreshold: -1}},
		{"small_io_threshold: 4097\n", client.Policy{SmallIOThreshold: 4097}},
		{"small_io_threshold: 1M\n", client.Policy{SmallIOThreshold: 1 << 20}},
	} {
		if p, err := parsePolicy([]byte(tc.yaml)); err != nil || p != tc.want {
			t.Errorf("parsePolicy(%q) = %+v, %v; want %+v", tc.yaml, p, err, tc.want)
		}
	}

	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	p = want
	registerPolicyFlags(fs, "", &p)
	if err := fs.Parse([]string{"--access=cached", "--block-size=64K", "--cache-size", "1G", "--keep-layouts=false", "--layout-fetch=first-io",
		"--io-retry-timeout=5s", "--unstable-limit=8M", "--small-io-threshold=-1"}); err != nil {
		t.Fatal(err)
	}
	want.Access, want.BlockSize, want.CacheSize, want.KeepLayouts, want.LayoutFetch = client.AccessCached, 64<<10, 1<<30, false, client.LayoutOnFirstIO
	want.IORetryTimeout, want.UnstableLimit, want.SmallIOThreshold = 5*time.Second, 8<<20, -1
	if p != want {
		t.Fatalf("flags: %+v\nwant %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Errorf("flags: %v", err)
	}
	// A file loaded after parsing, overridden by the flags given.
	var flagged client.Policy
	fs = pflag.NewFlagSet("t", pflag.ContinueOnError)
	registerPolicyFlags(fs, "nfs-", &flagged)
	if err := fs.Parse([]string{"--nfs-readahead=2M", "--nfs-unstable-limit=8M"}); err != nil {
		t.Fatal(err)
	}
	file := client.Policy{Access: client.AccessODirect, Readahead: 4 << 20, UnstableLimit: 1 << 20}
	if got := mergePolicyFlags(fs, "nfs-", file, flagged); got != (client.Policy{Access: client.AccessODirect, Readahead: 2 << 20, UnstableLimit: 8 << 20}) {
		t.Fatalf("mergePolicyFlags = %+v", got)
	}
}
