package server

import (
	"context"
	"slices"
	"sync"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
)

// Per-directory layout types. An export hands out one layout type
// (Export.Layout), but a directory may set another for the files created
// below it (meta.Policy.Layout, `shoal admin policy --layout`): the
// policy record is copied to every new file and subdirectory, so a file
// carries the type of its creation for good, and LAYOUTGET, LAYOUTRETURN,
// LAYOUTERROR, the mdsthreshold attribute and CB_LAYOUTRECALL use the
// file's own type, not its export's. A file with no layout in its record
// (created where none was set) follows its export's.
//
// fs_layout_types of an object lists the layout types a client may meet
// at or below it: its own type first (a directory's: the type its new
// files get), then its export's, then the types set on directories below
// it (meta.Policy.LayoutsBelow, which the administration records on every
// directory above one it sets a type on). A client that picks a layout
// driver per mount from fs_layout_types (Linux, Shoal's client) therefore
// picks by the directory it mounts: Shoal's client takes the first type
// it has a driver for, so a mount of a flexfiles directory in a files
// export uses flexfiles; Linux prefers FLEX_FILES whenever it is listed,
// so a Linux mount of an export root with a flexfiles directory below it
// asks for flexfiles layouts everywhere, and gets them for the files of
// that type only.
//
// A LAYOUTGET of a type the file does not use is NFS4ERR_LAYOUTUNAVAILABLE
// when the type is one the export offers (RFC 8881 §18.43.3: layouts
// "not supported for the requested file"; the client does that file's
// I/O through the MDS, as Linux does when it gets it); it is
// NFS4ERR_UNKNOWN_LAYOUTTYPE when the export offers no such type.

// maxLayoutCache bounds fileLayouts.m.
const maxLayoutCache = 1 << 16

// fileLayouts caches the layout type recorded on regular files (their
// policy record, copied from the directory when the file was created and
// never changed after: inode numbers are never reused either).
type fileLayouts struct {
	mu sync.Mutex
	m  map[meta.Ino]meta.Layout
}

// recorded returns the layout type recorded on regular file ino.
func (s *Server) recordedLayout(ctx context.Context, ino meta.Ino) (meta.Layout, error) {
	fl := &s.fileLayouts
	fl.mu.Lock()
	l, ok := fl.m[ino]
	fl.mu.Unlock()
	if ok {
		return l, nil
	}
	p, err := s.meta.Policy(ctx, ino)
	if err != nil {
		return meta.LayoutDefault, err
	}
	fl.mu.Lock()
	if fl.m == nil || len(fl.m) >= maxLayoutCache {
		fl.m = map[meta.Ino]meta.Layout{}
	}
	fl.m[ino] = p.Layout
	fl.mu.Unlock()
	return p.Layout, nil
}

// nfsLayoutType is the protocol's name of l, or def for LayoutDefault.
func nfsLayoutType(l meta.Layout, def nfs4.Layouttype4) nfs4.Layouttype4 {
	switch l {
	case meta.LayoutFiles:
		return nfs4.LAYOUT4_NFSV4_1_FILES
	case meta.LayoutFlexFiles:
		return nfs4.LAYOUT4_FLEX_FILES
	}
	return def
}

// layoutTypeOfFile is the layout type of regular file ino of export e:
// the one recorded on it, else the export's.
func (s *Server) layoutTypeOfFile(ctx context.Context, e *Export, ino meta.Ino) (nfs4.Layouttype4, error) {
	l, err := s.recordedLayout(ctx, ino)
	return nfsLayoutType(l, layoutTypeOf(e)), err
}

// fileLayoutType is layoutTypeOfFile for object o. A failure to read the
// policy leaves the export's type, and is logged.
func (c *compound) fileLayoutType(o *object) nfs4.Layouttype4 {
	if o.export == nil || o.attr.Type != meta.TypeRegular {
		return layoutTypeOf(o.export)
	}
	t, err := c.s.layoutTypeOfFile(c.ctx, o.export, o.fh.ino)
	if err != nil {
		c.log.Warn("the layout type of a file is unknown: using its export's", "ino", o.fh.ino, "err", err)
	}
	return t
}

// layoutTypesOf is fs_layout_types of object o: its own type first, then
// its export's, then those set below it.
func (c *compound) layoutTypesOf(o *object) []nfs4.Layouttype4 {
	if c.s.pnfs == nil {
		return nil
	}
	def := layoutTypeOf(o.export)
	if o.export == nil {
		return []nfs4.Layouttype4{def}
	}
	p, err := c.s.meta.Policy(c.ctx, o.fh.ino)
	if err != nil {
		c.log.Warn("the layout policy of an object is unknown: listing its export's type", "ino", o.fh.ino, "err", err)
		return []nfs4.Layouttype4{def}
	}
	types := []nfs4.Layouttype4{nfsLayoutType(p.Layout, def), def}
	for _, l := range []meta.Layout{meta.LayoutFiles, meta.LayoutFlexFiles} {
		if p.LayoutsBelow.Has(l) {
			types = append(types, nfsLayoutType(l, def))
		}
	}
	return dedupe(types)
}

// dedupe drops later repeats of a type, keeping the order.
func dedupe(ts []nfs4.Layouttype4) []nfs4.Layouttype4 {
	out := ts[:0:0]
	for _, t := range ts {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// exportOffers reports whether export e's root lists layout type t in
// fs_layout_types: its own type, or one set on a directory of it.
func (c *compound) exportOffers(e *Export, t nfs4.Layouttype4) bool {
	if t == layoutTypeOf(e) {
		return true
	}
	if e == nil {
		return false
	}
	p, err := c.s.meta.Policy(c.ctx, e.root)
	if err != nil {
		return false
	}
	return nfsLayoutType(p.Layout, 0) == t || p.LayoutsBelow.Has(metaLayout(t))
}

// metaLayout is meta's name of the protocol's layout type t.
func metaLayout(t nfs4.Layouttype4) meta.Layout {
	switch t {
	case nfs4.LAYOUT4_NFSV4_1_FILES:
		return meta.LayoutFiles
	case nfs4.LAYOUT4_FLEX_FILES:
		return meta.LayoutFlexFiles
	}
	return meta.LayoutDefault
}

// noteGranted records that a layout of type t was handed out: GETDEVICEINFO
// and a whole-client LAYOUTRETURN of that type are then served
// (servesLayoutType), though no export's own type is t.
func (p *pnfsState) noteGranted(t nfs4.Layouttype4) {
	if l := metaLayout(t); l != meta.LayoutDefault {
		p.granted.Or(1 << l)
	}
}

// grantedType reports whether a layout of type t was handed out since the
// server started.
func (p *pnfsState) grantedType(t nfs4.Layouttype4) bool {
	l := metaLayout(t)
	return l != meta.LayoutDefault && p.granted.Load()&(1<<l) != 0
}
