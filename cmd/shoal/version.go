package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is the release and commit the commit, set at build time with
// -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)".
// Without -X, the commit comes from the Go toolchain's VCS stamping (go
// build in a git checkout, unless GOFLAGS has -buildvcs=false).
var (
	version = "dev"
	commit  = ""
)

// buildInfo is what `shoal version` prints.
type buildInfo struct {
	Version, Commit, Time, Go string
	Modified                  bool
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Commit: "unknown", Go: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if commit != "" || !ok {
		if commit != "" {
			b.Commit = commit
		}
		return b
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

func (b buildInfo) write(w io.Writer) {
	commit := b.Commit
	if b.Modified {
		commit += " (with uncommitted changes)"
	}
	fmt.Fprintf(w, "shoal %s\ncommit %s\n", b.Version, commit)
	if b.Time != "" {
		fmt.Fprintf(w, "commit time %s\n", b.Time)
	}
	fmt.Fprintf(w, "go %s %s/%s\n", b.Go, runtime.GOOS, runtime.GOARCH)
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print Shoal's version, the commit it was built from, and the Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			readBuildInfo().write(cmd.OutOrStdout())
			return nil
		},
	}
}
