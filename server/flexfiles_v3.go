package server

import (
	"context"
	"fmt"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server/internal/state"
)

// Loosely coupled flexfiles data servers (RFC 8435 with NFSv3 data
// servers, package flexv3): when DataServers has the LooseFlexLayouter
// capability, a flexfiles export's LAYOUTGET and GETDEVICEINFO come from
// it whole. The layout names the data files' NFSv3 handles, the
// anonymous stateid and synthetic ids instead of the client's layout
// stateid and an fhFlex handle; the device says ffdv_version 3, not
// tightly coupled. The data servers check only the ids, so a client
// whose layouts are revoked is fenced per file by an owner change
// (DataServers.Fence, called by pnfsState.fence as for Shoal's own data
// servers), and sizes come from LAYOUTCOMMIT.

// LooseFlexLayouter is an optional capability of DataServers
// (flexv3.DataServers).
type LooseFlexLayouter interface {
	// LooseFlexLayout returns file ino's ff_layout4 for MDS client
	// clientID, read/write or read-only, creating the data files first.
	LooseFlexLayout(ctx context.Context, clientID, ino uint64, rw bool) (nfs4.FfLayout4, error)
	// LooseDeviceAddr returns a device's ff_device_addr4; ok is false for
	// an unknown device.
	LooseDeviceAddr(id [16]byte) (body []byte, ok bool, err error)
}

// looseFlex returns the capability, or nil.
func (p *pnfsState) looseFlex() LooseFlexLayouter {
	if p == nil {
		return nil
	}
	l, _ := p.ds.(LooseFlexLayouter)
	return l
}

// looseBody encodes the loosely coupled layout of file o for client id.
func (c *compound) looseBody(l LooseFlexLayouter, o *object, id uint64, mode nfs4.Layoutiomode4) ([]byte, error) {
	ff, err := l.LooseFlexLayout(c.ctx, id, uint64(o.fh.ino), mode == nfs4.LAYOUTIOMODE4_RW)
	if err != nil {
		return nil, err
	}
	return xdr.Marshal(&ff), nil
}

// fenceLoose fences, on loosely coupled data servers, a client whose
// lease expired: its layouts are gone with its state, but it may still be
// writing to the data servers with their ids. (Shoal's own data servers
// ask the MDS about every stateid and need no such step.)
func (p *pnfsState) fenceLoose(id state.ClientID) {
	if p.looseFlex() == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.ds.Fence(ctx, uint64(id)); err != nil {
		p.s.log.Warn("fence an expired client's files on the NFSv3 data servers", "clientid", fmt.Sprintf("%#x", uint64(id)), "err", err)
	}
}
