package server

import (
	"fmt"
	"net/netip"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// Export is one exported subtree of Shoal's namespace.
type Export struct {
	// ID identifies the export inside filehandles. It must stay the same
	// across restarts for handles to stay valid; by default it is the
	// export's position in the configuration, starting at 1.
	ID uint16 `yaml:"id"`
	// Path is the exported directory within Shoal's namespace, and also where
	// it appears in the NFSv4 pseudo-root.
	Path     string `yaml:"path"`
	ReadOnly bool   `yaml:"ro"`
	// Clients lists the networks allowed to use the export; empty allows all.
	Clients []string `yaml:"clients"`
	// WriteClients lists networks (or addresses) that may change a
	// ReadOnly export all the same: the host that builds the images of a
	// root file system shared by diskless nodes writes the very tree the
	// nodes mount read-only (docs/diskless.md). Exports cannot nest and a
	// path is exported once, so this is how one tree is read-write for
	// one host and read-only for the rest. Clients still applies.
	WriteClients []string `yaml:"rw_clients"`
	RootSquash   *bool    `yaml:"root_squash"` // nil means true
	AllSquash    bool     `yaml:"all_squash"`
	AnonUID      *uint32  `yaml:"anonuid"` // nil means 65534
	AnonGID      *uint32  `yaml:"anongid"` // nil means 65534
	// Sync says whether changes through the export are answered only
	// once durable (true) or once written to the metadata log (false,
	// knfsd's async); nil follows the server (Config.Async). See
	// durability.go.
	Sync *bool `yaml:"sync"`
	// Layout is the pNFS layout type the export hands out on a metadata
	// server with data servers: "files" (the default, RFC 8881 §13: the
	// data servers copy replicated stripes) or "flexfiles" (RFC 8435:
	// the client writes every copy itself). A directory may set another
	// for the files created below it (layoutpolicy.go); otherwise
	// fs_layout_types lists only this one type: the Linux client prefers
	// FLEX_FILES over FILES when both are listed, so offering both would
	// not let a client choose.
	Layout string `yaml:"layout"`
	// FlexStripe says whether a flexfiles layout stripes each mirror over
	// the file's stripe map ("on"), names one data server per mirror
	// ("off"; files placed by such a layout get a stripe map one data
	// server wide, and a wider file gets no layout and is read and
	// written through the MDS), or decides per client ("auto", the
	// default): Linux before 6.18 refuses more than one data server per
	// mirror, so only clients whose EXCHANGE_ID implementation id says
	// Linux 6.18 or later, or Shoal, get striped layouts.
	FlexStripe string `yaml:"flex_stripe"`
	// FlexNoIOThruMDS sets FF_FLAGS_NO_IO_THRU_MDS in the export's
	// flexfiles layouts (RFC 8435 §5.1). Without it, Linux resends a
	// write that failed on a data server through the MDS, whose own
	// write marks the missed copy stale, and the client's error report
	// comes later in LAYOUTRETURN. With it, the client reports the
	// failure first (LAYOUTERROR with NFSv4.2, LAYOUTRETURN with 4.1),
	// which marks the copy stale, and resends through a new layout that
	// leaves the copy out: the MDS carries no file data when a data
	// server fails. A client that gets no layout at all still does its
	// I/O through the MDS.
	FlexNoIOThruMDS bool `yaml:"flex_no_io_thru_mds"`
	// FlexRecallDelay is how long the MDS waits, after a data server
	// leaves service, before it recalls the export's flexfiles layouts
	// (0, the default: at once, as for the files layout, whose devices
	// change). A flexfiles device is one data server and does not
	// change; the recall only spares clients the wait for their own
	// timeouts on a data server that hangs. A client writing to one that
	// died has its connection refused at once and reports which copy its
	// write missed, unless the recall came first: Linux then resends
	// its I/O under the new layout and may report nothing (seen with
	// 6.1 and NFSv4.1). A few seconds lets the clients' reports arrive.
	FlexRecallDelay time.Duration `yaml:"flex_recall_delay"`

	nets  []netip.Prefix
	wnets []netip.Prefix // WriteClients
	root  meta.Ino
	// async is the resolved Sync.
	async bool
}

func (e *Export) rootSquash() bool { return e.RootSquash == nil || *e.RootSquash }

func (e *Export) anon() (uint32, uint32) {
	uid, gid := uint32(65534), uint32(65534)
	if e.AnonUID != nil {
		uid = *e.AnonUID
	}
	if e.AnonGID != nil {
		gid = *e.AnonGID
	}
	return uid, gid
}

// allows reports whether a client at addr may use the export.
func (e *Export) allows(addr netip.Addr) bool {
	return len(e.nets) == 0 || contains(e.nets, addr)
}

// readOnlyFor reports whether the export is read-only for a client at
// addr: ReadOnly, unless addr is one of WriteClients.
func (e *Export) readOnlyFor(addr netip.Addr) bool {
	return e.ReadOnly && !contains(e.wnets, addr)
}

func contains(nets []netip.Prefix, addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, n := range nets {
		if n.Contains(addr) {
			return true
		}
	}
	return false
}

// parseNets parses a list of networks (10.0.0.0/8) and single addresses.
func parseNets(export, field string, list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range list {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return nil, fmt.Errorf("export %q: bad %s network %q: %w", export, field, c, err)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, pfx.Masked())
	}
	return out, nil
}

