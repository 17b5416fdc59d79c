package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// StripeMap says where a regular file's data lives on the data servers of
// a pNFS cluster: stripe unit k (the bytes [k*Unit, (k+1)*Unit)) belongs to
// position p = (First+k) mod len(DataServers), and is held by every member
// of that position (Members(p)), at the same offset of each member's
// object for the file (sparse packing).
//
// A position's members are DataServers[p] followed by Replicas[p]: with
// one copy per unit Replicas is nil, with mirrors copies every position
// lists mirrors-1 replicas, all distinct from each other and from
// DataServers[p]. Stale lists data servers whose copy of the file missed a
// change (a write, a truncate) while they could not be reached: they are
// never read from, written to or named in a layout until healing has
// brought their copy up to date (and removed them from Stale) or replaced
// them.
//
// The map is fixed when the file's data is first placed (PlaceStripeMap)
// and changes only by ReplaceStripeMap. Data servers are named by their
// persistent identity, never by a position in the cluster's current
// membership, so adding, losing or reordering data servers cannot move a
// byte of a file that already has a map.
type StripeMap struct {
	Unit  uint64 // stripe unit in bytes (> 0)
	First uint32 // position of stripe unit 0
	// DataServers are the first member of each position, in stripe
	// order. One data server may stand at several positions (a drain that
	// has no spare data server gives the drained one's positions to the
	// others, so that only its units move).
	DataServers []string
	// Replicas[p] are the other copies of position p's units; nil when
	// the file keeps one copy.
	Replicas [][]string
	// Stale are data servers whose copy missed a change; see above.
	Stale []string
	// Gen is 1 for the first placement and grows by one with every
	// ReplaceStripeMap; it is how a mover notices a concurrent change.
	Gen uint64
}

// FileStripeMap is one entry of StripeMaps.
type FileStripeMap struct {
	Ino Ino
	Map StripeMap
}

// MaxMirrors is the most copies a stripe unit can have.
const MaxMirrors = 3

// Mirrors returns the number of copies of each stripe unit.
func (m StripeMap) Mirrors() int {
	if len(m.Replicas) == 0 {
		return 1
	}
	return 1 + len(m.Replicas[0])
}

// Position returns the position holding file offset off.
func (m StripeMap) Position(off uint64) int {
	return int((off/m.Unit + uint64(m.First)) % uint64(len(m.DataServers)))
}

// Members returns the data servers holding position p's units, first
// member first. The slice is new.
func (m StripeMap) Members(p int) []string {
	out := make([]string, 0, m.Mirrors())
	out = append(out, m.DataServers[p])
	if len(m.Replicas) > 0 {
		out = append(out, m.Replicas[p]...)
	}
	return out
}

// Good returns position p's members that are not stale, first member
// first: the data servers whose copy of p's units is current.
func (m StripeMap) Good(p int) []string {
	out := m.Members(p)
	return slices.DeleteFunc(out, m.IsStale)
}

// IsGood reports whether id is a good member of position p: a member
// whose copy is not stale. Unlike Good it allocates nothing, for the data
// path.
func (m StripeMap) IsGood(p int, id string) bool {
	if m.DataServers[p] != id && (m.Replicas == nil || !slices.Contains(m.Replicas[p], id)) {
		return false
	}
	return !m.IsStale(id)
}

// IsStale reports whether id's copy of the file is stale.
func (m StripeMap) IsStale(id string) bool { return slices.Contains(m.Stale, id) }

// Holds reports whether the data server id holds stripe units of the file,
// as a first member or a replica, stale or not.
func (m StripeMap) Holds(id string) bool {
	if slices.Contains(m.DataServers, id) {
		return true
	}
	for _, r := range m.Replicas {
		if slices.Contains(r, id) {
			return true
		}
	}
	return false
}

