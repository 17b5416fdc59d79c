package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/bytesize"
)

// policyFlags puts the client library's policy (client.Policy: block
// size, requests in flight per data server, when layouts are fetched and
// kept, the small-I/O threshold, readahead, cache size, access method,
// how long I/O retries NFS4ERR_DELAY) on
// a command's command line: every setting as a flag (registerPolicyFlags)
// and --policy FILE for a YAML file of them (loadPolicy), the flags
// overriding the file.
type policyFlags struct {
	file  string
	flags client.Policy
	fs    *pflag.FlagSet
}

// addPolicyFlags adds the policy flags to cmd, except those named in skip
// (settings the command has a flag of its own for).
func addPolicyFlags(cmd *cobra.Command, skip ...string) *policyFlags {
	p := &policyFlags{fs: cmd.Flags()}
	all := pflag.NewFlagSet("policy", pflag.ContinueOnError)
	registerPolicyFlags(all, "", &p.flags)
	all.VisitAll(func(f *pflag.Flag) {
		if !slices.Contains(skip, f.Name) {
			cmd.Flags().AddFlag(f)
		}
	})
	cmd.Flags().StringVar(&p.file, "policy", "",
		"YAML file of client policy settings (access, block_size, max_per_ds, layout_fetch, keep_layouts, small_io_threshold, readahead, cache_size, io_retry_timeout, unstable_limit); flags override it")
	return p
}

// policy returns the policy of the command line: the --policy file's
// settings with every flag given on the command line applied over them.
func (p *policyFlags) policy() (client.Policy, error) {
	var base client.Policy
	if p.file != "" {
		var err error
		if base, err = loadPolicy(p.file); err != nil {
			return client.Policy{}, err
		}
	}
	pol := mergePolicyFlags(p.fs, "", base, p.flags)
	if err := pol.Validate(); err != nil {
		return client.Policy{}, fmt.Errorf("policy: %w", err)
	}
	return pol, nil
}

// loadPolicy reads a client.Policy from a YAML file. Keys are the yaml names of
// the fields (access, block_size, max_per_ds, layout_fetch, keep_layouts,
// small_io_threshold, readahead, cache_size, io_retry_timeout,
// unstable_limit); sizes are
// byte counts or strings with a unit ("4MiB" or "4M" is 4194304, "4MB"
// 4000000), durations Go
// durations ("30s", "1m") or a number of seconds. Unknown keys are errors.
func loadPolicy(path string) (client.Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return client.Policy{}, fmt.Errorf("loading policy: %w", err)
	}
	return parsePolicy(b)
}

