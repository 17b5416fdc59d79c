package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/flexv3"
)

// mdsFile is shoal mds's configuration file: the exports, and the
// loosely coupled NFSv3 data servers (flex_v3_servers, a list, which a
// flag-named key cannot be).
type mdsFile struct {
	exportsFile   `yaml:",inline"`
	FlexV3Servers []string `yaml:"flex_v3_servers"`
}

// flexV3Flags are `shoal mds --flex-v3-server` (repeatable; added to the
// configuration file's flex_v3_servers) and `--flex-v3-mirrors`: standard
// NFSv3 servers (NFS-Ganesha, knfsd) as the flexfiles exports' data
// servers (docs/flexfiles.md).
type flexV3Flags struct {
	servers []string
	mirrors int
}

func (f *flexV3Flags) register(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.servers, "flex-v3-server", nil,
		"an NFSv3 server as a loosely coupled flexfiles data server: HOST:PORT/EXPORT[?mount=PORT&advertise=HOST:PORT] (repeat for each; with it the flexfiles exports keep their data there)")
	cmd.Flags().IntVar(&f.mirrors, "flex-v3-mirrors", 0, "copies of each file on the NFSv3 data servers, each on another server (default 2, 1 with one server)")
}

// config returns the flexv3 configuration, or nil when no NFSv3 data
// server is named.
func (f *flexV3Flags) config(file []string) (*flexv3.Config, error) {
	all := append(append([]string(nil), file...), f.servers...)
	if len(all) == 0 {
		if f.mirrors != 0 {
			return nil, fmt.Errorf("--flex-v3-mirrors without --flex-v3-server")
		}
		return nil, nil
	}
	cfg := &flexv3.Config{Mirrors: f.mirrors}
	for _, s := range all {
		srv, err := flexv3.ParseServer(s)
		if err != nil {
			return nil, err
		}
		cfg.Servers = append(cfg.Servers, srv)
	}
	return cfg, nil
}