// All returns every data server the map names, each once, in order of
// first appearance (first members, then replicas).
func (m StripeMap) All() []string {
	var out []string
	add := func(id string) {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	for _, id := range m.DataServers {
		add(id)
	}
	for _, r := range m.Replicas {
		for _, id := range r {
			add(id)
		}
	}
	return out
}

// Degraded reports whether some position has fewer good members than the
// map's mirror count.
func (m StripeMap) Degraded() bool { return len(m.Stale) > 0 }

// Clone returns a deep copy of m.
func (m StripeMap) Clone() StripeMap {
	m.DataServers = slices.Clone(m.DataServers)
	if m.Replicas != nil {
		r := make([][]string, len(m.Replicas))
		for i := range m.Replicas {
			r[i] = slices.Clone(m.Replicas[i])
		}
		m.Replicas = r
	}
	m.Stale = slices.Clone(m.Stale)
	return m
}

// Equal reports whether two maps place data identically and agree on
// which copies are stale (Gen aside).
func (m StripeMap) Equal(o StripeMap) bool {
	if m.Unit != o.Unit || m.First != o.First || !slices.Equal(m.DataServers, o.DataServers) ||
		m.Mirrors() != o.Mirrors() || len(m.Stale) != len(o.Stale) {
		return false
	}
	for i := range m.Replicas {
		if !slices.Equal(m.Replicas[i], o.Replicas[i]) {
			return false
		}
	}
	for _, id := range m.Stale {
		if !o.IsStale(id) {
			return false
		}
	}
	return true
}

// ErrConflict is returned by ReplaceStripeMap when the map changed since the
// caller read it.
var ErrConflict = errors.New("meta: changed concurrently")

// stripe-map records:
//
//	version 1: 'M' ino(8) -> 1 unit(8) first(4) gen(8) n(2) {len(1) id}*n
//	version 2: the same with version 2, then r(1) {len(1) id}*(n*r), then
//	           s(2) {len(1) id}*s: r replicas per position, s stale ids.
//
// Maps with one copy and nothing stale are written as version 1, so
// clusters that never use mirrors keep records older binaries read.
const pStripe = 'M'

const (
	stripeMapVersion   = 1
	stripeMapVersionV2 = 2
)

// maxStripeDataServers bounds a map's width; it also keeps every record
// well inside one KV value.
const maxStripeDataServers = 1024

func stripeKey(ino Ino) []byte { return be.AppendUint64([]byte{pStripe}, uint64(ino)) }

func validID(id string) bool { return id != "" && len(id) <= 255 }

func (m StripeMap) validate() error {
	if m.Unit == 0 || len(m.DataServers) == 0 || len(m.DataServers) > maxStripeDataServers ||
		int(m.First) >= len(m.DataServers) {
		return fmt.Errorf("stripe map unit %d first %d over %d data servers: %w", m.Unit, m.First, len(m.DataServers), ErrInval)
	}
	for _, id := range m.DataServers {
		if !validID(id) {
			return fmt.Errorf("stripe map data server %q: %w", id, ErrInval)
		}
	}
	if m.Replicas != nil {
		if len(m.Replicas) != len(m.DataServers) {
			return fmt.Errorf("stripe map has replicas for %d of %d positions: %w", len(m.Replicas), len(m.DataServers), ErrInval)
		}
		k := len(m.Replicas[0])
		if k < 1 || k >= MaxMirrors {
			return fmt.Errorf("stripe map with %d copies: %w", k+1, ErrInval)
		}
		for p, r := range m.Replicas {
			if len(r) != k {
				return fmt.Errorf("stripe map position %d has %d replicas, not %d: %w", p, len(r), k, ErrInval)
			}
			members := m.Members(p)
			for i, id := range members {
				if !validID(id) || slices.Contains(members[:i], id) {
					return fmt.Errorf("stripe map position %d members %q: %w", p, members, ErrInval)
				}
			}
		}
	}
	for i, id := range m.Stale {
		if !m.Holds(id) || slices.Contains(m.Stale[:i], id) {
			return fmt.Errorf("stripe map stale data server %q: %w", id, ErrInval)
		}
	}
	return nil
}

func appendID(b []byte, id string) []byte { return append(append(b, byte(len(id))), id...) }

func (m StripeMap) encode() []byte {
	v := byte(stripeMapVersion)
	if m.Replicas != nil || len(m.Stale) > 0 {
		v = stripeMapVersionV2
	}
	b := []byte{v}
	b = be.AppendUint64(b, m.Unit)
	b = be.AppendUint32(b, m.First)
	b = be.AppendUint64(b, m.Gen)
	b = be.AppendUint16(b, uint16(len(m.DataServers)))
	for _, id := range m.DataServers {
		b = appendID(b, id)
	}
	if v == stripeMapVersion {
		return b
	}
	b = append(b, byte(m.Mirrors()-1))
	for _, r := range m.Replicas {
		for _, id := range r {
			b = appendID(b, id)
		}
	}
	b = be.AppendUint16(b, uint16(len(m.Stale)))
	for _, id := range m.Stale {
		b = appendID(b, id)
	}
	return b
}

func decodeStripeMap(b []byte) (StripeMap, error) {
	bad := fmt.Errorf("meta: corrupt stripe map record (%d bytes)", len(b))
	if len(b) < 23 || (b[0] != stripeMapVersion && b[0] != stripeMapVersionV2) {
		return StripeMap{}, bad
	}
	version := b[0]
	m := StripeMap{Unit: be.Uint64(b[1:]), First: be.Uint32(b[9:]), Gen: be.Uint64(b[13:])}
	n := int(be.Uint16(b[21:]))
	b = b[23:]
	if n > maxStripeDataServers {
		return StripeMap{}, bad
	}
	ids := func(count int) ([]string, bool) {
		// Every id takes at least its length byte: a corrupt count
		// cannot make a short record allocate much.
		out := make([]string, 0, min(count, len(b)))
		for range count {
			if len(b) < 1 || len(b) < 1+int(b[0]) {
				return nil, false
			}
			out = append(out, string(b[1:1+int(b[0])]))
			b = b[1+int(b[0]):]
		}
		return out, true
	}
	var ok bool
	if m.DataServers, ok = ids(n); !ok {
		return StripeMap{}, bad
	}
	if version == stripeMapVersionV2 {
		if len(b) < 1 {
			return StripeMap{}, bad
		}
		r := int(b[0])
		b = b[1:]
		if r >= MaxMirrors {
			return StripeMap{}, bad
		}
		if r > 0 {
			m.Replicas = make([][]string, n)
			for p := range n {
				if m.Replicas[p], ok = ids(r); !ok {
					return StripeMap{}, bad
				}
			}
		}
		if len(b) < 2 {
			return StripeMap{}, bad
		}
		s := int(be.Uint16(b))
		b = b[2:]
		if s > 0 {
			if m.Stale, ok = ids(s); !ok {
				return StripeMap{}, bad
			}
		}
	}
	if len(b) != 0 {
		return StripeMap{}, bad
	}
	if err := m.validate(); err != nil {
		return StripeMap{}, fmt.Errorf("%w: %v", bad, err)
	}
	return m, nil
}

// stripeMap reads ino's map in x; ok is false if it has none.
func (x *tx) stripeMap(ino Ino) (StripeMap, bool, error) {
	v, err := x.t.Get(stripeKey(ino))
	if err != nil || v == nil {
		return StripeMap{}, false, err
	}
	m, err := decodeStripeMap(v)
	return m, err == nil, err
}

// regular checks that ino exists and is a regular file.
func (x *tx) regular(ino Ino) error {
	n, err := x.inode(ino)
	if err != nil {
		return err
	}
	if n.Type != TypeRegular {
		return fmt.Errorf("stripe map of %s inode %d: %w", n.Type, ino, ErrInval)
	}
	return nil
}

func (e *kvEngine) StripeMap(ctx context.Context, ino Ino) (StripeMap, error) {
	var m StripeMap
	err := e.view(ctx, func(x *tx) error {
		if err := x.regular(ino); err != nil {
			return err
		}
		var ok bool
		var err error
		m, ok, err = x.stripeMap(ino)
		if err == nil && !ok {
			err = fmt.Errorf("stripe map of inode %d: %w", ino, ErrNotFound)
		}
		return err
	})
	return m, err
}

func (e *kvEngine) PlaceStripeMap(ctx context.Context, ino Ino, m StripeMap) (StripeMap, error) {
	if err := m.validate(); err != nil {
		return StripeMap{}, err
	}
	m.Gen = 1
	m = m.Clone()
	var out StripeMap
	err := e.update(ctx, func(x *tx) error {
		if err := x.regular(ino); err != nil {
			return err
		}
		cur, ok, err := x.stripeMap(ino)
		if err != nil {
			return err
		}
		if ok {
			out = cur
			return nil
		}
		out = m
		return x.t.Put(stripeKey(ino), m.encode())
	})
	return out, err
}

func (e *kvEngine) ReplaceStripeMap(ctx context.Context, ino Ino, gen uint64, m StripeMap) (StripeMap, error) {
	if err := m.validate(); err != nil {
		return StripeMap{}, err
	}
	m.Gen = gen + 1
	m = m.Clone()
	err := e.update(ctx, func(x *tx) error {
		if err := x.regular(ino); err != nil {
			return err
		}
		cur, ok, err := x.stripeMap(ino)
		if err != nil {
			return err
		}
		if !ok || cur.Gen != gen {
			return fmt.Errorf("stripe map of inode %d is not at generation %d: %w", ino, gen, ErrConflict)
		}
		return x.t.Put(stripeKey(ino), m.encode())
	})
	if err != nil {
		return StripeMap{}, err
	}
	return m, nil
}

// stripeMapPage bounds the keys one StripeMaps transaction reads.
const stripeMapPage = 1024

func (e *kvEngine) StripeMaps(ctx context.Context, after Ino, max int) ([]FileStripeMap, error) {
	if max <= 0 {
		return nil, fmt.Errorf("stripe maps: max %d: %w", max, ErrInval)
	}
	max = min(max, stripeMapPage)
	var out []FileStripeMap
	err := e.view(ctx, func(x *tx) error {
		out = out[:0]
		var derr error
		err := x.t.Scan([]byte{pStripe}, stripeKey(after+1), func(k, v []byte) bool {
			if len(k) != 9 {
				return true
			}
			m, err := decodeStripeMap(v)
			if err != nil {
				derr = err
				return false
			}
			out = append(out, FileStripeMap{Ino: Ino(be.Uint64(k[1:])), Map: m})
			return len(out) < max
		})
		if err != nil {
			return err
		}
		return derr
	})
	return out, err
}
