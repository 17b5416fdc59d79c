package wiring

import (
	"context"
	"fmt"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/flexv3"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// The NFSv3 data servers stand where the cluster's registry does, and
// take clients' error reports on copies.
var (
	_ server.DataServers = (*flexv3.DataServers)(nil)
	_ server.CopyFailer  = (*flexv3.DataServers)(nil)
)

// startFlexV3 connects the NFSv3 data servers' store to the running
// server: stale marks kept in its metadata engine, layouts recalled
// through it, the store's metrics, and the healer of stale copies
// (every cfg.HealInterval, cluster.DefaultHealInterval if 0, and when a
// copy is marked stale; none if negative), stopped with the MDS.
func (m *MDS) startFlexV3(cfg MDSConfig, srv *server.Server) error {
	if m.FlexV3 == nil {
		return nil
	}
	st := m.FlexV3.Store()
	st.SetMaps(srv.Meta())
	st.SetRecall(srv.RecallLayouts)
	if cfg.Metrics != nil {
		for _, c := range st.Collectors() {
			if err := cfg.Metrics.Register(c); err != nil {
				return fmt.Errorf("metrics: %w", err)
			}
		}
	}
	if cfg.HealInterval < 0 {
		return nil
	}
	every := cfg.HealInterval
	if every == 0 {
		every = cluster.DefaultHealInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-m.stopping
		cancel()
	}()
	go st.RunHealer(ctx, every)
	return nil
}

// fenceFile is the admin fence-file command of an MDS with NFSv3 data
// servers (nil without): the file at a path gets a new owner on the data
// servers (flexv3.DataServers.FenceFile), then its layouts are recalled
// so that clients come back for layouts with the new ids.
func (m *MDS) fenceFile(paths policyStore) func(ctx context.Context, p string) (*cluster.FenceInfo, error) {
	if m.FlexV3 == nil {
		return nil
	}
	return func(ctx context.Context, p string) (*cluster.FenceInfo, error) {
		ino, clean, _, err := paths.resolve(ctx, p)
		if err != nil {
			return nil, err
		}
		a, err := paths.eng.GetAttr(ctx, ino)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", clean, err)
		}
		if a.Type != meta.TypeRegular {
			return nil, fmt.Errorf("%s: not a regular file", clean)
		}
		owner, err := m.FlexV3.FenceFile(ctx, uint64(ino))
		if err != nil {
			return nil, err
		}
		m.Server.RecallLayouts(uint64(ino))
		return &cluster.FenceInfo{Path: clean, Ino: uint64(ino), Owner: owner}, nil
	}
}
