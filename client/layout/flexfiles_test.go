package layout

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

// ffDS builds an ff_data_server4 on device dev (its first byte).
func ffDS(dev byte, eff uint32) nfs4.FfDataServer4 {
	return nfs4.FfDataServer4{
		FfdsDeviceid: nfs4.Deviceid4{dev}, FfdsEfficiency: nfs4.Uint32T(eff),
		FfdsStateid: nfs4.Stateid4{Seqid: nfs4.Uint32T(dev)},
		FfdsFhVers:  []nfs4.NfsFh4{{'f', dev}},
		FfdsUser:    []byte("1000"), FfdsGroup: []byte("2000"),
	}
}

// ffDevice encodes an ff_device_addr4 for 10.0.0.<dev>:2049.
func ffDevice(dev byte, tight bool, versions ...[2]uint32) []byte {
	a := nfs4.FfDeviceAddr4{FfdaNetaddrs: nfs4.MultipathList4{
		{NaRNetid: "udp", NaRAddr: "10.9.9.9.8.1"}, // unusable: skipped
		{NaRNetid: "tcp", NaRAddr: fmt.Sprintf("10.0.0.%d.8.1", dev)},
	}}
	for _, v := range versions {
		a.FfdaVersions = append(a.FfdaVersions, nfs4.FfDeviceVersions4{
			FfdvVersion: nfs4.Uint32T(v[0]), FfdvMinorversion: nfs4.Uint32T(v[1]),
			FfdvRsize: 1 << 20, FfdvWsize: 1 << 19, FfdvTightlyCoupled: tight,
		})
	}
	return xdr.Marshal(&a)
}

func devices(t *testing.T, tight bool, ids ...byte) func(DeviceID) (Device, bool) {
	t.Helper()
	m := map[DeviceID]Device{}
	for _, id := range ids {
		d, err := FlexFiles.DecodeDevice(ffDevice(id, tight, [2]uint32{4, 2}))
		if err != nil {
			t.Fatal(err)
		}
		m[DeviceID{id}] = d
	}
	return func(id DeviceID) (Device, bool) { d, ok := m[id]; return d, ok }
}

