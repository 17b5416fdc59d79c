package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// localObject returns the whole object ino on a DS's local store (nil if
// it does not exist).
func localObject(t *testing.T, st store.Backend, ino uint64) []byte {
	t.Helper()
	f, err := st.Open(ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	if n, err := f.ReadAt(b, 0); n != len(b) && !errors.Is(err, io.EOF) {
		t.Fatalf("local ReadAt: %d, %v", n, err)
	}
	return b
}

// checkPlacement verifies that every stripe unit of data written at off
// is on the data server its stripe map names for it (unit k on
// DataServers[(First+k) mod n]), at the file offset, and on no other data
// server of tc. It returns the bytes each data server holds.
func checkPlacement(t *testing.T, tc *testCluster, s *Striped, ino uint64, data []byte, off uint64) (perDS map[string]uint64) {
	t.Helper()
	m := stripeMap(t, s, ino)
	objs := map[string][]byte{}
	for j, a := range tc.agents {
		objs[a.ID()] = localObject(t, tc.stores[j], ino)
	}
	perDS = map[string]uint64{}
	end := off + uint64(len(data))
	n := uint64(len(m.DataServers))
	for k := off / m.Unit; k*m.Unit < end; k++ {
		lo, hi := max(k*m.Unit, off), min((k+1)*m.Unit, end)
		want := m.DataServers[(k+uint64(m.First))%n]
		perDS[want] += hi - lo
		for id, obj := range objs {
			var got []byte
			if uint64(len(obj)) > lo {
				got = obj[lo:min(hi, uint64(len(obj)))]
			}
			if id == want {
				if !bytes.Equal(got, data[lo-off:hi-off]) {
					t.Fatalf("ino %d unit %d: data server %s does not hold its data", ino, k, id)
				}
			} else if bytes.ContainsFunc(got, func(r rune) bool { return r != 0 }) {
				t.Fatalf("ino %d unit %d belongs to data server %s but %s has data there", ino, k, want, id)
			}
		}
	}
	return perDS
}

func TestStripedReadWrite(t *testing.T) {
	tc := newCluster(t, 4)
	const unit = 256 << 10
	s := tc.striped(unit)
	ino := tc.newFile()
	const off = 100_003
	data := pattern(10<<20, 1)
	before := map[string]AgentStats{}
	for _, a := range tc.agents {
		before[a.ID()] = a.Stats()
	}
	writeAll(t, s, ino, data, off)

	f, err := s.Open(ino, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil || size != off+int64(len(data)) {
		t.Fatalf("Size = %d, %v; want %d", size, err, off+len(data))
	}
	end := int64(off + len(data))
	for _, tt := range []struct {
		name    string
		off     int64
		n       int
		wantN   int
		wantEOF bool
	}{
		{"all", off, len(data), len(data), false},
		{"hole before data", 0, 1000, 1000, false},
		{"hole into data", 50_000, 200_000, 200_000, false},
		{"inside one unit", unit + 10, 1000, 1000, false},
		{"across units", 3*unit - 5, 2*unit + 10, 2*unit + 10, false},
		{"unaligned large", 777_777, 5 << 20, 5 << 20, false},
		{"tail past eof", end - 1234, 10_000, 1234, true},
		{"at eof", end, 10, 0, true},
		{"past eof", end + unit*5, 10, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			buf := bytes.Repeat([]byte{0xEE}, tt.n)
			n, err := f.ReadAt(buf, tt.off)
			if n != tt.wantN || errors.Is(err, io.EOF) != tt.wantEOF || (err != nil && !errors.Is(err, io.EOF)) {
				t.Fatalf("ReadAt(%d, %d) = %d, %v; want %d, eof %v", tt.n, tt.off, n, err, tt.wantN, tt.wantEOF)
			}
			for i := range n {
				pos := tt.off + int64(i)
				var want byte
				if pos >= off && pos < end {
					want = data[pos-off]
				}
				if buf[i] != want {
					t.Fatalf("byte at %d = %#x, want %#x", pos, buf[i], want)
				}
			}
		})
	}

	perDS := checkPlacement(t, tc, s, ino, data, off)
	var total uint64
	for _, a := range tc.agents {
		got := a.Stats().WriteBytes - before[a.ID()].WriteBytes
		if got != perDS[a.ID()] {
			t.Errorf("data server %s served %d write bytes, want %d", a.ID(), got, perDS[a.ID()])
		}
		total += got
	}
	if total != uint64(len(data)) {
		t.Errorf("%d bytes written over the cluster, want %d", total, len(data))
	}
}

// TestStripedRotation: files are placed over the data servers in
// Placement, their first stripe unit rotating with the inode number so
// that small files spread; their layouts share one device.
func TestStripedRotation(t *testing.T) {
	tc := newCluster(t, 4)
	const unit = 4096
	s := tc.striped(unit)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	var device [16]byte
	for i := range 9 {
		ino := tc.newFile()
		l, err := s.Layout(ctx, ino)
		if err != nil || l.First != uint32(ino%4) || l.Unit != unit || l.Count != 4 {
			t.Errorf("Layout(%d) = %+v, %v", ino, l, err)
		}
		if i == 0 {
			device = l.Device
		} else if l.Device != device {
			t.Errorf("Layout(%d) has device %x, the others %x", ino, l.Device, device)
		}
		m := stripeMap(t, s, ino)
		if !slices.Equal(m.DataServers, tc.reg.Placement()) || m.First != l.First || m.Unit != unit || m.Gen != 1 {
			t.Errorf("map of ino %d = %+v", ino, m)
		}
		data := pattern(10*unit+100, byte(ino))
		writeAll(t, s, ino, data, 0)
		checkPlacement(t, tc, s, ino, data, 0)
		if got := readAll(t, s, ino, len(data), 0); !bytes.Equal(got, data) {
			t.Errorf("ino %d reads back differently", ino)
		}
	}
	addrs, ok := s.Device(device)
	if !ok || len(addrs) != 4 {
		t.Fatalf("Device = %v, %v", addrs, ok)
	}
	for i, a := range addrs {
		if !slices.Equal(a, []string{"127.0.0.1:2049"}) {
			t.Errorf("device data server %d at %v", i, a)
		}
	}
	if devs := s.Devices(); len(devs) != 1 || devs[0] != device {
		t.Errorf("Devices = %x, want [%x]", devs, device)
	}
	// The highest offset a file may have maps without overflowing.
	for _, tt := range []struct {
		m    meta.StripeMap
		off  uint64
		want string
	}{
		{meta.StripeMap{Unit: 1, First: 2, DataServers: []string{"a", "b", "c"}}, 1<<63 - 1, []string{"a", "b", "c"}[((1<<63-1)%3+2)%3]},
		{meta.StripeMap{Unit: 1, First: 1023, DataServers: make1024()}, 1<<63 - 1, make1024()[((1<<63-1)%1024+1023)%1024]},
		{meta.StripeMap{Unit: 1 << 20, First: 1, DataServers: []string{"a", "b"}}, 1<<63 - 1, []string{"a", "b"}[((1<<63-1)>>20+1)%2]},
	} {
		if got := dsFor(tt.m, tt.off); got != tt.want {
			t.Errorf("dsFor(%+v, %d) = %s, want %s", tt.m, tt.off, got, tt.want)
		}
	}
}

func make1024() []string {
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprint("ds", i)
	}
	return ids
}

