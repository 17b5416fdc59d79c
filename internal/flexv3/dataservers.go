package flexv3

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/pnfs"
)

// DataServers is what the MDS (server.DataServers with the
// server.LooseFlexLayouter capability) sees of the NFSv3 data servers:
// flexfiles layouts and devices from the Store, and fencing by owner
// change of every file whose layout a revoked client was given.
type DataServers struct {
	st   *Store
	unit uint64

	mu   sync.Mutex
	held map[uint64]map[uint64]bool // MDS client id -> files it was given layouts of
}

// maxHeld bounds the files remembered per client: a client past it has
// its oldest remembered files forgotten in one go (and so not fenced).
const maxHeld = 1 << 16

// NewDataServers serves layouts from st; unit is the stripe unit the MDS
// reports (layout_blksize).
func NewDataServers(st *Store, unit uint64) *DataServers {
	if unit == 0 {
		unit = 1 << 20
	}
	return &DataServers{st: st, unit: unit, held: map[uint64]map[uint64]bool{}}
}

// Store is the store the layouts come from (the MDS's store.Backend).
func (d *DataServers) Store() *Store { return d.st }

// Layout refuses the files layout: NFSv3 servers serve flexfiles only.
func (d *DataServers) Layout(ctx context.Context, ino uint64) (pnfs.FileLayout, error) {
	return pnfs.FileLayout{}, fmt.Errorf("%w: NFSv3 data servers serve flexfiles layouts only", pnfs.ErrUnavailable)
}

// Device returns a device's advertised address.
func (d *DataServers) Device(id [16]byte) ([][]string, bool) {
	i, ok := deviceIndex(id, len(d.st.servers))
	if !ok {
		return nil, false
	}
	return [][]string{{d.st.servers[i].cfg.Advertise}}, true
}

// Devices returns every data server's device.
func (d *DataServers) Devices() [][16]byte { return d.st.Devices() }

// StripeUnit is the unit the MDS reports.
func (d *DataServers) StripeUnit() uint64 { return d.unit }

// Fence fences every file MDS client clientID was given a layout of
// (Store.Fence): called when the client's layouts are revoked.
func (d *DataServers) Fence(ctx context.Context, clientID uint64) error {
	d.mu.Lock()
	files := d.held[clientID]
	delete(d.held, clientID)
	d.mu.Unlock()
	var errs []error
	for ino := range files {
		if _, err := d.st.Fence(ctx, ino); err != nil {
			errs = append(errs, fmt.Errorf("fence file %d: %w", ino, err))
		}
	}
	return errors.Join(errs...)
}

// Unfence does nothing: a fenced client's next layout carries the new
// owner.
func (d *DataServers) Unfence(ctx context.Context, clientID uint64) error { return nil }

// OnChange: the set of NFSv3 data servers is fixed by configuration.
func (d *DataServers) OnChange(fn func(left bool)) func() { return func() {} }

// LooseFlexLayout returns file ino's layout for MDS client clientID and
// remembers that the client holds it (for Fence).
func (d *DataServers) LooseFlexLayout(ctx context.Context, clientID, ino uint64, rw bool) (nfs4.FfLayout4, error) {
	ff, err := d.st.Layout(ctx, ino, rw, d.unit)
	if err != nil {
		return ff, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.held[clientID]
	if m == nil || len(m) >= maxHeld {
		m = map[uint64]bool{}
		d.held[clientID] = m
	}
	m[ino] = true
	return ff, nil
}

// LooseDeviceAddr is Store.DeviceAddr.
func (d *DataServers) LooseDeviceAddr(id [16]byte) ([]byte, bool, error) { return d.st.DeviceAddr(id) }

// FenceFile fences file ino now (an operator's or a test's trigger) and
// returns the new owner.
func (d *DataServers) FenceFile(ctx context.Context, ino uint64) (uint32, error) {
	return d.st.Fence(ctx, ino)
}

// CopyFailed marks stale the copy of file ino on the data server of
// device, which a client reported failing (server.CopyFailer,
// Store.MarkStale).
func (d *DataServers) CopyFailed(ctx context.Context, ino uint64, device [16]byte) (string, bool, error) {
	return d.st.MarkStale(ctx, ino, device)
}
