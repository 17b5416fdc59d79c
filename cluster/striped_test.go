package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"testing"

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
// is on DS (k+ino) mod n, at the file offset, and nowhere else.
func checkPlacement(t *testing.T, tc *testCluster, unit, ino uint64, data []byte, off uint64) (perDS []uint64) {
	t.Helper()
	n := len(tc.agents)
	objs := make([][]byte, n)
	for i := range n {
		_, st := tc.agentAt(i)
		objs[i] = localObject(t, st, ino)
	}
	perDS = make([]uint64, n)
	end := off + uint64(len(data))
	for k := off / unit; k*unit < end; k++ {
		lo, hi := max(k*unit, off), min((k+1)*unit, end)
		want := int((k + ino) % uint64(n))
		perDS[want] += hi - lo
		for i, obj := range objs {
			var got []byte
			if uint64(len(obj)) > lo {
				got = obj[lo:min(hi, uint64(len(obj)))]
			}
			if i == want {
				if !bytes.Equal(got, data[lo-off:hi-off]) {
					t.Fatalf("ino %d unit %d: DS index %d does not hold its data", ino, k, i)
				}
			} else if bytes.ContainsFunc(got, func(r rune) bool { return r != 0 }) {
				t.Fatalf("ino %d unit %d belongs to DS index %d but DS index %d has data there", ino, k, want, i)
			}
		}
	}
	return perDS
}