// squash applies root and all squashing to an AUTH_SYS identity.
func (e *Export) squash(c cred) cred {
	auid, agid := e.anon()
	if e.AllSquash || (e.rootSquash() && c.uid == 0) {
		c.uid, c.gid, c.gids = auid, agid, nil
	} else if e.rootSquash() && c.gid == 0 {
		c.gid = agid
	}
	return c
}

// cred is the caller's identity after squashing.
type cred struct {
	uid, gid uint32
	gids     []uint32
}

func (c cred) inGroup(g uint32) bool {
	if c.gid == g {
		return true
	}
	for _, x := range c.gids {
		if x == g {
			return true
		}
	}
	return false
}

// pseudoNode is a directory of the NFSv4 pseudo-root: a path prefix of one
// or more exports that is not itself exported.
type pseudoNode struct {
	index    uint16
	path     string
	parent   uint16
	children map[string]child
}

type child struct {
	pseudo uint16  // index of a pseudo node, when export is nil
	export *Export // the export rooted here
}

// namespace is the pseudo-root over the exports.
type namespace struct {
	exports []*Export
	byID    map[uint16]*Export
	nodes   []*pseudoNode // index 0 is the pseudo-root, unless rootExport is set
	// rootExport is the export of "/", which then is the pseudo-root itself.
	rootExport *Export
}

func cleanExportPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("export path %q must be absolute", p)
	}
	return path.Clean(p), nil
}

// newNamespace validates exports and builds the pseudo-root over them.
func newNamespace(exports []*Export) (*namespace, error) {
	if len(exports) == 0 {
		return nil, fmt.Errorf("no exports configured")
	}
	ns := &namespace{byID: map[uint16]*Export{}}
	seen := map[string]bool{}
	for i, e := range exports {
		p, err := cleanExportPath(e.Path)
		if err != nil {
			return nil, err
		}
		e.Path = p
		if seen[p] {
			return nil, fmt.Errorf("export %q listed twice", p)
		}
		seen[p] = true
		if e.ID == 0 {
			e.ID = uint16(i + 1)
		}
		if err := e.checkLayout(); err != nil {
			return nil, fmt.Errorf("export %q: %w", p, err)
		}
		if _, dup := ns.byID[e.ID]; dup {
			return nil, fmt.Errorf("export id %d used twice", e.ID)
		}
		ns.byID[e.ID] = e
		if e.nets, err = parseNets(p, "client", e.Clients); err != nil {
			return nil, err
		}
		if e.wnets, err = parseNets(p, "rw_clients", e.WriteClients); err != nil {
			return nil, err
		}
		if len(e.WriteClients) > 0 && !e.ReadOnly {
			return nil, fmt.Errorf("export %q: rw_clients is for a read-only export (ro: true); this one is read-write for every client", p)
		}
		ns.exports = append(ns.exports, e)
	}
	sort.Slice(ns.exports, func(i, j int) bool { return ns.exports[i].Path < ns.exports[j].Path })
	for _, e := range ns.exports {
		if e.Path == "/" {
			if len(ns.exports) > 1 {
				return nil, fmt.Errorf("exporting / together with other exports would nest them; export only / or only subtrees")
			}
			ns.rootExport = e
			return ns, nil
		}
	}
	ns.nodes = []*pseudoNode{{index: 0, path: "/", children: map[string]child{}}}
	for _, e := range ns.exports {
		parts := strings.Split(strings.TrimPrefix(e.Path, "/"), "/")
		cur := ns.nodes[0]
		for i, name := range parts {
			last := i == len(parts)-1
			ch, ok := cur.children[name]
			if ok && ch.export != nil {
				return nil, fmt.Errorf("export %q is nested inside export %q", e.Path, ch.export.Path)
			}
			if last {
				if ok {
					return nil, fmt.Errorf("export %q contains other exports", e.Path)
				}
				cur.children[name] = child{export: e}
				break
			}
			if !ok {
				n := &pseudoNode{index: uint16(len(ns.nodes)), path: path.Join(cur.path, name), parent: cur.index, children: map[string]child{}}
				ns.nodes = append(ns.nodes, n)
				cur.children[name] = child{pseudo: n.index}
				ch = cur.children[name]
			}
			cur = ns.nodes[ch.pseudo]
		}
	}
	return ns, nil
}

// Export.Layout values.
const (
	LayoutFiles     = "files"
	LayoutFlexFiles = "flexfiles"
)

// Export.FlexStripe values.
const (
	FlexStripeAuto = "auto"
	FlexStripeOn   = "on"
	FlexStripeOff  = "off"
)

func (e *Export) checkLayout() error {
	switch e.Layout {
	case "", LayoutFiles, LayoutFlexFiles:
	default:
		return fmt.Errorf("layout %q: want %s or %s", e.Layout, LayoutFiles, LayoutFlexFiles)
	}
	switch e.FlexStripe {
	case "", FlexStripeAuto, FlexStripeOn, FlexStripeOff:
	default:
		return fmt.Errorf("flex_stripe %q: want %s, %s or %s", e.FlexStripe, FlexStripeAuto, FlexStripeOn, FlexStripeOff)
	}
	if e.FlexRecallDelay < 0 {
		return fmt.Errorf("flex_recall_delay %v: want 0 or more", e.FlexRecallDelay)
	}
	return nil
}

// flex reports whether the export hands out flexfiles layouts. A nil
// export (the pseudo-root) hands out files layouts, as before there was
// a choice.
func (e *Export) flex() bool { return e != nil && e.Layout == LayoutFlexFiles }
