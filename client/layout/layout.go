// Package layout is the client side of pNFS layouts: it turns the opaque
// layout and device bodies a metadata server hands out (LAYOUTGET,
// GETDEVICEINFO) into a plan of which byte ranges of a file go to which
// data server, at which offset and with which filehandle.
//
// The split of work is deliberate. The client package owns everything that
// is the same for every layout type: sessions with data servers, the device
// cache, parallelism, commits, recalls and failover to the metadata server.
// A [Driver] owns only the decoding and the arithmetic of one layout type,
// which is the part RFC 8881 (§13, files) and RFC 8435 (flexfiles) define
// differently. A driver is therefore pure: no I/O, no clocks, no goroutines,
// so it can be tested exhaustively with tables and a new layout type cannot
// break the I/O machinery.
//
// Drivers register by layout type ([Register]); the client picks the first
// type in the server's fs_layout_types that has a driver. The files layout
// driver ([Files]) is registered by this package.
package layout

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
)

// DeviceID is a deviceid4.
type DeviceID [16]byte

// Extent is one contiguous piece of file I/O that goes to one data server.
type Extent struct {
	// Off and Len are the byte range of the file.
	Off, Len uint64
	// DSOff is the offset to send to the data server for Off (equal to Off
	// with sparse packing).
	DSOff uint64
	// Device is the device the data server belongs to.
	Device DeviceID
	// Addrs are the data server's addresses ("host:port"), in order of
	// preference (a multipath list: all reach the same server).
	Addrs []string
	// FH is the filehandle to present to the data server.
	FH []byte
	// Stripe is the data server's place in the layout, from 0, and
	// Stripes the number of places (for the files layout: the stripe
	// index of RFC 8881 §13.4 and the length of the device's stripe
	// indices). Errors use them to name a data server.
	Stripe, Stripes int
}

// Driver decodes the layouts and devices of one layout type.
type Driver interface {
	// Type is the layouttype4 the driver handles.
	Type() uint32
	// DecodeLayout decodes a layout4's loc_body.
	DecodeLayout(body []byte) (Layout, error)
	// DecodeDevice decodes a device_addr4's da_addr_body.
	DecodeDevice(body []byte) (Device, error)
}

// Layout is one decoded layout segment.
type Layout interface {
	// Devices lists the devices the layout refers to; the client resolves
	// them (GETDEVICEINFO) before calling Map.
	Devices() []DeviceID
	// Map appends to dst the extents of [off, off+n), in file order. Each
	// extent lies within one stripe unit, so on one data server. dev
	// returns the decoded device for an id from Devices.
	Map(dst []Extent, off, n uint64, dev func(DeviceID) (Device, bool)) ([]Extent, error)
	// CommitThroughMDS reports whether COMMIT goes to the metadata server
	// (true) or to each data server that was written (false).
	CommitThroughMDS() bool
}

// Device is a decoded device address: the data servers of one device.
type Device interface {
	// Servers lists each data server's addresses, by the device's own
	// numbering (stripe index for the files layout).
	Servers() [][]string
}

// ErrNoDevice is returned by Map when a device the layout names is missing.
var ErrNoDevice = errors.New("layout: device not resolved")

var registry = struct {
	sync.RWMutex
	m map[uint32]Driver
}{m: map[uint32]Driver{}}

// Register makes d the driver for its layout type. It fails if that type
// already has a driver.
func Register(d Driver) error {
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.m[d.Type()]; dup {
		return fmt.Errorf("layout: type %d already has a driver", d.Type())
	}
	registry.m[d.Type()] = d
	return nil
}

// Lookup returns the driver registered for layout type t.
func Lookup(t uint32) (Driver, bool) {
	registry.RLock()
	defer registry.RUnlock()
	d, ok := registry.m[t]
	return d, ok
}

// ParseUAddr converts an RFC 5665 universal address for netid "tcp" or
// "tcp6" ("h1.h2.h3.h4.p1.p2", or an IPv6 address followed by ".p1.p2") to
// "host:port".
func ParseUAddr(netid, uaddr string) (string, error) {
	switch netid {
	case "tcp", "tcp6":
	default:
		return "", fmt.Errorf("layout: unsupported netid %q", netid)
	}
	i := strings.LastIndexByte(uaddr, '.')
	if i <= 0 {
		return "", fmt.Errorf("layout: malformed universal address %q", uaddr)
	}
	j := strings.LastIndexByte(uaddr[:i], '.')
	if j <= 0 {
		return "", fmt.Errorf("layout: malformed universal address %q", uaddr)
	}
	hi, err1 := strconv.ParseUint(uaddr[j+1:i], 10, 8)
	lo, err2 := strconv.ParseUint(uaddr[i+1:], 10, 8)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("layout: malformed port in universal address %q", uaddr)
	}
	host := uaddr[:j]
	if net.ParseIP(host) == nil {
		return "", fmt.Errorf("layout: malformed host in universal address %q", uaddr)
	}
	return net.JoinHostPort(host, strconv.FormatUint(hi<<8|lo, 10)), nil
}
