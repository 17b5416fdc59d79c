package wiring

import (
	"context"
	"fmt"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/flexv3"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// The NFSv3 data servers stand where the cluster's registry does.
var _ server.DataServers = (*flexv3.DataServers)(nil)

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
