package layout

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

// FlexFiles is the driver for LAYOUT4_FLEX_FILES (RFC 8435). A layout
// names one or more mirrors, each a full copy of the file; a mirror with
// several data servers stripes the file over them in units of
// ffl_stripe_unit, round-robin (stripe unit i of the file on data server
// i mod count of every mirror). Each data server holds its part at the
// file's own offsets (sparse packing), as Linux's flexfiles client, which
// stripes inside a mirror since 6.18, sends them.
//
// The client writes every mirror itself and reads from one, so Map lists
// an extent's copies in order of read preference: by ffds_efficiency,
// highest first, then in the layout's order.
//
// Each data server is one device (ff_device_addr4: one multipath list and
// the protocol versions it speaks). A tightly coupled data server checks
// the stateid the layout gives (ffds_stateid); a loosely coupled one is a
// plain NFS server that checks only the AUTH_SYS identity, so the layout
// gives a synthetic uid and gid for it (ffds_user, ffds_group: numeric
// strings) that the metadata server can change to fence the client out
// (RFC 8435 §2.2).
var FlexFiles Driver = flexDriver{}

func init() {
	if err := Register(FlexFiles); err != nil {
		panic(err) // two drivers for one type in this package: a programming error
	}
}

var (
	_ Driver        = flexDriver{}
	_ ReturnEncoder = flexDriver{}
	_ Layout        = (*flexLayout)(nil)
	_ Device        = (*flexDevice)(nil)
)

// Bounds on what a flexfiles layout may name: a layout larger than these
// is refused as malformed rather than planned (the decoder's own limits
// bound the allocation; these bound the work per extent).
const (
	maxFlexMirrors = 16
	maxFlexStripes = 256
)

type flexDriver struct{}

func (flexDriver) Type() uint32 { return uint32(nfs4.LAYOUT4_FLEX_FILES) }

// flexLayout is a decoded ff_layout4.
type flexLayout struct {
	unit    uint64
	flags   uint32
	mirrors [][]flexDS // by mirror, then stripe
	order   []int      // mirror indices in order of read preference
	devs    []DeviceID
}

// flexDS is one ff_data_server4.
type flexDS struct {
	dev        DeviceID
	efficiency uint32
	stateid    nfs4.Stateid4
	fh         []byte
	user, grp  string
}

func (flexDriver) DecodeLayout(body []byte) (Layout, error) {
	var fl nfs4.FfLayout4
	if err := xdr.Unmarshal(body, &fl); err != nil {
		return nil, fmt.Errorf("layout: flexfiles layout: %w", err)
	}
	if len(fl.FflMirrors) == 0 {
		return nil, fmt.Errorf("layout: flexfiles layout without mirrors")
	}
	if len(fl.FflMirrors) > maxFlexMirrors {
		return nil, fmt.Errorf("layout: flexfiles layout with %d mirrors (at most %d)", len(fl.FflMirrors), maxFlexMirrors)
	}
	l := &flexLayout{unit: uint64(fl.FflStripeUnit), flags: uint32(fl.FflFlags)}
	eff := make([]uint32, len(fl.FflMirrors))
	for m, mir := range fl.FflMirrors {
		n := len(mir.FfmDataServers)
		switch {
		case n == 0:
			return nil, fmt.Errorf("layout: flexfiles mirror %d without data servers", m)
		case n > maxFlexStripes:
			return nil, fmt.Errorf("layout: flexfiles mirror %d with %d data servers (at most %d)", m, n, maxFlexStripes)
		case n > 1 && l.unit == 0:
			return nil, fmt.Errorf("layout: flexfiles mirror %d stripes over %d data servers with stripe unit 0", m, n)
		}
		dss := make([]flexDS, n)
		for i, ds := range mir.FfmDataServers {
			if len(ds.FfdsFhVers) == 0 {
				return nil, fmt.Errorf("layout: flexfiles mirror %d data server %d without a filehandle", m, i)
			}
			dss[i] = flexDS{
				dev: DeviceID(ds.FfdsDeviceid), efficiency: uint32(ds.FfdsEfficiency), stateid: ds.FfdsStateid,
				fh:   slices.Clone(ds.FfdsFhVers[0]),
				user: string(ds.FfdsUser), grp: string(ds.FfdsGroup),
			}
			eff[m] = max(eff[m], dss[i].efficiency)
			if !slices.Contains(l.devs, dss[i].dev) {
				l.devs = append(l.devs, dss[i].dev)
			}
		}
		l.mirrors = append(l.mirrors, dss)
		l.order = append(l.order, m)
	}
	// A mirror's efficiency is that of its best data server: the one
	// the server rates highest is the copy to read first.
	slices.SortStableFunc(l.order, func(a, b int) int {
		switch {
		case eff[a] > eff[b]:
			return -1
		case eff[a] < eff[b]:
			return 1
		}
		return 0
	})
	return l, nil
}

func (l *flexLayout) Devices() []DeviceID { return l.devs }

func (l *flexLayout) Props() Props {
	return Props{
		NoLayoutCommit: l.flags&nfs4.FF_FLAGS_NO_LAYOUTCOMMIT != 0,
		NoIOThroughMDS: l.flags&nfs4.FF_FLAGS_NO_IO_THRU_MDS != 0,
		NoReadIO:       l.flags&nfs4.FF_FLAGS_NO_READ_IO != 0,
		WriteOneMirror: l.flags&nfs4.FF_FLAGS_WRITE_ONE_MIRROR != 0,
		ErrorReports:   true,
	}
}

