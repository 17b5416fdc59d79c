package wiring

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/meta"
)

// policyStore is the MDS's cluster.PolicyStore: replication and layout
// policies kept by the metadata engine on directories (meta.Engine.Policy),
// named by their path from the root of the namespace. A directory without
// a record of its own gets the cluster default (MDSConfig.Mirrors) and its
// export's layout type; records are copied to new files and directories
// when they are created, so a directory created below one with a policy
// has its own.
type policyStore struct {
	eng meta.Engine
	def int
}

var (
	_ cluster.PolicyStore       = policyStore{}
	_ cluster.LayoutPolicyStore = policyStore{}
)

// resolve walks p from the root; the last component must be a directory.
// It also returns the directories above it, the root first.
func (s policyStore) resolve(ctx context.Context, p string) (meta.Ino, string, []meta.Ino, error) {
	clean := path.Clean("/" + p)
	ino := meta.RootIno
	var above []meta.Ino
	for _, name := range strings.Split(strings.TrimPrefix(clean, "/"), "/") {
		if name == "" {
			continue
		}
		n, err := s.eng.Lookup(ctx, ino, name)
		if err != nil {
			return 0, clean, nil, fmt.Errorf("%s: %w", clean, err)
		}
		above = append(above, ino)
		ino = n.Ino
	}
	return ino, clean, above, nil
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
	if pol.Layout != meta.LayoutDefault {
		pi.Layout = pol.Layout.String()
	}
	for _, l := range []meta.Layout{meta.LayoutFiles, meta.LayoutFlexFiles} {
		if pol.LayoutsBelow.Has(l) {
			pi.LayoutsBelow = append(pi.LayoutsBelow, l.String())
		}
	}
	return pi, nil
}

func (s policyStore) PolicyOf(ctx context.Context, p string) (cluster.PolicyInfo, error) {
	ino, clean, _, err := s.resolve(ctx, p)
	if err != nil {
		return cluster.PolicyInfo{}, err
	}
	return s.info(ctx, ino, clean)
}

// update changes the policy of ino with fn (read, then written: the
// administration's commands are one operator's, not concurrent).
func (s policyStore) update(ctx context.Context, ino meta.Ino, fn func(*meta.Policy)) error {
	pol, err := s.eng.Policy(ctx, ino)
	if err != nil {
		return err
	}
	fn(&pol)
	return s.eng.SetPolicy(ctx, ino, pol)
}

func (s policyStore) SetPolicy(ctx context.Context, p string, mirrors int) (cluster.PolicyInfo, error) {
	ino, clean, _, err := s.resolve(ctx, p)
	if err != nil {
		return cluster.PolicyInfo{}, err
	}
	if err := s.update(ctx, ino, func(pol *meta.Policy) { pol.Mirrors = mirrors }); err != nil {
		return cluster.PolicyInfo{}, fmt.Errorf("%s: %w", clean, err)
	}
	return s.info(ctx, ino, clean)
}

// SetLayout sets the layout type of p's new files, and records it in the
// LayoutsBelow of every directory above p, so that fs_layout_types of an
// export's root (and of every directory on the way) names it.
func (s policyStore) SetLayout(ctx context.Context, p string, layout meta.Layout) (cluster.PolicyInfo, error) {
	ino, clean, above, err := s.resolve(ctx, p)
	if err != nil {
		return cluster.PolicyInfo{}, err
	}
	if layout != meta.LayoutDefault {
		// Above first: a client may meet the type below a directory as
		// soon as the directory's own policy names it.
		for _, d := range above {
			if err := s.update(ctx, d, func(pol *meta.Policy) { pol.LayoutsBelow = pol.LayoutsBelow.With(layout) }); err != nil {
				return cluster.PolicyInfo{}, fmt.Errorf("%s: a directory above it: %w", clean, err)
			}
		}
	}
	if err := s.update(ctx, ino, func(pol *meta.Policy) { pol.Layout = layout }); err != nil {
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