func TestStripedTruncateRemove(t *testing.T) {
	tc := newCluster(t, 4)
	const unit = 64 << 10
	s := tc.striped(unit)
	ino := tc.newFile()
	writeAll(t, s, ino, pattern(3*unit, 9), 0)
	m := stripeMap(t, s, ino)
	empty := m.DataServers[(m.First+3)%4] // holds no stripe unit of the 3 written

	for _, size := range []uint64{5000, 10 * unit, 0} {
		if err := s.Truncate(ino, size); err != nil {
			t.Fatal(err)
		}
		for j, a := range tc.agents {
			if obj := localObject(t, tc.stores[j], ino); uint64(len(obj)) != size || obj == nil {
				t.Errorf("after Truncate(%d): data server %s object has %d bytes (nil: %v)", size, a.ID(), len(obj), obj == nil)
			}
		}
		f, _ := s.Open(ino, false)
		if got, err := f.Size(); err != nil || uint64(got) != size {
			t.Errorf("Size after Truncate(%d) = %d, %v", size, got, err)
		}
		f.Close()
	}
	if err := s.Sync(ino); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ino); err != nil {
		t.Fatal(err)
	}
	for j, a := range tc.agents {
		if _, err := tc.stores[j].Open(ino, false); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("data server %s still has the object: %v", a.ID(), err)
		}
		// Sync commits where data was written: not on the data server
		// that holds nothing.
		wantCommit := a.ID() != empty
		if s := a.Stats(); s.RemoveOps == 0 || s.TruncateOps != 3 || (s.CommitOps > 0) != wantCommit {
			t.Errorf("data server %s stats %+v (want commits: %v)", a.ID(), s, wantCommit)
		}
	}
	if err := s.Remove(ino); err != nil {
		t.Errorf("Remove of a removed file: %v", err)
	}
	if got := readAll(t, s, ino, 100, 0); len(got) != 0 {
		t.Errorf("read %d bytes of a removed file", len(got))
	}
	// A file whose data was never placed has nothing to truncate, sync or
	// remove, and no data server is asked.
	never := tc.newFile()
	ops := func() (n uint64) {
		for _, a := range tc.agents {
			st := a.Stats()
			n += st.TruncateOps + st.RemoveOps + st.CommitOps + st.GetSizeOps + st.ReadOps
		}
		return n
	}
	before := ops()
	for name, err := range map[string]error{
		"Truncate": s.Truncate(never, 100), "Sync": s.Sync(never), "Remove": s.Remove(never),
	} {
		if err != nil {
			t.Errorf("%s of a file never placed: %v", name, err)
		}
	}
	if got := readAll(t, s, never, 100, 0); len(got) != 0 {
		t.Errorf("read %d bytes of a file never placed", len(got))
	}
	if after := ops(); after != before {
		t.Errorf("%d object calls for a file never placed", after-before)
	}
	if _, ok, err := s.Map(context.Background(), never); ok || err != nil {
		t.Errorf("file never written has a map: %v, %v", ok, err)
	}
}