func TestStripedReadWrite(t *testing.T) {
	tc := newCluster(t, 4)
	const unit = 256 << 10
	s := NewStriped(tc.reg, unit)
	const ino = 7
	const off = 100_003
	data := pattern(10<<20, 1)
	before := make([]AgentStats, 4)
	for i := range 4 {
		a, _ := tc.agentAt(i)
		before[i] = a.Stats()
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

	perDS := checkPlacement(t, tc, unit, ino, data, off)
	var total uint64
	for i := range 4 {
		a, _ := tc.agentAt(i)
		got := a.Stats().WriteBytes - before[i].WriteBytes
		if got != perDS[i] {
			t.Errorf("DS index %d served %d write bytes, want %d", i, got, perDS[i])
		}
		total += got
	}
	if total != uint64(len(data)) {
		t.Errorf("%d bytes written over the cluster, want %d", total, len(data))
	}
}

func TestStripedRotation(t *testing.T) {
	tc := newCluster(t, 4)
	const unit = 4096
	s := NewStriped(tc.reg, unit)
	for ino := uint64(1); ino <= 9; ino++ {
		first, u, n := s.Layout(ino)
		if first != int(ino%4) || u != unit || n != 4 {
			t.Errorf("Layout(%d) = %d, %d, %d", ino, first, u, n)
		}
		data := pattern(10*unit+100, byte(ino))
		writeAll(t, s, ino, data, 0)
		checkPlacement(t, tc, unit, ino, data, 0)
		if got := readAll(t, s, ino, len(data), 0); !bytes.Equal(got, data) {
			t.Errorf("ino %d reads back differently", ino)
		}
	}
	// A huge inode number must not overflow the mapping.
	const big = ^uint64(0) - 2
	data := pattern(6*unit, 3)
	writeAll(t, s, big, data, unit*5)
	checkPlacement(t, tc, unit, big, data, unit*5)
}

func TestStripedTruncateRemove(t *testing.T) {
	tc := newCluster(t, 4)
	const unit = 64 << 10
	s := NewStriped(tc.reg, unit)
	const ino = 11
	writeAll(t, s, ino, pattern(3*unit, 9), 0) // DS index ino+3 mod 4 holds nothing

	for _, size := range []uint64{5000, 10 * unit, 0} {
		if err := s.Truncate(ino, size); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			_, st := tc.agentAt(i)
			if obj := localObject(t, st, ino); uint64(len(obj)) != size || obj == nil {
				t.Errorf("after Truncate(%d): DS index %d object has %d bytes (nil: %v)", size, i, len(obj), obj == nil)
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
	for i := range 4 {
		a, st := tc.agentAt(i)
		if _, err := st.Open(ino, false); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("DS index %d still has the object: %v", i, err)
		}
		// Sync commits where data was written: not on the index that
		// holds nothing.
		wantCommit := i != (ino+3)%4
		if s := a.Stats(); s.RemoveOps == 0 || s.TruncateOps != 3 || (s.CommitOps > 0) != wantCommit {
			t.Errorf("DS index %d stats %+v (want commits: %v)", i, s, wantCommit)
		}
	}
	if err := s.Remove(ino); err != nil {
		t.Errorf("Remove of a removed file: %v", err)
	}
	if got := readAll(t, s, ino, 100, 0); len(got) != 0 {
		t.Errorf("read %d bytes of a removed file", len(got))
	}
}

func TestStripedDownDS(t *testing.T) {
	tc := newCluster(t, 4)
	const unit = 4096
	s := NewStriped(tc.reg, unit)
	a, _ := tc.agentAt(2)
	id := a.cfg.ID
	a.Close()
	tc.nextEvent(Left, id)
	// ino 0: unit 2 is on index 2.
	f, err := s.Open(0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 4*unit), 0); !errors.Is(err, ErrUnavailable) {
		t.Errorf("WriteAt over a down DS: %v", err)
	}
	if _, err := f.WriteAt([]byte("fine"), 0); err != nil {
		t.Errorf("WriteAt to an up DS: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 4*unit), 0); !errors.Is(err, ErrUnavailable) {
		t.Errorf("ReadAt over a down DS: %v", err)
	}
	if err := s.Truncate(0, 0); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Truncate with a down DS: %v", err)
	}
	if _, _, n := s.Layout(0); n != 4 {
		t.Errorf("stripe width %d with one DS down, want 4", n)
	}
}

func TestStripedNoDataServers(t *testing.T) {
	tc := newCluster(t, 0)
	s := NewStriped(tc.reg, 0)
	if _, err := s.Open(1, true); !errors.Is(err, ErrNoDataServers) {
		t.Errorf("Open = %v", err)
	}
	if first, unit, n := s.Layout(5); first != 0 || unit != DefaultStripeUnit || n != 0 {
		t.Errorf("Layout = %d, %d, %d", first, unit, n)
	}
}

func TestStripedUnsupportedAndClosed(t *testing.T) {
	tc := newCluster(t, 2)
	s := NewStriped(tc.reg, 0)
	f, err := s.Open(3, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Allocate(0, 10); !errors.Is(err, store.ErrNotSupported) {
		t.Errorf("Allocate = %v", err)
	}
	if err := f.PunchHole(0, 10); !errors.Is(err, store.ErrNotSupported) {
		t.Errorf("PunchHole = %v", err)
	}
	if _, err := f.WriteAt([]byte("data"), 100); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		off    int64
		whence int
		want   int64
		eof    bool
	}{
		{0, store.SeekData, 0, false},
		{50, store.SeekHole, 104, false},
		{103, store.SeekData, 103, false},
		{104, store.SeekData, 0, true},
		{104, store.SeekHole, 0, true},
	} {
		got, err := f.Seek(tt.off, tt.whence)
		if got != tt.want || errors.Is(err, io.EOF) != tt.eof || (err != nil && !tt.eof) {
			t.Errorf("Seek(%d, %d) = %d, %v", tt.off, tt.whence, got, err)
		}
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
	s := NewStriped(tc.reg, 0)
	f, _ := s.Open(5, true)
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
	if err := f.Sync(); !errors.Is(err, ErrDataLost) {
		t.Errorf("Sync after a DS reboot = %v", err)
	}
	if err := s.Sync(5); err != nil {
		t.Errorf("second Sync = %v", err)
	}
}

func BenchmarkStripedWrite1MiB(b *testing.B) {
	tc := newCluster(b, 4)
	s := NewStriped(tc.reg, DefaultStripeUnit)
	f, err := s.Open(1, true)
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
	s := NewStriped(tc.reg, unit)
	commits := func() []uint64 {
		out := make([]uint64, 3)
		for i := range out {
			a, _ := tc.agentAt(i)
			out[i] = a.Stats().CommitOps
		}
		return out
	}
	write := func(ino uint64, off int64) {
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
	// The stripe index of stripe unit k of ino is (first + k) mod 3.
	first, _, n := s.Layout(7)
	at := func(k int) int { return (first + k) % n }
	for _, tc := range []struct {
		name  string
		units []int64 // stripe units written before the Sync
		want  map[int]uint64
	}{
		{"nothing written", nil, nil},
		{"one stripe unit", []int64{0}, map[int]uint64{at(0): 1}},
		{"same unit twice", []int64{1, 1}, map[int]uint64{at(1): 1}},
		{"two units", []int64{0, 2}, map[int]uint64{at(0): 1, at(2): 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := commits()
			for _, k := range tc.units {
				write(7, k*unit)
			}
			if err := s.Sync(7); err != nil {
				t.Fatal(err)
			}
			after := commits()
			for i := range after {
				if got := after[i] - before[i]; got != tc.want[i] {
					t.Errorf("stripe index %d: %d commits, want %d", i, got, tc.want[i])
				}
			}
		})
	}
	// A second Sync with nothing written since commits nothing.
	write(7, 0)
	if err := s.Sync(7); err != nil {
		t.Fatal(err)
	}
	before := commits()
	if err := s.Sync(7); err != nil {
		t.Fatal(err)
	}
	if after := commits(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("Sync with nothing written: commits %v -> %v", before, after)
	}
	// A data server that holds nothing of the file is down: the file's
	// commit does not need it.
	down, _ := tc.agentAt(at(1))
	down.Close()
	write(7, 0)
	if err := s.Sync(7); err != nil {
		t.Errorf("Sync of a file with no data on the closed data server: %v", err)
	}
}