func TestFlexFilesMap(t *testing.T) {
	const unit = 1 << 20
	type cp struct {
		addr          string
		mirror, strip int
	}
	type ext struct {
		off, n uint64
		copies []cp
	}
	a := func(dev byte) string { return fmt.Sprintf("10.0.0.%d:2049", dev) }
	cases := []struct {
		name    string
		unit    uint64
		mirrors [][]nfs4.FfDataServer4
		off, n  uint64
		want    []ext
	}{
		{"one mirror one ds: one extent", 0, [][]nfs4.FfDataServer4{{ffDS(1, 0)}}, 5, 3 * unit,
			[]ext{{5, 3 * unit, []cp{{a(1), 0, 0}}}}},
		{"two mirrors: one copy each, layout order", 0, [][]nfs4.FfDataServer4{{ffDS(1, 0)}, {ffDS(2, 0)}}, 0, 10,
			[]ext{{0, 10, []cp{{a(1), 0, 0}, {a(2), 1, 0}}}}},
		{"efficiency orders the copies", 0, [][]nfs4.FfDataServer4{{ffDS(1, 1)}, {ffDS(2, 9)}}, 0, 10,
			[]ext{{0, 10, []cp{{a(2), 1, 0}, {a(1), 0, 0}}}}},
		{"striped mirror: cut at stripe units", unit, [][]nfs4.FfDataServer4{{ffDS(1, 0), ffDS(2, 0), ffDS(3, 0)}}, unit - 1, unit + 2,
			[]ext{{unit - 1, 1, []cp{{a(1), 0, 0}}}, {unit, unit, []cp{{a(2), 0, 1}}}, {2 * unit, 1, []cp{{a(3), 0, 2}}}}},
		{"striped and mirrored", unit, [][]nfs4.FfDataServer4{{ffDS(1, 0), ffDS(2, 0)}, {ffDS(3, 0), ffDS(4, 0)}}, 3 * unit, 10,
			[]ext{{3 * unit, 10, []cp{{a(2), 0, 1}, {a(4), 1, 1}}}}},
		{"unit set, no mirror stripes: no cut", 64, [][]nfs4.FfDataServer4{{ffDS(1, 0)}, {ffDS(2, 0)}}, 0, 1000,
			[]ext{{0, 1000, []cp{{a(1), 0, 0}, {a(2), 1, 0}}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fl := nfs4.FfLayout4{FflStripeUnit: nfs4.Length4(tc.unit)}
			var ids []byte
			for _, m := range tc.mirrors {
				fl.FflMirrors = append(fl.FflMirrors, nfs4.FfMirror4{FfmDataServers: m})
				for _, ds := range m {
					ids = append(ids, ds.FfdsDeviceid[0])
				}
			}
			l, err := FlexFiles.DecodeLayout(xdr.Marshal(&fl))
			if err != nil {
				t.Fatal(err)
			}
			if got := len(l.Devices()); got != len(ids) {
				t.Errorf("Devices: %d, want %d", got, len(ids))
			}
			exts, err := l.Map(nil, tc.off, tc.n, devices(t, true, ids...))
			if err != nil {
				t.Fatal(err)
			}
			var got []ext
			for _, e := range exts {
				g := ext{off: e.Off, n: e.Len}
				for _, c := range e.Copies {
					g.copies = append(g.copies, cp{c.Addrs[0], c.Mirror, c.Stripe})
					if c.DSOff != e.Off {
						t.Errorf("extent at %d: data-server offset %d, want sparse (%d)", e.Off, c.DSOff, e.Off)
					}
					if c.Mirrors != len(tc.mirrors) || c.Stripes != len(tc.mirrors[c.Mirror]) {
						t.Errorf("extent at %d: mirror %d of %d, stripe of %d", e.Off, c.Mirror, c.Mirrors, c.Stripes)
					}
					ds := tc.mirrors[c.Mirror][c.Stripe]
					if !bytes.Equal(c.FH, ds.FfdsFhVers[0]) || c.Stateid == nil || *c.Stateid != ds.FfdsStateid {
						t.Errorf("extent at %d: fh %q stateid %v, want the data server's own", e.Off, c.FH, c.Stateid)
					}
					if c.Auth != nil || c.Version != 4 || c.Minor != 2 || c.WSize != 1<<19 {
						t.Errorf("tightly coupled NFSv4.2 copy: auth %v version %d.%d wsize %d", c.Auth, c.Version, c.Minor, c.WSize)
					}
				}
				got = append(got, g)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Map(%d,%d) =\n %v\nwant\n %v", tc.off, tc.n, got, tc.want)
			}
		})
	}
}

func TestFlexFilesProps(t *testing.T) {
	fl := nfs4.FfLayout4{FflMirrors: []nfs4.FfMirror4{{FfmDataServers: []nfs4.FfDataServer4{ffDS(1, 0)}}},
		FflFlags: nfs4.FF_FLAGS_NO_LAYOUTCOMMIT | nfs4.FF_FLAGS_NO_READ_IO}
	l, err := FlexFiles.DecodeLayout(xdr.Marshal(&fl))
	if err != nil {
		t.Fatal(err)
	}
	want := Props{NoLayoutCommit: true, NoReadIO: true, ErrorReports: true}
	if got := l.Props(); got != want {
		t.Errorf("Props = %+v, want %+v", got, want)
	}
}

// TestFlexFilesLooseCoupling: a loosely coupled data server gets the
// layout's synthetic uid and gid; a non-numeric owner cannot be sent in
// AUTH_SYS and fails the map.
func TestFlexFilesLooseCoupling(t *testing.T) {
	ds := ffDS(1, 0)
	fl := nfs4.FfLayout4{FflMirrors: []nfs4.FfMirror4{{FfmDataServers: []nfs4.FfDataServer4{ds}}}}
	l, err := FlexFiles.DecodeLayout(xdr.Marshal(&fl))
	if err != nil {
		t.Fatal(err)
	}
	d, err := FlexFiles.DecodeDevice(ffDevice(1, false, [2]uint32{3, 0}))
	if err != nil {
		t.Fatal(err)
	}
	dev := func(DeviceID) (Device, bool) { return d, true }
	exts, err := l.Map(nil, 0, 1, dev)
	if err != nil {
		t.Fatal(err)
	}
	c := exts[0].Copies[0]
	if c.Auth == nil || *c.Auth != (AuthSys{1000, 2000}) || c.Version != 3 || c.Stateid != nil {
		t.Errorf("loose NFSv3 copy: auth %v version %d stateid %v", c.Auth, c.Version, c.Stateid)
	}
	ds.FfdsUser = []byte("nobody@example")
	fl.FflMirrors[0].FfmDataServers[0] = ds
	l, _ = FlexFiles.DecodeLayout(xdr.Marshal(&fl))
	if _, err := l.Map(nil, 0, 1, dev); err == nil || !strings.Contains(err.Error(), "not numeric") {
		t.Errorf("non-numeric synthetic owner: %v", err)
	}
}

func TestFlexFilesDeviceVersions(t *testing.T) {
	cases := []struct {
		name     string
		versions [][2]uint32
		want     [2]uint32 // {0,0}: refused
	}{
		{"4.2", [][2]uint32{{4, 2}}, [2]uint32{4, 2}},
		{"first usable in order", [][2]uint32{{4, 1}, {4, 2}}, [2]uint32{4, 1}},
		{"NFSv4 before NFSv3", [][2]uint32{{3, 0}, {4, 1}}, [2]uint32{4, 1}},
		{"NFSv3 alone", [][2]uint32{{3, 0}}, [2]uint32{3, 0}},
		{"4.0 has no sessions", [][2]uint32{{4, 0}}, [2]uint32{}},
		{"none", nil, [2]uint32{}},
		{"unknown version", [][2]uint32{{5, 0}}, [2]uint32{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := FlexFiles.DecodeDevice(ffDevice(7, true, tc.versions...))
			if tc.want == ([2]uint32{}) {
				if err == nil {
					t.Fatalf("accepted: %+v", d)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fd := d.(*flexDevice)
			if got := [2]uint32{fd.version.version, fd.version.minor}; got != tc.want {
				t.Errorf("version %v, want %v", got, tc.want)
			}
			if s := d.Servers(); len(s) != 1 || !reflect.DeepEqual(s[0], []string{"10.0.0.7:2049"}) {
				t.Errorf("Servers = %v", s)
			}
		})
	}
}

func TestFlexFilesLayoutErrors(t *testing.T) {
	one := []nfs4.FfDataServer4{ffDS(1, 0)}
	noFH := ffDS(2, 0)
	noFH.FfdsFhVers = nil
	cases := []struct {
		name string
		body []byte
		want string
	}{
		{"short body", []byte{1, 2}, "flexfiles layout"},
		{"no mirrors", xdr.Marshal(&nfs4.FfLayout4{}), "without mirrors"},
		{"empty mirror", xdr.Marshal(&nfs4.FfLayout4{FflMirrors: []nfs4.FfMirror4{{}}}), "without data servers"},
		{"stripes with unit 0", xdr.Marshal(&nfs4.FfLayout4{FflMirrors: []nfs4.FfMirror4{{FfmDataServers: []nfs4.FfDataServer4{ffDS(1, 0), ffDS(2, 0)}}}}), "stripe unit 0"},
		{"no filehandle", xdr.Marshal(&nfs4.FfLayout4{FflMirrors: []nfs4.FfMirror4{{FfmDataServers: one}, {FfmDataServers: []nfs4.FfDataServer4{noFH}}}}), "without a filehandle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FlexFiles.DecodeLayout(tc.body)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one with %q", err, tc.want)
			}
		})
	}
	l, err := FlexFiles.DecodeLayout(xdr.Marshal(&nfs4.FfLayout4{FflMirrors: []nfs4.FfMirror4{{FfmDataServers: one}}}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Map(nil, 0, 1, func(DeviceID) (Device, bool) { return nil, false }); err == nil || !strings.Contains(err.Error(), ErrNoDevice.Error()) {
		t.Errorf("unresolved device: %v", err)
	}
	if _, err := l.Map(nil, 10, ^uint64(0), devices(t, true, 1)); err == nil {
		t.Error("overflowing range mapped")
	}
	files := filesDevice4(t)
	if _, err := l.Map(nil, 0, 1, func(DeviceID) (Device, bool) { return files, true }); err == nil {
		t.Error("files device accepted by a flexfiles layout")
	}
}

func TestFlexFilesEncodeReturn(t *testing.T) {
	errs := []IOError{{Off: 4096, Len: 8192, Stateid: nfs4.Stateid4{Seqid: 3}, Device: DeviceID{9},
		Status: nfs4.NFS4ERR_NXIO, Op: nfs4.OP_WRITE}}
	var r nfs4.FfLayoutreturn4
	if err := xdr.Unmarshal(FlexFiles.(ReturnEncoder).EncodeReturn(errs), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.FflrIoerrReport) != 1 || len(r.FflrIostatsReport) != 0 {
		t.Fatalf("report %+v", r)
	}
	e := r.FflrIoerrReport[0]
	if e.FfieOffset != 4096 || e.FfieLength != 8192 || e.FfieStateid.Seqid != 3 || len(e.FfieErrors) != 1 ||
		e.FfieErrors[0].DeDeviceid[0] != 9 || e.FfieErrors[0].DeStatus != nfs4.NFS4ERR_NXIO || e.FfieErrors[0].DeOpnum != nfs4.OP_WRITE {
		t.Errorf("report %+v", e)
	}
	var empty nfs4.FfLayoutreturn4
	if err := xdr.Unmarshal(FlexFiles.(ReturnEncoder).EncodeReturn(nil), &empty); err != nil || len(empty.FflrIoerrReport) != 0 {
		t.Errorf("empty report: %+v, %v", empty, err)
	}
}

// FuzzFlexFiles feeds arbitrary bytes to the flexfiles layout and device
// decoders (both take network bytes from the metadata server) and maps
// what decodes: nothing may panic, and every extent a decoded layout maps
// must tile the range and name one copy per mirror.
func FuzzFlexFiles(f *testing.F) {
	f.Add(xdr.Marshal(&nfs4.FfLayout4{FflStripeUnit: 64, FflMirrors: []nfs4.FfMirror4{
		{FfmDataServers: []nfs4.FfDataServer4{ffDS(1, 0), ffDS(2, 0)}}, {FfmDataServers: []nfs4.FfDataServer4{ffDS(3, 5)}}}}),
		ffDevice(1, true, [2]uint32{4, 1}), uint64(100), uint64(300))
	f.Add(xdr.Marshal(&nfs4.FfLayout4{FflMirrors: []nfs4.FfMirror4{{FfmDataServers: []nfs4.FfDataServer4{ffDS(1, 0)}}}}),
		ffDevice(1, false, [2]uint32{3, 0}), uint64(0), uint64(1))
	f.Add([]byte{}, []byte{}, uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, lbody, dbody []byte, off, n uint64) {
		d, derr := FlexFiles.DecodeDevice(dbody)
		l, err := FlexFiles.DecodeLayout(lbody)
		if err != nil || derr != nil {
			return
		}
		n %= 1 << 24 // bound the work: a unit of 1 byte over 16 MiB is 16M extents
		exts, err := l.Map(nil, off, n, func(DeviceID) (Device, bool) { return d, true })
		if err != nil {
			return
		}
		mirrors := len(l.(*flexLayout).mirrors)
		pos := off
		for _, e := range exts {
			if e.Off != pos || e.Len == 0 || len(e.Copies) != mirrors {
				t.Fatalf("extent %d+%d with %d copies at %d (mirrors %d)", e.Off, e.Len, len(e.Copies), pos, mirrors)
			}
			pos += e.Len
		}
		if pos != off+n {
			t.Fatalf("extents end at %d, want %d", pos, off+n)
		}
	})
}