// TestStripedDownDS: with a data server of a file's map out of service,
// I/O that needs it is to be retried (pnfs.ErrUnavailable) for DownAfter, and
// fails (pnfs.ErrDataServerDown, naming it) afterwards; I/O on the file's
// other data servers goes on, the file gets no layout, and files placed
// meanwhile are striped over the data servers in service only.
func TestStripedDownDS(t *testing.T) {
	clock := &testClock{}
	tc := newClusterWith(t, 4, &testCluster{clock: clock})
	const unit = 4096
	s := tc.striped(unit)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	ino := tc.newFile()
	writeAll(t, s, ino, pattern(8*unit, 3), 0)
	m := stripeMap(t, s, ino)
	down := m.DataServers[(m.First+2)%4] // holds unit 2
	a, _ := tc.agent(down)
	a.Close()
	tc.nextEvent(Left, down)

	f, err := s.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tt := range []struct {
		name    string
		advance time.Duration // the clock, since the previous case
		want    error
	}{
		{"just down", 0, pnfs.ErrUnavailable},
		{"within DownAfter", DefaultDownAfter - time.Second, pnfs.ErrUnavailable},
		{"past DownAfter", 2 * time.Second, pnfs.ErrDataServerDown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock.advance(tt.advance)
			check := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, tt.want) {
					t.Errorf("%s: %v, want %v", op, err, tt.want)
				}
				if tt.want == pnfs.ErrUnavailable && errors.Is(err, pnfs.ErrDataServerDown) {
					t.Errorf("%s: %v: down before DownAfter", op, err)
				}
				var de *DownError
				if tt.want == pnfs.ErrDataServerDown && (!errors.As(err, &de) || de.ID != down) {
					t.Errorf("%s: %v does not name data server %s", op, err, down)
				}
			}
			_, err := f.WriteAt(make([]byte, 4*unit), 0)
			check("WriteAt over the down DS", err)
			_, err = f.ReadAt(make([]byte, 4*unit), 0)
			check("ReadAt over the down DS", err)
			check("Truncate", s.Truncate(ino, 8*unit)) // to its size: the DSes in service keep their data
			_, err = s.Layout(ctx, ino)
			check("Layout", err)
			// The units on data servers in service are still served.
			if _, err := f.WriteAt([]byte("fine"), 0); err != nil {
				t.Errorf("WriteAt to an up DS: %v", err)
			}
			if n, err := f.ReadAt(make([]byte, unit), unit); n != unit || err != nil {
				t.Errorf("ReadAt from an up DS: %d, %v", n, err)
			}
		})
	}
	// A file placed now avoids the down data server.
	ino2 := tc.newFile()
	data := pattern(8*unit, 4)
	writeAll(t, s, ino2, data, 0)
	m2 := stripeMap(t, s, ino2)
	if len(m2.DataServers) != 3 || m2.Holds(down) {
		t.Errorf("file placed with %s down: map %+v", down, m2)
	}
	if l, err := s.Layout(ctx, ino2); err != nil || l.Count != 3 {
		t.Errorf("Layout of a file placed with %s down: %+v, %v", down, l, err)
	}
	if got := readAll(t, s, ino2, len(data), 0); !bytes.Equal(got, data) {
		t.Error("file placed with a data server down reads back differently")
	}
}

