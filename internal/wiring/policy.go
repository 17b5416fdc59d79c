package wiring

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/meta"
)

// policyStore is the MDS's cluster.PolicyStore: replication policies kept
// by the metadata engine on directories (meta.Engine.Policy), named by
// their path from the root of the namespace. A directory without a record
// of its own gets the cluster default (MDSConfig.Mirrors); records are
// copied to new files and directories when they are created, so a
// directory created below one with a policy has its own.
type policyStore struct {
	eng meta.Engine
	def int
}

var _ cluster.PolicyStore = policyStore{}

// resolve walks p from the root; the last component must be a directory.
func (s policyStore) resolve(ctx context.Context, p string) (meta.Ino, string, error) {
	clean := path.Clean("/" + p)
	ino := meta.RootIno
	for _, name := range strings.Split(strings.TrimPrefix(clean, "/"), "/") {
		if name == "" {
			continue
		}
		n, err := s.eng.Lookup(ctx, ino, name)
		if err != nil {
			return 0, clean, fmt.Errorf("%s: %w", clean, err)
		}
		ino = n.Ino
	}
	return ino, clean, nil
}

func (s policyStore) info(ctx context.Context, ino meta.Ino, p string) (cluster.PolicyInfo, error) {
	pol, err := s.eng.Policy(ctx, ino)
	if err != nil {
		return cluster.PolicyInfo{}, fmt.Errorf("%s: %w", p, err)
	}
	pi := cluster.PolicyInfo{Path: p, Mirrors: pol.Mirrors, Default: s.def}
	if pol.Mirrors == 0 {
		pi.Mirrors, pi.Inherited = s.def, true
	}
	return pi, nil
}

func (s policyStore) PolicyOf(ctx context.Context, p string) (cluster.PolicyInfo, error) {
	ino, clean, err := s.resolve(ctx, p)
	if err != nil {
		return cluster.PolicyInfo{}, err
	}
	return s.info(ctx, ino, clean)
}

func (s policyStore) SetPolicy(ctx context.Context, p string, mirrors int) (cluster.PolicyInfo, error) {
	ino, clean, err := s.resolve(ctx, p)
	if err != nil {
		return cluster.PolicyInfo{}, err
	}
	if err := s.eng.SetPolicy(ctx, ino, meta.Policy{Mirrors: mirrors}); err != nil {
		return cluster.PolicyInfo{}, fmt.Errorf("%s: %w", clean, err)
	}
	return s.info(ctx, ino, clean)
}

// mirrorsOf is the file's own policy (copied from its directory when it
// was created), for cluster.Striped placement; 0 means the default.
func (s policyStore) mirrorsOf(ctx context.Context, ino uint64) int {
	pol, err := s.eng.Policy(ctx, meta.Ino(ino))
	if err != nil {
		return 0
	}
	return pol.Mirrors
}
