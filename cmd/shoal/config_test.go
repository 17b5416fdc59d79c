package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// configTestCmd is a command with the kinds of flags the servers have,
// including a deprecated alias (--old-addr for --addr, bound to the same
// variable, as --metrics is for --http),
// under a root with a persistent flag as shoal's --log-level is.
type configTestCmd struct {
	root, cmd *cobra.Command
	addr      string
	unit      uint64
	lease     time.Duration
	squash    bool
	level     string
}

func newConfigTestCmd() *configTestCmd {
	c := &configTestCmd{}
	c.root = &cobra.Command{Use: "shoal"}
	c.root.PersistentFlags().StringVar(&c.level, "log-level", "info", "")
	c.cmd = &cobra.Command{Use: "srv"}
	c.cmd.Flags().StringVar(&c.addr, "addr", "127.0.0.1:1", "")
	c.cmd.Flags().StringVar(&c.addr, "old-addr", "127.0.0.1:1", "")
	_ = c.cmd.Flags().MarkDeprecated("old-addr", "use --addr")
	c.cmd.Flags().Uint64Var(&c.unit, "stripe-unit", 64, "")
	c.cmd.Flags().DurationVar(&c.lease, "lease", 90*time.Second, "")
	c.cmd.Flags().BoolVar(&c.squash, "no-root-squash", false, "")
	c.cmd.Flags().String("config", "", "")
	c.root.AddCommand(c.cmd)
	return c
}

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		args    []string
		want    string // addr unit lease squash level exports
		wantErr string
	}{
		{name: "defaults", file: "", want: "127.0.0.1:1 64 1m30s false info []"},
		{name: "file", file: "addr: 10.0.0.1:2049\nstripe_unit: 4096\nlease: 5s\nno_root_squash: true\nlog_level: warn\n",
			want: "10.0.0.1:2049 4096 5s true warn []"},
		{name: "command line wins", file: "addr: 10.0.0.1:2049\nlease: 5s\n", args: []string{"--lease", "7s"},
			want: "10.0.0.1:2049 64 7s false info []"},
		{name: "alias on the command line wins over the key", file: "addr: 10.0.0.1:2049\n", args: []string{"--old-addr", "10.0.0.2:1"},
			want: "10.0.0.2:1 64 1m30s false info []"},
		{name: "alias key", file: "old_addr: 10.0.0.3:1\n", want: "10.0.0.3:1 64 1m30s false info []"},
		{name: "null is the default", file: "addr:\nlease: 5s\n", want: "127.0.0.1:1 64 5s false info []"},
		{name: "exports", file: "exports:\n  - path: /a\n    ro: true\n", want: "127.0.0.1:1 64 1m30s false info [/a]"},
		{name: "unknown key", file: "addr: x\nstrip_unit: 1\n", wantErr: `line 2: strip_unit: unknown key; shoal srv takes addr, exports, lease, log_level, no_root_squash, stripe_unit`},
		{name: "dash spelling", file: "stripe-unit: 1\n", wantErr: "line 1: stripe-unit: unknown key"},
		{name: "not a flag key", file: "config: /x\n", wantErr: "config: unknown key"},
		{name: "unknown export field", file: "exports:\n  - path: /\n    root_sqash: false\n", wantErr: "line 3: field root_sqash not found"},
		{name: "duplicate key", file: "lease: 1s\nlease: 2s\n", wantErr: `line 2: mapping key "lease" already defined at line 1`},
		{name: "alias and name both set", file: "addr: a:1\nold_addr: b:1\n", wantErr: "line 2: old_addr: addr already sets --old-addr"},
		{name: "bad value", file: "lease: soon\n", wantErr: `line 1: lease: time: invalid duration "soon"`},
		{name: "list for a flag", file: "addr: [a, b]\n", wantErr: "line 1: addr: want a single value, as for --addr"},
		{name: "bad log level", file: "log_level: loud\n", wantErr: `bad --log-level "loud"`},
		{name: "not a mapping", file: "- a\n", wantErr: "cannot unmarshal !!seq"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// setLogLevel replaces the default logger; put it back.
			t.Cleanup(func() { _ = setLogLevel("info") })
			c := newConfigTestCmd()
			path := ""
			if tc.file != "" {
				path = filepath.Join(t.TempDir(), "srv.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var got string
			c.cmd.RunE = func(cmd *cobra.Command, args []string) error {
				keys, err := loadConfig[exportsFile](cmd, path)
				if err != nil {
					return err
				}
				var paths []string
				for _, e := range keys.Exports {
					paths = append(paths, e.Path)
				}
				got = fmt.Sprintf("%s %d %v %t %s %v", c.addr, c.unit, c.lease, c.squash, c.level, paths)
				return nil
			}
			c.root.SetArgs(append([]string{"srv"}, tc.args...))
			c.root.SilenceErrors, c.root.SilenceUsage = true, true
			c.root.SetErr(io.Discard) // "Flag --old-addr has been deprecated"
			err := c.root.Execute()
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case got != tc.want:
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestExampleConfigs loads the packaged configurations (dist/etc) into the
// real shoal mds and shoal ds commands: every key must be one they take.
func TestExampleConfigs(t *testing.T) {
	for _, tc := range []struct {
		cmd, file string
		load      func(*cobra.Command, string) error
	}{
		{"mds", "mds.yaml", func(c *cobra.Command, p string) error { _, err := loadConfig[exportsFile](c, p); return err }},
		{"ds", "ds.yaml", func(c *cobra.Command, p string) error { _, err := loadConfig[struct{}](c, p); return err }},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			t.Cleanup(func() { _ = setLogLevel("info") })
			cmd, _, err := newRootCmd().Find([]string{tc.cmd})
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.ParseFlags(nil); err != nil { // merges --log-level in, as Execute does
				t.Fatal(err)
			}
			if err := tc.load(cmd, filepath.Join("..", "..", "dist", "etc", tc.file)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