// TestStripedNoDataServers: a file can be opened, and read as empty,
// before any data server registered, but its data cannot be placed.
func TestStripedNoDataServers(t *testing.T) {
	tc := newCluster(t, 0)
	s := tc.striped(0)
	ino := tc.newFile()
	f, err := s.Open(ino, true)
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, pnfs.ErrNoDataServers) {
		t.Errorf("WriteAt = %v", err)
	}
	if n, err := f.ReadAt(make([]byte, 10), 0); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("ReadAt = %d, %v", n, err)
	}
	if size, err := f.Size(); size != 0 || err != nil {
		t.Errorf("Size = %d, %v", size, err)
	}
	if l, err := s.Layout(context.Background(), ino); !errors.Is(err, pnfs.ErrNoDataServers) {
		t.Errorf("Layout = %+v, %v", l, err)
	}
	if _, ok, err := s.Map(context.Background(), ino); ok || err != nil {
		t.Errorf("Map after failed placements: %v, %v", ok, err)
	}
	if s.StripeUnit() != DefaultStripeUnit {
		t.Errorf("StripeUnit = %d", s.StripeUnit())
	}
}

// TestStripedSpace: Allocate, PunchHole and Seek of a striped file act on
// the data servers' objects, one position's units at a time, as they
// would on one local file.
func TestStripedSpace(t *testing.T) {
	tc := newCluster(t, 2)
	const u = 64 << 10
	s := tc.striped(u)
	f, err := s.Open(tc.newFile(), true)
	if err != nil {
		t.Fatal(err)
	}
	// A file without data: nothing to find, nothing to punch.
	for _, whence := range []int{store.SeekData, store.SeekHole} {
		if _, err := f.Seek(0, whence); !errors.Is(err, io.EOF) {
			t.Errorf("Seek(0, %d) of a file without data = %v, want io.EOF", whence, err)
		}
	}
	if err := f.PunchHole(0, 10); err != nil {
		t.Errorf("PunchHole of a file without data = %v", err)
	}
	x := bytes.Repeat([]byte{'x'}, 4096)
	for _, off := range []int64{0, 3 * u} { // units 0 and 3: one on each data server
		if _, err := f.WriteAt(x, off); err != nil {
			t.Fatal(err)
		}
	}
	type seekCase struct {
		off    int64
		whence int
		want   int64
		eof    bool
	}
	seeks := func(when string, cases []seekCase) {
		t.Helper()
		for _, tt := range cases {
			got, err := f.Seek(tt.off, tt.whence)
			if got != tt.want || errors.Is(err, io.EOF) != tt.eof || (err != nil && !tt.eof) {
				t.Errorf("%s: Seek(%d, %d) = %d, %v; want %d eof %v", when, tt.off, tt.whence, got, err, tt.want, tt.eof)
			}
		}
	}
	seeks("after writes", []seekCase{
		{0, store.SeekData, 0, false},
		{0, store.SeekHole, 4096, false},
		{4096, store.SeekData, 3 * u, false},
		{u, store.SeekData, 3 * u, false},
		{3 * u, store.SeekHole, 3*u + 4096, false},
		{3*u + 4096, store.SeekData, 0, true},
		{3*u + 4096, store.SeekHole, 3*u + 4096, false},
	})
	if err := f.PunchHole(0, 2*u); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Errorf("after PunchHole: %v, %q...", err, got[:8])
	}
	seeks("after PunchHole", []seekCase{
		{0, store.SeekData, 3 * u, false},
		{0, store.SeekHole, 0, false},
	})
	if err := f.Allocate(5*u, u); err != nil {
		t.Fatal(err)
	}
	if n, err := f.Size(); n != 6*u || err != nil {
		t.Errorf("Size after Allocate to %d = %d, %v", 6*u, n, err)
	}
	if _, err := f.ReadAt(got, 5*u); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Errorf("allocated range: %v, %q...", err, got[:8])
	}
	if err := f.Allocate(0, 0); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Allocate of nothing = %v", err)
	}
	if _, err := f.Seek(0, 7); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Seek whence 7 = %v", err)
	}
	// A data server whose object ends where its unit does has no hole
	// there: the next unit is another's, with data.
	g, err := s.Open(tc.newFile(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.WriteAt(bytes.Repeat([]byte{'y'}, u+4096), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := g.Seek(0, store.SeekHole); got != u+4096 || err != nil {
		t.Errorf("Seek(0, SeekHole) over a whole unit and a part of the next = %d, %v; want %d", got, err, u+4096)
	}
	f.Close()
	f.Close()
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, store.ErrClosed) {
		t.Errorf("WriteAt after Close = %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, store.ErrClosed) {
		t.Errorf("ReadAt after Close = %v", err)
	}
}

func TestStripedDataLost(t *testing.T) {
	tc := newCluster(t, 1)
	s := tc.striped(0)
	ino := tc.newFile()
	f, _ := s.Open(ino, true)
	defer f.Close()
	if _, err := f.WriteAt([]byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	// Simulate a DS reboot between the write and the commit: the write
	// saw another boot verifier than the commit will.
	s.mu.Lock()
	v := s.verf[tc.agents[0].cfg.ID]
	v[0] ^= 0xff
	s.verf[tc.agents[0].cfg.ID] = v
	s.mu.Unlock()
	if err := f.Sync(); !errors.Is(err, pnfs.ErrDataLost) {
		t.Errorf("Sync after a DS reboot = %v", err)
	}
	if err := s.Sync(ino); err != nil {
		t.Errorf("second Sync = %v", err)
	}
}

func BenchmarkStripedWrite1MiB(b *testing.B) {
	tc := newCluster(b, 4)
	s := tc.striped(DefaultStripeUnit)
	f, err := s.Open(tc.newFile(), true)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	data := pattern(1<<20, 1)
	b.SetBytes(int64(len(data)))
	for i := 0; b.Loop(); i++ {
		// Unaligned, so most writes touch two DSes.
		if _, err := f.WriteAt(data, int64(i%64)*(1<<20)+4096); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStripedSyncCommitsWritten: Sync commits on the data servers that hold
// UNSTABLE writes of the file and no others, so a small file costs one
// OBJ_COMMIT, not one per data server, and a data server that is down
// does not hold up the commit of a file with no data on it.
func TestStripedSyncCommitsWritten(t *testing.T) {
	const unit = 64 << 10
	tc := newCluster(t, 3)
	s := tc.striped(unit)
	commits := func() map[string]uint64 {
		out := map[string]uint64{}
		for _, a := range tc.agents {
			out[a.ID()] = a.Stats().CommitOps
		}
		return out
	}
	ino := tc.newFile()
	write := func(off int64) {
		t.Helper()
		f, err := s.Open(ino, true)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte("small"), off); err != nil {
			t.Fatal(err)
		}
	}
	// Stripe unit k of ino is on DataServers[(First + k) mod 3].
	if _, err := s.Place(context.Background(), ino); err != nil {
		t.Fatal(err)
	}
	m := stripeMap(t, s, ino)
	at := func(k int) string { return dsFor(m, uint64(k)*unit) }
	for _, tc := range []struct {
		name  string
		units []int64 // stripe units written before the Sync
		want  map[string]uint64
	}{
		{"nothing written", nil, nil},
		{"one stripe unit", []int64{0}, map[string]uint64{at(0): 1}},
		{"same unit twice", []int64{1, 1}, map[string]uint64{at(1): 1}},
		{"two units", []int64{0, 2}, map[string]uint64{at(0): 1, at(2): 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := commits()
			for _, k := range tc.units {
				write(k * unit)
			}
			if err := s.Sync(ino); err != nil {
				t.Fatal(err)
			}
			after := commits()
			for id := range after {
				if got := after[id] - before[id]; got != tc.want[id] {
					t.Errorf("data server %s: %d commits, want %d", id, got, tc.want[id])
				}
			}
		})
	}
	// A second Sync with nothing written since commits nothing.
	write(0)
	if err := s.Sync(ino); err != nil {
		t.Fatal(err)
	}
	before := commits()
	if err := s.Sync(ino); err != nil {
		t.Fatal(err)
	}
	if after := commits(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("Sync with nothing written: commits %v -> %v", before, after)
	}
	// A data server that holds nothing of the file is down: the file's
	// commit does not need it.
	down, _ := tc.agent(at(1))
	down.Close()
	write(0)
	if err := s.Sync(ino); err != nil {
		t.Errorf("Sync of a file with no data on the closed data server: %v", err)
	}
}
