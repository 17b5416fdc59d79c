package flexv3

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Layout returns file ino's flexfiles layout on the NFSv3 data servers,
// creating its data files if they do not exist: one mirror per copy, one
// data server per mirror (the whole file in one data file, so every
// Linux client takes it), ffds_stateid the anonymous stateid, the data
// file's NFSv3 handle, and the synthetic ids: the owner for a read/write
// layout, the read-only uid for a read layout, the file's group. unit is
// ffl_stripe_unit (unused with one data server per mirror; the MDS's).
// ffl_flags is 0: the MDS needs LAYOUTCOMMIT for sizes, and serves I/O
// itself.
func (s *Store) Layout(ctx context.Context, ino uint64, rw bool, unit uint64) (nfs4.FfLayout4, error) {
	df, err := s.lookup(ctx, ino, true)
	if err != nil {
		return nfs4.FfLayout4{}, err
	}
	s.mu.Lock()
	if rw && s.healing[ino] {
		s.mu.Unlock()
		return nfs4.FfLayout4{}, errHealing
	}
	uid := df.owner
	var servers []int
	var fhs [][]byte
	for j, si := range df.servers {
		if !df.stale[j] {
			servers, fhs = append(servers, si), append(fhs, df.fhs[j])
		}
	}
	s.mu.Unlock()
	if !rw {
		uid = s.ReadOnlyUID(ino)
	}
	user := []byte(strconv.FormatUint(uint64(uid), 10))
	group := []byte(strconv.FormatUint(uint64(s.GID(ino)), 10))
	ff := nfs4.FfLayout4{FflStripeUnit: unit}
	for j, si := range servers {
		ff.FflMirrors = append(ff.FflMirrors, nfs4.FfMirror4{FfmDataServers: []nfs4.FfDataServer4{{
			FfdsDeviceid: deviceID(si),
			// Reads prefer the first mirror, as the MDS's own do.
			FfdsEfficiency: uint32(len(servers) - j),
			FfdsStateid:    nfs4.Stateid4{}, // anonymous: NFSv3 has no stateids
			FfdsFhVers:     []nfs4.NfsFh4{fhs[j]},
			FfdsUser:       user,
			FfdsGroup:      group,
		}}})
	}
	return ff, nil
}

// Devices returns the device ids of all data servers.
func (s *Store) Devices() [][16]byte {
	out := make([][16]byte, len(s.servers))
	for i := range out {
		out[i] = deviceID(i)
	}
	return out
}

// IsDevice reports whether id is one of the store's devices.
func (s *Store) IsDevice(id [16]byte) bool {
	_, ok := deviceIndex(id, len(s.servers))
	return ok
}

// DeviceAddr returns the ff_device_addr4 of device id: the server's
// advertised address, NFSv3 (minor version 0), loosely coupled, with
// rsize and wsize the store's I/O size. ok is false for a device that is
// not the store's.
func (s *Store) DeviceAddr(id [16]byte) (body []byte, ok bool, err error) {
	i, ok := deviceIndex(id, len(s.servers))
	if !ok {
		return nil, false, nil
	}
	na, err := netaddr(s.servers[i].cfg.Advertise)
	if err != nil {
		return nil, true, err
	}
	da := nfs4.FfDeviceAddr4{
		FfdaNetaddrs: []nfs4.Netaddr4{na},
		FfdaVersions: []nfs4.FfDeviceVersions4{{
			FfdvVersion: 3, FfdvMinorversion: 0,
			FfdvRsize: s.cfg.IOSize, FfdvWsize: s.cfg.IOSize,
			FfdvTightlyCoupled: false,
		}},
	}
	return xdr.Marshal(&da), true, nil
}

// netaddr is hostport as an RFC 5665 universal address.
func netaddr(hostport string) (nfs4.Netaddr4, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nfs4.Netaddr4{}, err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return nfs4.Netaddr4{}, fmt.Errorf("flexv3: bad port in %q", hostport)
	}
	netid := "tcp"
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		netid = "tcp6"
	}
	return nfs4.Netaddr4{NaRNetid: netid, NaRAddr: fmt.Sprintf("%s.%d.%d", host, p>>8, p&0xff)}, nil
}