// Map cuts [off, off+n) at stripe unit boundaries (not at all when no
// mirror stripes) and gives each piece one copy per mirror, on the data
// server that holds the piece's stripe unit in that mirror.
func (l *flexLayout) Map(dst []Extent, off, n uint64, dev func(DeviceID) (Device, bool)) ([]Extent, error) {
	end := off + n
	if end < off {
		return dst, fmt.Errorf("layout: range [%d,+%d) overflows", off, n)
	}
	striped := false
	for _, m := range l.mirrors {
		striped = striped || len(m) > 1
	}
	for off < end {
		hi := end
		var su uint64
		if striped {
			su = off / l.unit
			hi = min(end, (su+1)*l.unit)
		}
		copies := make([]Copy, 0, len(l.mirrors))
		for _, m := range l.order {
			mir := l.mirrors[m]
			j := int(su % uint64(len(mir)))
			c, err := mir[j].copy(dev)
			if err != nil {
				return dst, fmt.Errorf("%w (mirror %d, data server %d)", err, m, j)
			}
			c.DSOff = off
			c.Stripe, c.Stripes, c.Mirror, c.Mirrors = j, len(mir), m, len(l.mirrors)
			copies = append(copies, c)
		}
		dst = append(dst, Extent{Off: off, Len: hi - off, Copies: copies})
		off = hi
	}
	return dst, nil
}

// copy is the Copy of data server ds, without its place in the layout.
func (ds *flexDS) copy(dev func(DeviceID) (Device, bool)) (Copy, error) {
	d, ok := dev(ds.dev)
	if !ok {
		return Copy{}, ErrNoDevice
	}
	fd, ok := d.(*flexDevice)
	if !ok {
		return Copy{}, fmt.Errorf("layout: flexfiles layout with a %T device", d)
	}
	v := fd.version
	c := Copy{
		Device: ds.dev, Addrs: fd.addrs, FH: ds.fh,
		Version: v.version, Minor: v.minor, RSize: v.rsize, WSize: v.wsize,
	}
	if v.version == 4 {
		// RFC 8435 §5.1: the stateid to use with an NFSv4 data server;
		// loosely coupled, it is the anonymous stateid.
		sid := ds.stateid
		c.Stateid = &sid
	}
	if !v.tight {
		uid, err1 := strconv.ParseUint(ds.user, 10, 32)
		gid, err2 := strconv.ParseUint(ds.grp, 10, 32)
		if err1 != nil || err2 != nil {
			return Copy{}, fmt.Errorf("layout: flexfiles: loosely coupled data server with a synthetic owner %q:%q that is not numeric", ds.user, ds.grp)
		}
		c.Auth = &AuthSys{UID: uint32(uid), GID: uint32(gid)}
	}
	return c, nil
}

// EncodeReturn encodes an ff_layoutreturn4 (RFC 8435 §9.3) with one
// ff_ioerr4 per error and no I/O statistics.
func (flexDriver) EncodeReturn(errs []IOError) []byte {
	var r nfs4.FfLayoutreturn4
	for _, e := range errs {
		r.FflrIoerrReport = append(r.FflrIoerrReport, nfs4.FfIoerr4{
			FfieOffset: nfs4.Offset4(e.Off), FfieLength: nfs4.Length4(e.Len), FfieStateid: e.Stateid,
			FfieErrors: []nfs4.DeviceError4{{DeDeviceid: nfs4.Deviceid4(e.Device), DeStatus: e.Status, DeOpnum: e.Op}},
		})
	}
	return xdr.Marshal(&r)
}

// flexDevice is a decoded ff_device_addr4: one data server.
type flexDevice struct {
	addrs   []string
	version flexVersion // the one the client uses
}

type flexVersion struct {
	version, minor, rsize, wsize uint32
	tight                        bool
}

func (d *flexDevice) Servers() [][]string { return [][]string{d.addrs} }

// Versions a flexfiles data server may speak that this driver plans for:
// NFSv4.1 and later (sessions: the client's data-server machinery), and
// NFSv3.
func usableVersion(v flexVersion) bool {
	return (v.version == 4 && v.minor >= 1) || v.version == 3
}

func (flexDriver) DecodeDevice(body []byte) (Device, error) {
	var a nfs4.FfDeviceAddr4
	if err := xdr.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("layout: flexfiles device: %w", err)
	}
	d := &flexDevice{}
	for _, na := range a.FfdaNetaddrs {
		hp, err := ParseUAddr(na.NaRNetid, na.NaRAddr)
		if err != nil {
			continue // another path may be usable
		}
		d.addrs = append(d.addrs, hp)
	}
	if len(d.addrs) == 0 {
		return nil, fmt.Errorf("layout: flexfiles device without a usable address")
	}
	// The server lists versions in its order of preference (RFC 8435
	// §4.1); take the first this client speaks, NFSv4 before NFSv3 when
	// both are there.
	found := false
	for _, v := range a.FfdaVersions {
		fv := flexVersion{uint32(v.FfdvVersion), uint32(v.FfdvMinorversion), uint32(v.FfdvRsize), uint32(v.FfdvWsize), v.FfdvTightlyCoupled}
		if !usableVersion(fv) || (found && !(d.version.version == 3 && fv.version == 4)) {
			continue
		}
		d.version, found = fv, true
	}
	if !found {
		return nil, fmt.Errorf("layout: flexfiles device speaks no NFS version the client does (%d offered)", len(a.FfdaVersions))
	}
	return d, nil
}
