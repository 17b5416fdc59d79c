package layout

import (
	"reflect"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

func filesDevice4(t *testing.T) Device {
	t.Helper()
	var da nfs4.Nfsv41FileLayoutDsAddr4
	for i := range 4 {
		da.NfldaStripeIndices = append(da.NfldaStripeIndices, nfs4.Uint32T(i))
		da.NfldaMultipathDsList = append(da.NfldaMultipathDsList, nfs4.MultipathList4{
			{NaRNetid: "tcp", NaRAddr: "10.0.0." + string(rune('1'+i)) + ".8.1"},
		})
	}
	d, err := Files.DecodeDevice(xdr.Marshal(&da))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestFilesMap(t *testing.T) {
	dev := filesDevice4(t)
	id := DeviceID{1, 2, 3}
	const unit = 1 << 20
	type ext struct {
		off, n, dsOff uint64
		ds            string
	}
	cases := []struct {
		name  string
		util  uint32
		first uint32
		fhs   int
		off   uint64
		n     uint64
		want  []ext
	}{
		{"one unit", unit, 0, 1, 0, unit, []ext{{0, unit, 0, "10.0.0.1:2049"}}},
		{"first index rotates", unit, 2, 1, 0, 2 * unit, []ext{
			{0, unit, 0, "10.0.0.3:2049"}, {unit, unit, unit, "10.0.0.4:2049"}}},
		{"unaligned across units", unit, 3, 1, unit - 10, 20, []ext{
			{unit - 10, 10, unit - 10, "10.0.0.4:2049"}, {unit, 10, unit, "10.0.0.1:2049"}}},
		{"wraps around", unit, 0, 1, 4 * unit, 1, []ext{{4 * unit, 1, 4 * unit, "10.0.0.1:2049"}}},
		{"dense packing", unit | nfs4.NFL4_UFLG_DENSE, 0, 1, 5*unit + 7, 3, []ext{
			{5*unit + 7, 3, unit + 7, "10.0.0.2:2049"}}},
		{"fh per index", 64, 1, 4, 64, 64, []ext{{64, 64, 64, "10.0.0.3:2049"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fl := nfs4.Nfsv41FileLayout4{NflDeviceid: nfs4.Deviceid4(id), NflUtil: nfs4.NflUtil4(tc.util), NflFirstStripeIndex: nfs4.Uint32T(tc.first)}
			for i := range tc.fhs {
				fl.NflFhList = append(fl.NflFhList, nfs4.NfsFh4{byte(i)})
			}
			l, err := Files.DecodeLayout(xdr.Marshal(&fl))
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Devices(); !reflect.DeepEqual(got, []DeviceID{id}) {
				t.Fatalf("Devices = %v", got)
			}
			exts, err := l.Map(nil, tc.off, tc.n, func(d DeviceID) (Device, bool) { return dev, d == id })
			if err != nil {
				t.Fatal(err)
			}
			var got []ext
			for _, ex := range exts {
				if len(ex.Copies) != 1 {
					t.Fatalf("extent at %d has %d copies, want 1", ex.Off, len(ex.Copies))
				}
				e := ex.Copies[0]
				got = append(got, ext{ex.Off, ex.Len, e.DSOff, e.Addrs[0]})
				if j := (ex.Off/(uint64(tc.util)&^63) + uint64(tc.first)) % 4; e.Stripe != int(j) || e.Stripes != 4 {
					t.Errorf("extent at %d: stripe %d of %d, want %d of 4", ex.Off, e.Stripe, e.Stripes, j)
				}
				if tc.fhs > 1 {
					j := (ex.Off/(uint64(tc.util)&^63) + uint64(tc.first)) % 4
					if e.FH[0] != byte(j) {
						t.Errorf("extent at %d uses fh %d, want %d", ex.Off, e.FH[0], j)
					}
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Map(%d,%d) =\n %v\nwant\n %v", tc.off, tc.n, got, tc.want)
			}
		})
	}
}

func TestFilesErrors(t *testing.T) {
	if _, err := Files.DecodeLayout([]byte{1, 2}); err == nil {
		t.Error("short body decoded")
	}
	fl := nfs4.Nfsv41FileLayout4{NflUtil: 0, NflFhList: []nfs4.NfsFh4{{1}}}
	if _, err := Files.DecodeLayout(xdr.Marshal(&fl)); err == nil {
		t.Error("stripe unit 0 accepted")
	}
	fl.NflUtil = 1 << 20
	l, err := Files.DecodeLayout(xdr.Marshal(&fl))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Map(nil, 0, 1, func(DeviceID) (Device, bool) { return nil, false }); err != ErrNoDevice {
		t.Errorf("unresolved device: %v", err)
	}
	fl.NflFhList = []nfs4.NfsFh4{{1}, {2}}
	l, _ = Files.DecodeLayout(xdr.Marshal(&fl))
	dev := filesDevice4(t)
	if _, err := l.Map(nil, 0, 1, func(DeviceID) (Device, bool) { return dev, true }); err == nil {
		t.Error("2 filehandles for 4 stripe indices accepted")
	}
}

func TestParseUAddr(t *testing.T) {
	for _, tc := range []struct{ netid, in, want string }{
		{"tcp", "127.0.0.1.8.1", "127.0.0.1:2049"},
		{"tcp", "10.1.2.3.0.80", "10.1.2.3:80"},
		{"tcp6", "::1.4.0", "[::1]:1024"},
		{"tcp", "127.0.0.1.300.1", ""},
		{"tcp", "host.8.1", ""},
		{"udp", "127.0.0.1.8.1", ""},
		{"tcp", "1.2", ""},
	} {
		got, err := ParseUAddr(tc.netid, tc.in)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("ParseUAddr(%q, %q) = %q, %v; want %q", tc.netid, tc.in, got, err, tc.want)
		}
	}
}

func TestRegistry(t *testing.T) {
	d, ok := Lookup(uint32(nfs4.LAYOUT4_NFSV4_1_FILES))
	if !ok || d != Files {
		t.Fatal("files driver not registered")
	}
	if err := Register(Files); err == nil {
		t.Error("duplicate registration accepted")
	}
	if d, ok := Lookup(uint32(nfs4.LAYOUT4_FLEX_FILES)); !ok || d != FlexFiles {
		t.Error("flexfiles driver not registered")
	}
	if _, ok := Lookup(uint32(nfs4.LAYOUT4_BLOCK_VOLUME)); ok {
		t.Error("a driver for the block layout registered")
	}
}
