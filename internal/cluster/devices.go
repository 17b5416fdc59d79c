package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
)

// Files-layout devices. A layout names a device, and the device lists the
// data servers of stripe indexes 0..n-1 (RFC 8881 §13.3). Shoal's device
// for a file lists, per position of its stripe map, the copy the file's
// layout sends clients to (Striped.Layout), so files with the same list
// share a device. A device id is
//
//	[0:8]   FNV-64a of the ordered data-server ids
//	[8:12]  a random number drawn when the MDS starts
//	[12:16] the registry generation when the id was made
//
// so an id from an earlier MDS boot, or from before a data server joined,
// left or moved, is unknown (GETDEVICEINFO answers NFS4ERR_NOENT and the
// client asks for a new layout), and addresses a client caches are never
// those of another membership.
type devices struct {
	r    *Registry
	boot uint32

	mu    sync.Mutex
	lists map[uint64][]string // hash -> ordered ids
}

func newDevices(r *Registry) *devices {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &devices{r: r, boot: binary.BigEndian.Uint32(b[:]), lists: map[uint64][]string{}}
}

func hashIDs(ids []string) uint64 {
	h := fnv.New64a()
	for _, id := range ids {
		h.Write([]byte(id))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// id returns the device id of the ordered data-server list ids.
func (d *devices) id(ids []string) [16]byte {
	h := hashIDs(ids)
	d.mu.Lock()
	if _, ok := d.lists[h]; !ok {
		d.lists[h] = slices.Clone(ids)
	}
	d.mu.Unlock()
	var out [16]byte
	binary.BigEndian.PutUint64(out[:8], h)
	binary.BigEndian.PutUint32(out[8:12], d.boot)
	binary.BigEndian.PutUint32(out[12:], uint32(d.r.Generation()))
	return out
}

// addrs returns the addresses of device id's data servers, by stripe
// index; ok is false for an id that is not current.
func (d *devices) addrs(id [16]byte) ([][]string, bool) {
	if binary.BigEndian.Uint32(id[8:12]) != d.boot || binary.BigEndian.Uint32(id[12:]) != uint32(d.r.Generation()) {
		return nil, false
	}
	d.mu.Lock()
	ids, ok := d.lists[binary.BigEndian.Uint64(id[:8])]
	d.mu.Unlock()
	if !ok {
		return nil, false
	}
	out := make([][]string, len(ids))
	for i, dsID := range ids {
		ds, known := d.r.DataServer(dsID)
		if !known || len(ds.Addrs) == 0 {
			return nil, false
		}
		out[i] = ds.Addrs
	}
	return out, true
}

// all returns the ids of every device handed out, current generation.
func (d *devices) all() [][16]byte {
	d.mu.Lock()
	lists := make([][]string, 0, len(d.lists))
	for _, ids := range d.lists {
		lists = append(lists, ids)
	}
	d.mu.Unlock()
	out := make([][16]byte, 0, len(lists))
	for _, ids := range lists {
		out = append(out, d.id(ids))
	}
	return out
}

// Layout returns file ino's files layout, placing its data first if it has
// no stripe map. Each stripe index of the layout's device is the first
// good copy of its position that is in service (members in map order);
// stale copies are never named. If a position has no good copy in service
// the file gets no layout (an error wrapping pnfs.ErrUnavailable, or
// pnfs.ErrDataServerDown): clients then do their I/O through the MDS, which
// serves the stripes that are reachable and fails the others clearly.
func (s *Striped) Layout(ctx context.Context, ino uint64) (pnfs.FileLayout, error) {
	m, err := s.Place(ctx, ino)
	if err != nil {
		return pnfs.FileLayout{}, err
	}
	ids, err := s.layoutIDs(ino, m)
	if err != nil {
		return pnfs.FileLayout{}, err
	}
	return pnfs.FileLayout{Device: s.devices.id(ids), First: m.First, Unit: m.Unit, Count: uint32(len(ids))}, nil
}

// layoutIDs returns the data server of each stripe index of m's layout:
// position p's first good member in service.
func (s *Striped) layoutIDs(ino uint64, m meta.StripeMap) ([]string, error) {
	ids := make([]string, len(m.DataServers))
	for p := range m.DataServers {
		good := m.Good(p)
		for _, id := range good {
			if s.r.inService(id) {
				ids[p] = id
				break
			}
		}
		if ids[p] != "" {
			continue
		}
		if len(good) == 0 {
			return nil, noCopy(ino, m)
		}
		var errs []error
		for _, id := range good {
			if _, err := s.r.conn(id); err != nil {
				errs = append(errs, err)
			} else {
				// Registered again since DataServer said otherwise.
				errs = append(errs, fmt.Errorf("data server %s: %w", id, pnfs.ErrUnavailable))
			}
		}
		return nil, fmt.Errorf("cluster: layout of ino %d: %w", ino, errors.Join(errs...))
	}
	return ids, nil
}

// Device returns the addresses of device id's data servers by stripe
// index (GETDEVICEINFO); ok is false for an unknown or outdated id.
func (s *Striped) Device(id [16]byte) ([][]string, bool) { return s.devices.addrs(id) }

// Devices returns the current ids of every device handed out
// (GETDEVICELIST).
func (s *Striped) Devices() [][16]byte { return s.devices.all() }

// Shares attributes the range [off, off+length) of file ino, laid out on
// device id, to the device's data servers: each that holds part of it,
// with the bytes of the range on it. A length of all ones runs to the end
// of the file; a range of the device's stripe count of units or more
// gives every data server of the device an equal share (1 each). It is
// how the MDS attributes what clients report about a device (LAYOUTERROR,
// LAYOUTSTATS) to data servers. ok is false for a device id this MDS did
// not hand out; an id outdated by a membership change still resolves.
func (s *Striped) Shares(ctx context.Context, ino uint64, id [16]byte, off, length uint64) (map[string]uint64, bool) {
	ids, ok := s.devices.members(id)
	if !ok {
		return nil, false
	}
	n := uint64(len(ids))
	out := make(map[string]uint64, len(ids))
	m, placed, err := s.Map(ctx, ino)
	if err != nil || !placed || m.Unit == 0 || length == ^uint64(0) || length/m.Unit >= n || off+length < off {
		for _, ds := range ids {
			out[ds]++
		}
		return out, true
	}
	if length == 0 {
		length = 1
	}
	for pos, end := off, off+length; pos < end; {
		k := pos / m.Unit
		w := min(end, (k+1)*m.Unit) - pos
		out[ids[(k+uint64(m.First))%n]] += w
		pos += w
	}
	return out, true
}

// members returns the data servers of device id by stripe index, whatever
// the registry generation it was made in.
func (d *devices) members(id [16]byte) ([]string, bool) {
	if binary.BigEndian.Uint32(id[8:12]) != d.boot {
		return nil, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ids, ok := d.lists[binary.BigEndian.Uint64(id[:8])]
	return ids, ok && len(ids) > 0
}