// parsePolicy is loadPolicy on the contents of a file.
func parsePolicy(b []byte) (client.Policy, error) {
	var raw struct {
		Access           client.Access      `yaml:"access"`
		BlockSize        byteSize           `yaml:"block_size"`
		MaxPerDS         int                `yaml:"max_per_ds"`
		LayoutFetch      client.LayoutFetch `yaml:"layout_fetch"`
		KeepLayouts      bool               `yaml:"keep_layouts"`
		SmallIOThreshold byteSize           `yaml:"small_io_threshold"`
		Readahead        byteSize           `yaml:"readahead"`
		CacheSize        byteSize           `yaml:"cache_size"`
		IORetryTimeout   duration           `yaml:"io_retry_timeout"`
		UnstableLimit    byteSize           `yaml:"unstable_limit"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return client.Policy{}, fmt.Errorf("parsing policy: %w", err)
	}
	p := client.Policy{
		Access: raw.Access, BlockSize: int(raw.BlockSize), MaxPerDS: raw.MaxPerDS,
		LayoutFetch: raw.LayoutFetch, KeepLayouts: raw.KeepLayouts,
		SmallIOThreshold: int(raw.SmallIOThreshold), Readahead: int(raw.Readahead),
		CacheSize: int64(raw.CacheSize), IORetryTimeout: time.Duration(raw.IORetryTimeout),
		UnstableLimit: int64(raw.UnstableLimit),
	}
	return p, p.Validate()
}

// byteSize is a size in bytes that config files and flags may write with a
// unit: KiB/MiB/GiB (powers of 1024), KB/MB/GB (powers of 1000), or a bare
// K/M/G (powers of 1024), and negative where that means off; see
// internal/bytesize.
type byteSize int64

func (b *byteSize) UnmarshalText(t []byte) error {
	v, err := bytesize.ParseSigned(string(t))
	if err != nil {
		return err
	}
	*b = byteSize(v)
	return nil
}

// duration is a time.Duration that config files may write as a Go
// duration ("30s") or a number of seconds.
type duration time.Duration

func (d *duration) UnmarshalText(t []byte) error {
	s := strings.TrimSpace(string(t))
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		*d = duration(n * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("bad duration %q", s)
	}
	*d = duration(v)
	return nil
}

// sizeFlag is a pflag.Value for an int or int64 size field.
type sizeFlag struct {
	set func(int64)
	get func() int64
}

func (s sizeFlag) String() string {
	if s.get == nil {
		return "0"
	}
	return fmt.Sprint(s.get())
}
func (s sizeFlag) Set(v string) error {
	n, err := bytesize.ParseSigned(v)
	if err != nil {
		return err
	}
	s.set(n)
	return nil
}
func (s sizeFlag) Type() string { return "bytes" }

// registerPolicyFlags adds flags for every client.Policy setting to fs, writing into p,
// under the given prefix ("" or e.g. "client-"): access, block-size,
// max-per-ds, layout-fetch, keep-layouts, small-io-threshold, readahead,
// cache-size, io-retry-timeout, unstable-limit. Sizes take units: KiB, MiB and GiB
// (or a bare K, M, G) are powers of 1024, KB, MB and GB powers of 1000. Values already in p (say,
// from loadPolicy) are the flags' defaults, so flags override a config
// file when the file is loaded first.
func registerPolicyFlags(fs *pflag.FlagSet, prefix string, p *client.Policy) {
	fs.Var(&p.Access, prefix+"access", "data access method: cached, odirect or direct")
	fs.Var(sizeFlag{func(v int64) { p.BlockSize = int(v) }, func() int64 { return int64(p.BlockSize) }},
		prefix+"block-size", "transfer size for cached/odirect I/O (0: server's layout_blksize, else 4MiB)")
	fs.IntVar(&p.MaxPerDS, prefix+"max-per-ds", p.MaxPerDS, "max requests in flight per pNFS data server (0: 8)")
	fs.Var(&p.LayoutFetch, prefix+"layout-fetch", "when to fetch pNFS layouts: open or first-io")
	fs.BoolVar(&p.KeepLayouts, prefix+"keep-layouts", p.KeepLayouts, "keep pNFS layouts after close")
	fs.Var(sizeFlag{func(v int64) { p.SmallIOThreshold = int(v) }, func() int64 { return int64(p.SmallIOThreshold) }},
		prefix+"small-io-threshold", "send requests smaller than this through the metadata server (0: 64KiB, negative: never)")
	fs.Var(sizeFlag{func(v int64) { p.Readahead = int(v) }, func() int64 { return int64(p.Readahead) }},
		prefix+"readahead", "readahead for sequential reads in cached mode (0: 1MiB, negative: off)")
	fs.Var(sizeFlag{func(v int64) { p.CacheSize = v }, func() int64 { return p.CacheSize }},
		prefix+"cache-size", "data cache size for cached mode (0: 64MiB)")
	fs.DurationVar(&p.IORetryTimeout, prefix+"io-retry-timeout", p.IORetryTimeout,
		"how long a read, write or commit the server keeps answering NFS4ERR_DELAY is retried before it fails (0: 30s)")
	fs.Var(sizeFlag{func(v int64) { p.UnstableLimit = v }, func() int64 { return p.UnstableLimit }},
		prefix+"unstable-limit", "memory per open file for copies of unstable writes kept until committed (0: 64MiB)")
}

// mergePolicyFlags returns base (say, from loadPolicy) with every setting whose
// flag was given on the command line taken from flags, the Policy that
// registerPolicyFlags(fs, prefix, &flags) filled. This lets a config file be
// loaded after flag parsing and still be overridden by explicit flags.
func mergePolicyFlags(fs *pflag.FlagSet, prefix string, base, flags client.Policy) client.Policy {
	set := func(name string) bool { return fs.Changed(prefix + name) }
	if set("access") {
		base.Access = flags.Access
	}
	if set("block-size") {
		base.BlockSize = flags.BlockSize
	}
	if set("max-per-ds") {
		base.MaxPerDS = flags.MaxPerDS
	}
	if set("layout-fetch") {
		base.LayoutFetch = flags.LayoutFetch
	}
	if set("keep-layouts") {
		base.KeepLayouts = flags.KeepLayouts
	}
	if set("small-io-threshold") {
		base.SmallIOThreshold = flags.SmallIOThreshold
	}
	if set("readahead") {
		base.Readahead = flags.Readahead
	}
	if set("cache-size") {
		base.CacheSize = flags.CacheSize
	}
	if set("io-retry-timeout") {
		base.IORetryTimeout = flags.IORetryTimeout
	}
	if set("unstable-limit") {
		base.UnstableLimit = flags.UnstableLimit
	}
	return base
}
