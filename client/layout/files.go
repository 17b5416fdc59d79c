package layout

import (
	"fmt"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Files is the driver for LAYOUT4_NFSV4_1_FILES (RFC 8881 §13): a file is
// striped round-robin over the data servers of one device in stripe units.
var Files Driver = filesDriver{}

func init() {
	if err := Register(Files); err != nil {
		panic(err) // two drivers for one type in this package: a programming error
	}
}

var (
	_ Driver = filesDriver{}
	_ Layout = (*filesLayout)(nil)
	_ Device = (*filesDevice)(nil)
)

type filesDriver struct{}

func (filesDriver) Type() uint32 { return uint32(nfs4.LAYOUT4_NFSV4_1_FILES) }

// filesLayout is a decoded nfsv4_1_file_layout4.
type filesLayout struct {
	dev     DeviceID
	unit    uint64
	dense   bool
	thruMDS bool
	first   uint32
	pattern uint64
	fhs     [][]byte
}

func (filesDriver) DecodeLayout(body []byte) (Layout, error) {
	var l nfs4.Nfsv41FileLayout4
	if err := xdr.Unmarshal(body, &l); err != nil {
		return nil, fmt.Errorf("layout: files layout: %w", err)
	}
	unit := uint64(l.NflUtil & nfs4.NFL4_UFLG_STRIPE_UNIT_SIZE_MASK)
	if unit == 0 {
		return nil, fmt.Errorf("layout: files layout with stripe unit 0")
	}
	if len(l.NflFhList) == 0 {
		return nil, fmt.Errorf("layout: files layout without filehandles")
	}
	fl := &filesLayout{
		dev: DeviceID(l.NflDeviceid), unit: unit,
		dense:   l.NflUtil&nfs4.NFL4_UFLG_DENSE != 0,
		thruMDS: l.NflUtil&nfs4.NFL4_UFLG_COMMIT_THRU_MDS != 0,
		first:   uint32(l.NflFirstStripeIndex), pattern: uint64(l.NflPatternOffset),
	}
	for _, fh := range l.NflFhList {
		fl.fhs = append(fl.fhs, append([]byte(nil), fh...))
	}
	return fl, nil
}

func (l *filesLayout) Devices() []DeviceID { return []DeviceID{l.dev} }
func (l *filesLayout) Props() Props        { return Props{CommitThroughMDS: l.thruMDS} }

// Map follows RFC 8881 §13.4: stripe unit SUi = (off-pattern)/unit goes to
// stripe index (SUi + first) mod count, whose entry in the device's
// stripe-indices array names the data server.
func (l *filesLayout) Map(dst []Extent, off, n uint64, dev func(DeviceID) (Device, bool)) ([]Extent, error) {
	d, ok := dev(l.dev)
	if !ok {
		return dst, ErrNoDevice
	}
	fd, ok := d.(*filesDevice)
	if !ok {
		return dst, fmt.Errorf("layout: files layout with a %T device", d)
	}
	count := uint64(len(fd.indices))
	if count == 0 {
		return dst, fmt.Errorf("layout: files device without stripe indices")
	}
	if len(l.fhs) != 1 && uint64(len(l.fhs)) != count {
		return dst, fmt.Errorf("layout: %d filehandles for %d stripe indices", len(l.fhs), count)
	}
	if off < l.pattern {
		return dst, fmt.Errorf("layout: offset %d before the pattern offset %d", off, l.pattern)
	}
	end := off + n
	if end < off {
		return dst, fmt.Errorf("layout: range [%d,+%d) overflows", off, n)
	}
	for off < end {
		rel := off - l.pattern
		su := rel / l.unit
		hi := min(end, l.pattern+(su+1)*l.unit)
		j := (su + uint64(l.first)) % count
		idx := fd.indices[j]
		if int(idx) >= len(fd.servers) {
			return dst, fmt.Errorf("layout: stripe index %d names data server %d of %d", j, idx, len(fd.servers))
		}
		fh := l.fhs[0]
		if len(l.fhs) > 1 {
			fh = l.fhs[j]
		}
		dsOff := off
		if l.dense {
			dsOff = (su/count)*l.unit + rel%l.unit
		}
		dst = append(dst, Extent{Off: off, Len: hi - off, Copies: []Copy{{DSOff: dsOff, Device: l.dev, Addrs: fd.servers[idx], FH: fh,
			Stripe: int(j), Stripes: int(count), Mirrors: 1}}})
		off = hi
	}
	return dst, nil
}

// filesDevice is a decoded nfsv4_1_file_layout_ds_addr4.
type filesDevice struct {
	indices []uint32
	servers [][]string
}

func (d *filesDevice) Servers() [][]string { return d.servers }

func (filesDriver) DecodeDevice(body []byte) (Device, error) {
	var a nfs4.Nfsv41FileLayoutDsAddr4
	if err := xdr.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("layout: files device: %w", err)
	}
	d := &filesDevice{}
	for _, i := range a.NfldaStripeIndices {
		d.indices = append(d.indices, uint32(i))
	}
	for i, mp := range a.NfldaMultipathDsList {
		var addrs []string
		for _, na := range mp {
			hp, err := ParseUAddr(na.NaRNetid, na.NaRAddr)
			if err != nil {
				continue // another path may be usable
			}
			addrs = append(addrs, hp)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("layout: files device: data server %d has no usable address", i)
		}
		d.servers = append(d.servers, addrs)
	}
	return d, nil
}
