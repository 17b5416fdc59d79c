package main

import (
	"fmt"
	"slices"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/shoalfs/shoal/client"
)

// policyFlags puts the client library's policy (client.Policy: block
// size, requests in flight per data server, when layouts are fetched and
// kept, the small-I/O threshold, readahead, cache size, access method,
// how long I/O retries NFS4ERR_DELAY) on
// a command's command line: every setting as a flag (client.RegisterFlags)
// and --policy FILE for a YAML file of them (client.LoadPolicy), the flags
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
	client.RegisterFlags(all, "", &p.flags)
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
		if base, err = client.LoadPolicy(p.file); err != nil {
			return client.Policy{}, err
		}
	}
	pol := client.MergeFlags(p.fs, "", base, p.flags)
	if err := pol.Validate(); err != nil {
		return client.Policy{}, fmt.Errorf("policy: %w", err)
	}
	return pol, nil
}
