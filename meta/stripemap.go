package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// StripeMap says where a regular file's data lives on the data servers of
// a pNFS cluster: stripe unit k (the bytes [k*Unit, (k+1)*Unit)) is held by
// DataServers[(First+k) mod len(DataServers)], at the same offset of that
// data server's object for the file (sparse packing).
//
// The map is fixed when the file's data is first placed (PlaceStripeMap)
// and changes only by ReplaceStripeMap, after the data has been copied to
// the new data servers. Data servers are named by their persistent
// identity, never by a position in the cluster's current membership, so
// adding, losing or reordering data servers cannot move a byte of a file
// that already has a map.
type StripeMap struct {
	Unit  uint64 // stripe unit in bytes (> 0)
	First uint32 // index into DataServers of stripe unit 0
	// DataServers are the data-server identities in stripe order. One may
	// stand at several positions (a drain that has no spare data server
	// gives the drained one's positions to the others, so that only its
	// units move).
	DataServers []string
	// Gen is 1 for the first placement and grows by one with every
	// ReplaceStripeMap; it is how a mover notices a concurrent move.
	Gen uint64
}

// FileStripeMap is one entry of StripeMaps.
type FileStripeMap struct {
	Ino Ino
	Map StripeMap
}

// Holds reports whether the data server id holds stripe units of the file.
func (m StripeMap) Holds(id string) bool { return slices.Contains(m.DataServers, id) }

// Equal reports whether two maps place data identically (Gen aside).
func (m StripeMap) Equal(o StripeMap) bool {
	return m.Unit == o.Unit && m.First == o.First && slices.Equal(m.DataServers, o.DataServers)
}

// ErrConflict is returned by ReplaceStripeMap when the map changed since the
// caller read it.
var ErrConflict = errors.New("meta: changed concurrently")

// stripe-map records: 'M' ino(8) -> ver(1) unit(8) first(4) gen(8) n(2) {len(1) id}*
const pStripe = 'M'

const stripeMapVersion = 1

// maxStripeDataServers bounds a map's width; it also keeps every record
// well inside one KV value.
const maxStripeDataServers = 1024

func stripeKey(ino Ino) []byte { return be.AppendUint64([]byte{pStripe}, uint64(ino)) }

func (m StripeMap) validate() error {
	if m.Unit == 0 || len(m.DataServers) == 0 || len(m.DataServers) > maxStripeDataServers ||
		int(m.First) >= len(m.DataServers) {
		return fmt.Errorf("stripe map unit %d first %d over %d data servers: %w", m.Unit, m.First, len(m.DataServers), ErrInval)
	}
	for _, id := range m.DataServers {
		if id == "" || len(id) > 255 {
			return fmt.Errorf("stripe map data server %q: %w", id, ErrInval)
		}
	}
	return nil
}

func (m StripeMap) encode() []byte {
	b := []byte{stripeMapVersion}
	b = be.AppendUint64(b, m.Unit)
	b = be.AppendUint32(b, m.First)
	b = be.AppendUint64(b, m.Gen)
	b = be.AppendUint16(b, uint16(len(m.DataServers)))
	for _, id := range m.DataServers {
		b = append(b, byte(len(id)))
		b = append(b, id...)
	}
	return b
}

func decodeStripeMap(b []byte) (StripeMap, error) {
	bad := fmt.Errorf("meta: corrupt stripe map record (%d bytes)", len(b))
	if len(b) < 23 || b[0] != stripeMapVersion {
		return StripeMap{}, bad
	}
	m := StripeMap{Unit: be.Uint64(b[1:]), First: be.Uint32(b[9:]), Gen: be.Uint64(b[13:])}
	n := int(be.Uint16(b[21:]))
	b = b[23:]
	m.DataServers = make([]string, 0, n)
	for range n {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return StripeMap{}, bad
		}
		m.DataServers = append(m.DataServers, string(b[1:1+int(b[0])]))
		b = b[1+int(b[0]):]
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
	m.DataServers = slices.Clone(m.DataServers)
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
	m.DataServers = slices.Clone(m.DataServers)
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
