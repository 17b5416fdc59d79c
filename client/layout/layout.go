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
// type in the server's fs_layout_types that has a driver (or the first of
// its own preference list that the server offers). The files layout
// driver ([Files], RFC 8881 §13) and the flexible files driver
// ([FlexFiles], RFC 8435) are registered by this package; they are the
// two implementations the interfaces here are cut to fit: the files
// layout puts each byte on one data server, flexfiles on one data server
// per mirror, written by the client to every mirror.
package layout

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// DeviceID is a deviceid4.
type DeviceID [16]byte

// Extent is one contiguous piece of file I/O and the copies that hold it:
// one for the files layout, one per mirror for flexfiles (RFC 8435 §2.3).
// A write goes to every copy; a read to the first copy that works, so a
// driver lists them in order of read preference.
type Extent struct {
	// Off and Len are the byte range of the file.
	Off, Len uint64
	// Copies hold the range, each on one data server. Empty: no data
	// server holds it (a range the layout does not cover).
	Copies []Copy
}

// Copy is where one copy of an Extent lives: one data server, and how to
// talk to it.
type Copy struct {
	// DSOff is the offset to send to the data server for Extent.Off
	// (equal to it with sparse packing).
	DSOff uint64
	// Device is the device the data server belongs to.
	Device DeviceID
	// Addrs are the data server's addresses ("host:port"), in order of
	// preference (a multipath list: all reach the same server).
	Addrs []string
	// FH is the filehandle to present to the data server.
	FH []byte
	// Stateid, if not nil, is the stateid for READ and WRITE on the data
	// server (flexfiles' ffds_stateid); nil means the open's or lock's
	// stateid, as the files layout has it (RFC 8881 §13.9.1).
	Stateid *nfs4.Stateid4
	// Auth, if not nil, is the AUTH_SYS identity to present to the data
	// server instead of the caller's: the synthetic uid and gid of a
	// loosely coupled flexfiles data server (RFC 8435 §2.2), which is how
	// the metadata server fences a client.
	Auth *AuthSys
	// Version and Minor are the NFS version the data server speaks.
	// Version 0 means the metadata server's NFSv4 minor version (files).
	Version, Minor uint32
	// RSize and WSize, if not 0, bound READ and WRITE sizes.
	RSize, WSize uint32
	// Stripe is the data server's place in its mirror, from 0, and
	// Stripes the number of places (for the files layout: the stripe
	// index of RFC 8881 §13.4 and the length of the device's stripe
	// indices). Mirror is the copy's mirror, from 0, of Mirrors. Errors
	// use them to name a data server.
	Stripe, Stripes int
	Mirror, Mirrors int
}

// AuthSys is an AUTH_SYS identity.
type AuthSys struct{ UID, GID uint32 }

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
	// extent lies within one stripe unit, so on one data server per copy.
	// dev returns the decoded device for an id from Devices.
	Map(dst []Extent, off, n uint64, dev func(DeviceID) (Device, bool)) ([]Extent, error)
	// Props are the rules of the layout's I/O.
	Props() Props
}

// Props are the rules a layout sets for the I/O through it.
type Props struct {
	// CommitThroughMDS: COMMIT goes to the metadata server rather than
	// to each data server written (files: NFL4_UFLG_COMMIT_THRU_MDS).
	CommitThroughMDS bool
	// NoLayoutCommit: the metadata server learns what was written
	// without a LAYOUTCOMMIT (flexfiles: FF_FLAGS_NO_LAYOUTCOMMIT).
	NoLayoutCommit bool
	// NoIOThroughMDS: the metadata server asks not to be sent the I/O a
	// data server failed (flexfiles: FF_FLAGS_NO_IO_THRU_MDS).
	NoIOThroughMDS bool
	// NoReadIO: a read/write layout is not to be used for READ
	// (flexfiles: FF_FLAGS_NO_READ_IO).
	NoReadIO bool
	// WriteOneMirror: writing the first copy is enough; the data servers
	// copy it to the other mirrors (flexfiles: FF_FLAGS_WRITE_ONE_MIRROR).
	WriteOneMirror bool
	// ErrorReports: the layout type takes reports of data-server errors
	// (LAYOUTERROR, and the layout type's LAYOUTRETURN body), and a copy
	// reported failing is no longer one the client must write (flexfiles,
	// RFC 8435 §9.1 and RFC 7862 §15.6).
	ErrorReports bool
}

// IOError is one data-server error to report to the metadata server
// (device_error4 in LAYOUTERROR, ff_ioerr4 in a flexfiles LAYOUTRETURN).
type IOError struct {
	Off, Len uint64
	Stateid  nfs4.Stateid4 // the data server's stateid (Copy.Stateid), or the layout's
	Device   DeviceID
	Status   nfs4.Nfsstat4
	Op       nfs4.NfsOpnum4
}

// ReturnEncoder is a Driver that puts a body into LAYOUTRETURN (the
// lrf_body of layoutreturn_file4): the errors the client saw on the data
// servers of the layout returned.
type ReturnEncoder interface {
	EncodeReturn(errs []IOError) []byte
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
