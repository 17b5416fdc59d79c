package meta

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// crash closes the files as a killed process would: no checkpoint, no
// removal of the log.
func (s *walKV) crash() {
	s.mu.Lock()
	s.closed = true
	for s.running {
		s.idle.Wait()
	}
	s.mu.Unlock()
	s.stopSyncs()
	if s.ckptDone != nil {
		<-s.ckptDone
	}
	s.releaseSpare()
	s.wal.f.Close()
	s.db.Close()
}

// walTestStore is one database directory opened and reopened by a test.
type walTestStore struct {
	t    *testing.T
	path string
	opts BoltOptions
	kv   *walKV
}

func newWALTestStore(t *testing.T, opts BoltOptions) *walTestStore {
	t.Helper()
	opts.WAL = true
	s := &walTestStore{t: t, path: filepath.Join(t.TempDir(), "kv.db"), opts: opts}
	s.open(nil)
	t.Cleanup(func() {
		if s.kv != nil {
			s.kv.crash()
		}
	})
	return s
}

func (s *walTestStore) open(hook func(string) error) {
	s.t.Helper()
	kv, err := openWALKV(s.path, s.opts, hook)
	if err != nil {
		s.t.Fatal(err)
	}
	s.kv = kv
}

func (s *walTestStore) openErr() error {
	kv, err := openWALKV(s.path, s.opts, nil)
	if err == nil {
		kv.crash()
	}
	return err
}

// crash drops the store as kill -9 would: no checkpoint, no log removal.
func (s *walTestStore) crash() {
	s.kv.crash()
	s.kv = nil
}

func (s *walTestStore) put(kvs ...string) error {
	return s.kv.Update(func(tx kvTxn) error {
		for i := 0; i+1 < len(kvs); i += 2 {
			var err error
			if kvs[i+1] == "-" {
				err = tx.Delete([]byte(kvs[i]))
			} else {
				err = tx.Put([]byte(kvs[i]), []byte(kvs[i+1]))
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *walTestStore) mustPut(kvs ...string) {
	s.t.Helper()
	if err := s.put(kvs...); err != nil {
		s.t.Fatal(err)
	}
}

// dump lists every key=value of a prefix scan, and checks that Get agrees.
func (s *walTestStore) dump() string {
	s.t.Helper()
	var out []string
	err := s.kv.View(func(tx kvTxn) error {
		return tx.Scan(nil, nil, func(k, v []byte) bool {
			if g, _ := tx.Get(k); !bytes.Equal(g, v) {
				s.t.Errorf("Get(%q) = %q, scan says %q", k, g, v)
			}
			out = append(out, string(k)+"="+abbrev(v))
			return true
		})
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.Join(out, " ")
}

func abbrev(v []byte) string {
	if len(v) > 16 {
		return fmt.Sprintf("%s..(%d)", v[:8], len(v))
	}
	return string(v)
}

func (s *walTestStore) walFiles() []uint64 {
	s.t.Helper()
	gens, err := listWALFiles(s.path)
	if err != nil {
		s.t.Fatal(err)
	}
	return gens
}

// recordOffsets returns the offsets of the records in log file gen.
func (s *walTestStore) recordOffsets(gen uint64) []int {
	s.t.Helper()
	data, err := os.ReadFile(walFileName(s.path, gen))
	if err != nil {
		s.t.Fatal(err)
	}
	var offs []int
	for off := walHeaderLen; ; {
		_, n, err := decodeWALRecord(data[off:])
		if err != nil {
			return offs
		}
		offs = append(offs, off)
		off += n
	}
}

func (s *walTestStore) patch(gen uint64, off int, b []byte) {
	s.t.Helper()
	f, err := os.OpenFile(walFileName(s.path, gen), os.O_WRONLY, 0)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, int64(off)); err != nil {
		s.t.Fatal(err)
	}
}

// TestWALRecovery damages the log of a crashed store in the ways a crash
// or a bad disk would and checks what reopening makes of it: a damaged
// last record is a torn append (its callers were never answered) and is
// dropped; damage followed by a valid record is an error.
func TestWALRecovery(t *testing.T) {
	for _, tc := range []struct {
		name string
		// damage gets the offsets of the three records a b c.
		damage  func(s *walTestStore, gen uint64, offs []int)
		want    string
		wantErr string
	}{
		{name: "intact", damage: func(*walTestStore, uint64, []int) {}, want: "a=1 b=2 c=3"},
		{name: "torn payload of last", damage: func(s *walTestStore, g uint64, o []int) {
			s.patch(g, o[2]+walRecHdrLen, []byte{0, 0})
		}, want: "a=1 b=2"},
		{name: "torn length of last", damage: func(s *walTestStore, g uint64, o []int) {
			s.patch(g, o[2], []byte{0xff, 0xff, 0xff, 0x7f})
		}, want: "a=1 b=2"},
		{name: "last record never written", damage: func(s *walTestStore, g uint64, o []int) {
			s.patch(g, o[2], make([]byte, 40))
		}, want: "a=1 b=2"},
		{name: "corrupt middle record", damage: func(s *walTestStore, g uint64, o []int) {
			s.patch(g, o[1]+walRecHdrLen+2, []byte{'X'})
		}, wantErr: "followed by valid record"},
		{name: "zeroed middle record", damage: func(s *walTestStore, g uint64, o []int) {
			s.patch(g, o[1], make([]byte, walRecHdrLen))
		}, wantErr: "followed by valid record"},
		{name: "corrupt first record", damage: func(s *walTestStore, g uint64, o []int) {
			s.patch(g, o[0]+4, []byte{1, 2, 3, 4})
		}, wantErr: "followed by valid record"},
		{name: "bad file header", damage: func(s *walTestStore, g uint64, o []int) {
			s.patch(g, 0, []byte("notAWAL!"))
		}, wantErr: "bad header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newWALTestStore(t, BoltOptions{})
			s.mustPut("a", "1")
			s.mustPut("b", "2")
			s.mustPut("c", "3")
			gens := s.walFiles()
			s.crash()
			if len(gens) != 1 {
				t.Fatalf("log files %v, want one", gens)
			}
			offs := s.recordOffsets(gens[0])
			if len(offs) != 3 {
				t.Fatalf("%d records, want 3", len(offs))
			}
			tc.damage(s, gens[0], offs)
			if tc.wantErr != "" {
				err := s.openErr()
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("open: %v, want error containing %q", err, tc.wantErr)
				}
				return
			}
			s.open(nil)
			if got := s.dump(); got != tc.want {
				t.Fatalf("after recovery: %s, want %s", got, tc.want)
			}
			// The recovered store goes on from there and survives
			// another crash.
			s.mustPut("d", "4", "a", "-")
			s.crash()
			s.open(nil)
			if got, want := s.dump(), strings.TrimPrefix(tc.want, "a=1 ")+" d=4"; got != want {
				t.Fatalf("after second recovery: %s, want %s", got, want)
			}
		})
	}
}

// TestWALReplayIdempotent replays a log into a database that already holds
// it, as happens after a crash between a checkpoint's bbolt commit and the
// removal of the log file.
func TestWALReplayIdempotent(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{})
	s.mustPut("a", "1", "b", "2", "c", "3")
	s.mustPut("b", "-", "c", "33", "d", "4")
	want := "a=1 c=33 d=4"
	gen := s.walFiles()[0]
	s.crash()
	saved, err := os.ReadFile(walFileName(s.path, gen))
	if err != nil {
		t.Fatal(err)
	}
	s.open(nil) // applies the log to bbolt and removes it
	s.crash()
	if err := os.WriteFile(walFileName(s.path, gen), saved, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		s.open(nil)
		if got := s.dump(); got != want {
			t.Fatalf("after replaying twice: %s, want %s", got, want)
		}
		s.crash()
	}
	s.open(nil)
}

var errStop = errors.New("injected stop")

// TestWALCheckpointInterrupted stops a checkpoint after each of its steps,
// as a crash there would, and checks that reopening finds every
// acknowledged change (puts, overwrites and deletes).
func TestWALCheckpointInterrupted(t *testing.T) {
	for _, step := range []string{"created", "applied", "removed", "none"} {
		t.Run(step, func(t *testing.T) {
			s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 2 << 10})
			s.crash()
			stopped := make(chan struct{})
			var once sync.Once
			s.open(func(got string) error {
				if got != step {
					return nil
				}
				once.Do(func() { close(stopped) })
				return errStop
			})
			model := map[string]string{}
			acked := 0
			for i := range 200 {
				k, v := fmt.Sprintf("k%03d", i%70), fmt.Sprintf("v%d", i)
				if i%7 == 3 {
					v = "-"
				}
				if err := s.put(k, v); err != nil {
					if !errors.Is(err, errStop) {
						t.Fatalf("put %d: %v", i, err)
					}
					continue
				}
				acked++
				if v == "-" {
					delete(model, k)
				} else {
					model[k] = v
				}
			}
			if step != "none" {
				select {
				case <-stopped:
				default:
					t.Fatalf("checkpoint never reached step %q", step)
				}
			}
			s.crash()
			s.open(nil)
			var want []string
			for k, v := range model {
				want = append(want, k+"="+v)
			}
			slices.Sort(want)
			if got := s.dump(); got != strings.Join(want, " ") {
				t.Fatalf("%d acknowledged puts; after reopening:\n got %s\nwant %s", acked, got, strings.Join(want, " "))
			}
			if gens := s.walFiles(); len(gens) != 1 {
				t.Fatalf("log files after recovery: %v, want one", gens)
			}
		})
	}
}

// TestWALLargeValues writes extended-attribute-sized values (256 KiB)
// through the log, across checkpoints and a crash.
func TestWALLargeValues(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 1 << 20})
	val := func(i int) string { return strings.Repeat(string(rune('a'+i%26)), MaxXattrBytes) }
	var wg sync.WaitGroup
	errs := make([]error, 12)
	for i := range errs {
		wg.Go(func() { errs[i] = s.put(fmt.Sprintf("x%02d", i), val(i)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		err := s.kv.View(func(tx kvTxn) error {
			for i := range errs {
				v, _ := tx.Get([]byte(fmt.Sprintf("x%02d", i)))
				if string(v) != val(i) {
					return fmt.Errorf("x%02d: %d bytes", i, len(v))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	check("before crash")
	s.crash()
	s.open(nil)
	check("after crash")
	if err := s.kv.Close(); err != nil {
		t.Fatal(err)
	}
	s.open(nil)
	check("after close")
}

// TestWALScanLayers scans keys spread over bbolt, the frozen and active
// overlay layers and a round's own writes, with tombstones in each.
func TestWALScanLayers(t *testing.T) {
	// Each layer, oldest first: key=value, or key=- for a tombstone.
	layers := []string{
		"a=bolt b1=bolt b2=bolt b4=bolt c=bolt", // bbolt
		"b2=frozen b3=frozen b4=- b6=frozen",    // frozen
		"b1=- b3=active b5=active b7=active",    // active
		"b5=- b6=buf b8=buf",                    // the transaction's writes
	}
	s := newWALTestStore(t, BoltOptions{NoSync: true})
	trees := make([]*ovTree, 3)
	for i, l := range layers {
		if i == 0 {
			err := s.kv.db.Update(func(tx *bolt.Tx) error {
				for _, kv := range strings.Fields(l) {
					k, v, _ := strings.Cut(kv, "=")
					if err := tx.Bucket(bucketName).Put([]byte(k), []byte(v)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		trees[i-1] = newOvTree()
		for _, kv := range strings.Fields(l) {
			k, v, _ := strings.Cut(kv, "=")
			trees[i-1].ReplaceOrInsert(&ovEntry{key: []byte(k), val: []byte(v), del: v == "-"})
		}
	}
	s.kv.stateMu.Lock()
	s.kv.frozen, s.kv.active = trees[0], trees[1]
	s.kv.stateMu.Unlock()
	for _, tc := range []struct {
		prefix, start string
		limit         int
		withBuf       bool
		want          string
	}{
		{"", "", 100, false, "a=bolt b2=frozen b3=active b5=active b6=frozen b7=active c=bolt"},
		{"", "", 100, true, "a=bolt b2=frozen b3=active b6=buf b7=active b8=buf c=bolt"},
		{"b", "", 100, true, "b2=frozen b3=active b6=buf b7=active b8=buf"},
		{"b", "b4", 100, true, "b6=buf b7=active b8=buf"},
		{"b", "b3", 2, false, "b3=active b5=active"},
		{"b", "a", 100, false, "b2=frozen b3=active b5=active b6=frozen b7=active"},
		{"b", "b9", 100, true, ""},
		{"b1", "", 100, true, ""},
		{"b6", "", 100, false, "b6=frozen"},
		{"d", "", 100, true, ""},
	} {
		sn, err := s.kv.snapshot()
		if err != nil {
			t.Fatal(err)
		}
		tx := &walTxn{snap: sn}
		if tc.withBuf {
			tx.buf = trees[2]
		}
		var got []string
		err = tx.Scan([]byte(tc.prefix), []byte(tc.start), func(k, v []byte) bool {
			if g, _ := tx.Get(k); !bytes.Equal(g, v) {
				t.Errorf("Get(%q) = %q, scan says %q", k, g, v)
			}
			got = append(got, string(k)+"="+string(v))
			return len(got) < tc.limit
		})
		sn.tx.Rollback()
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("scan(%q, %q, limit %d, buf %v) = %q %v, want %q", tc.prefix, tc.start, tc.limit, tc.withBuf, strings.Join(got, " "), err, tc.want)
		}
	}
}

// TestWALScanChunks scans an overlay larger than a chunk of ovIter, mixed
// with bbolt keys, so that the merge resumes chunks in the middle.
func TestWALScanChunks(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{NoSync: true, WALCheckpointBytes: 8 << 10})
	const n = 1000
	for i := 0; i < n; i += 10 {
		var kvs []string
		for j := i; j < i+10; j++ {
			kvs = append(kvs, fmt.Sprintf("k%04d", j), fmt.Sprint(j))
		}
		s.mustPut(kvs...)
	}
	for i := 0; i < n; i += 3 {
		s.mustPut(fmt.Sprintf("k%04d", i), "-")
	}
	got := 0
	err := s.kv.View(func(tx kvTxn) error {
		var last []byte
		return tx.Scan([]byte("k"), []byte("k0100"), func(k, v []byte) bool {
			if bytes.Compare(k, last) <= 0 {
				t.Fatalf("%s after %s", k, last)
			}
			last = bytes.Clone(k)
			var i int
			fmt.Sscanf(string(k), "k%04d", &i)
			if i%3 == 0 || string(v) != fmt.Sprint(i) {
				t.Fatalf("%s=%s", k, v)
			}
			got++
			return true
		})
	})
	want := 0
	for i := 100; i < n; i++ {
		if i%3 != 0 {
			want++
		}
	}
	if err != nil || got != want {
		t.Fatalf("scanned %d keys, want %d (%v)", got, want, err)
	}
}

// TestWALReplayRule mixes calls that succeed, fail before writing and fail
// after writing in shared rounds: only the successful calls' writes
// survive and each caller gets its own result.
func TestWALReplayRule(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{MaxBatch: 4, NoSync: true})
	errEarly, errLate := errors.New("early"), errors.New("late")
	const n = 60
	var wg sync.WaitGroup
	results := make([]error, n)
	for i := range n {
		wg.Go(func() {
			results[i] = s.kv.Update(func(tx kvTxn) error {
				key := []byte(fmt.Sprintf("k%03d", i))
				switch i % 3 {
				case 1:
					return errEarly
				case 2:
					if err := tx.Put(key, []byte("bad")); err != nil {
						return err
					}
					if err := tx.Put([]byte("shared"), []byte("bad")); err != nil {
						return err
					}
					return errLate
				}
				return tx.Put(key, []byte("ok"))
			})
		})
	}
	wg.Wait()
	for i, err := range results {
		want := []error{nil, errEarly, errLate}[i%3]
		if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Fatalf("call %d: %v, want %v", i, err, want)
		}
	}
	s.crash()
	s.open(nil)
	var want []string
	for i := 0; i < n; i += 3 {
		want = append(want, fmt.Sprintf("k%03d=ok", i))
	}
	if got := s.dump(); got != strings.Join(want, " ") {
		t.Fatalf("got %s\nwant %s", got, strings.Join(want, " "))
	}
}

// TestWALViewsDuringCheckpoints checks that concurrent views always see a
// consistent state while rounds and checkpoints run: each round moves a
// unit from one key to another, so the sum stays constant.
func TestWALViewsDuringCheckpoints(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{NoSync: true, WALCheckpointBytes: 1 << 10, MaxBatch: 4})
	const keys = 8
	var init []string
	for i := range keys {
		init = append(init, fmt.Sprintf("n%d", i), "100")
	}
	s.mustPut(init...)
	sum := func(tx kvTxn) (int, error) {
		total := 0
		err := tx.Scan([]byte("n"), nil, func(k, v []byte) bool {
			var x int
			fmt.Sscan(string(v), &x)
			total += x
			return true
		})
		return total, err
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 150 {
				from, to := []byte(fmt.Sprintf("n%d", (w+i)%keys)), []byte(fmt.Sprintf("n%d", (w+2*i+1)%keys))
				err := s.kv.Update(func(tx kvTxn) error {
					a, _ := tx.Get(from)
					b, _ := tx.Get(to)
					var x, y int
					fmt.Sscan(string(a), &x)
					fmt.Sscan(string(b), &y)
					if bytes.Equal(from, to) {
						return nil
					}
					if err := tx.Put(from, []byte(fmt.Sprint(x-1))); err != nil {
						return err
					}
					return tx.Put(to, []byte(fmt.Sprint(y+1)))
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range 300 {
				err := s.kv.View(func(tx kvTxn) error {
					if got, err := sum(tx); err != nil || got != keys*100 {
						return fmt.Errorf("sum %d (%v), want %d", got, err, keys*100)
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// FuzzWALRecord feeds arbitrary bytes to the log's record decoder. It must
// never panic; whatever it accepts must encode back to the same bytes.
func FuzzWALRecord(f *testing.F) {
	f.Add(appendWALRecord(nil, 1, 0, []walOp{{key: []byte("k"), val: []byte("v")}}))
	f.Add(appendWALRecord(nil, 1<<40, 7, []walOp{{key: []byte("a"), del: true}, {key: []byte("b"), val: nil}, {key: []byte("c"), val: bytes.Repeat([]byte{7}, 300)}}))
	f.Add(encodeWALRecord(nil, 3, 0, false, []walOp{{key: []byte("v1"), val: []byte("no mark")}}))
	f.Add(make([]byte, walRecHdrLen))
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, n, err := decodeWALRecord(b)
		if err != nil {
			if err != io.EOF && !errors.Is(err, errWALTorn) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if n <= 0 || n > len(b) {
			t.Fatalf("length %d of %d bytes", n, len(b))
		}
		// Padding is not checked; the header and payload must match.
		end := walRecHdrLen + int(binary.LittleEndian.Uint32(b))
		enc := encodeWALRecord(nil, rec.seq, rec.mark, rec.hasMark, rec.ops)
		if len(enc) < end || !bytes.Equal(enc[:end], b[:end]) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b[:end], enc)
		}
		// The whole-file parser must accept it too. Only the record:
		// what follows it in b is arbitrary (the parser rightly refuses
		// a second record that does not continue the sequence).
		file := append(encodeWALHeader(1), b[:n]...)
		if _, _, err := parseWALFile(file, 1); err != nil && !strings.Contains(err.Error(), "followed by valid record") {
			t.Fatalf("file of a valid record: %v", err)
		}
	})
}

// TestWALAppendFailure makes the log unwritable: the failing round and
// every later update get an error, reads go on, and reopening recovers
// everything acknowledged before.
func TestWALAppendFailure(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{})
	s.mustPut("a", "1")
	s.kv.wal.f.Close() // the next append fails, as on an I/O error
	if err := s.put("b", "2"); err == nil {
		t.Fatal("put with a broken log succeeded")
	}
	if err := s.put("c", "3"); err == nil || !strings.Contains(err.Error(), "updates stopped") {
		t.Fatalf("put after a failed append: %v", err)
	}
	if got := s.dump(); got != "a=1" {
		t.Fatalf("reads after the failure: %s", got)
	}
	if err := s.kv.Close(); err == nil {
		t.Fatal("Close of a failed store reported no error")
	}
	s.open(nil)
	if got := s.dump(); got != "a=1" {
		t.Fatalf("after reopening: %s", got)
	}
}

// TestWALCloseDuringUpdates closes the store while writers are busy:
// every update either succeeds, and then survives, or reports the store
// closed.
func TestWALCloseDuringUpdates(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 4 << 10})
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		acked []string
	)
	start := make(chan struct{})
	for w := range 8 {
		wg.Go(func() {
			<-start
			for i := range 200 {
				k := fmt.Sprintf("w%d-%03d", w, i)
				err := s.put(k, "v")
				if errors.Is(err, errKVClosed) {
					return
				}
				if err != nil {
					t.Errorf("put %s: %v", k, err)
					return
				}
				mu.Lock()
				acked = append(acked, k+"=v")
				mu.Unlock()
			}
		})
	}
	close(start)
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 100 {
			break
		}
		s.mustPut("sync", "x") // wait for rounds, not for a clock
	}
	if err := s.kv.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if gens := s.walFiles(); len(gens) != 0 {
		t.Fatalf("log files after Close: %v", gens)
	}
	s.open(nil)
	got := " " + s.dump() + " "
	for _, kv := range acked {
		if !strings.Contains(got, " "+kv+" ") {
			t.Fatalf("acknowledged %s lost over Close", kv)
		}
	}
}

// TestWALOpenWithoutLog opens a crashed log-backed database without the
// log: its tail must be applied, not ignored, and must not come back over
// newer changes when the log is used again.
func TestWALOpenWithoutLog(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{})
	s.mustPut("a", "old", "b", "1")
	s.crash()
	kv, err := openBoltKV(s.path, BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Update(func(tx kvTxn) error {
		if v, _ := tx.Get([]byte("a")); string(v) != "old" {
			return fmt.Errorf("a = %q without the log's tail", v)
		}
		return tx.Put([]byte("a"), []byte("new"))
	}); err != nil {
		t.Fatal(err)
	}
	kv.Close()
	s.open(nil)
	if got := s.dump(); got != "a=new b=1" {
		t.Fatalf("got %s, want a=new b=1", got)
	}
}

func (s *walTestStore) putDeferred(k, v string) {
	s.t.Helper()
	if err := s.kv.UpdateDeferred(func(tx kvTxn) error { return tx.Put([]byte(k), []byte(v)) }); err != nil {
		s.t.Fatal(err)
	}
}

// powerCut drops the store as a machine crash would: of the records not
// known durable, only those keep says reached the disk anyway (the page
// cache writes back in no particular order); the others read as the
// zeros the file was preallocated with.
func (s *walTestStore) powerCut(keep func(seq uint64) bool) {
	s.t.Helper()
	durable := s.kv.durable.Load()
	s.crash()
	for _, g := range s.walFiles() {
		data, err := os.ReadFile(walFileName(s.path, g))
		if err != nil {
			s.t.Fatal(err)
		}
		for _, off := range s.recordOffsets(g) {
			rec, n, err := decodeWALRecord(data[off:])
			if err != nil {
				s.t.Fatal(err)
			}
			if rec.seq > durable && !keep(rec.seq) {
				s.patch(g, off, make([]byte, n))
			}
		}
	}
}

// TestWALPowerCut makes changes under the deferred mode, syncs some of
// them, and cuts the power in the ways a machine crash can lose what was
// not synced. Reopening must always work and find a prefix of the
// changes, in order, with at least every change synced before the cut.
func TestWALPowerCut(t *testing.T) {
	const n, synced = 40, 25
	for _, tc := range []struct {
		name string
		keep func(seq uint64) bool
	}{
		{"nothing unsynced kept", func(uint64) bool { return false }},
		{"everything kept", func(uint64) bool { return true }},
		{"later pages kept, an earlier one lost", func(seq uint64) bool { return seq%3 != 0 }},
		{"every other kept", func(seq uint64) bool { return seq%2 == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A long interval: only the test's Sync makes records durable.
			s := newWALTestStore(t, BoltOptions{CommitInterval: time.Hour})
			for i := range n {
				s.putDeferred(fmt.Sprintf("k%02d", i), "v")
				if i == synced-1 {
					if err := s.kv.Sync(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if st := s.kv.logStats(); st.Pending == 0 {
				t.Fatalf("nothing pending before the cut (%+v): the test proves nothing", st)
			}
			s.powerCut(tc.keep)
			s.open(nil)
			got := strings.Fields(s.dump())
			if len(got) < synced {
				t.Fatalf("%d changes after the cut, want at least the %d synced: %v", len(got), synced, got)
			}
			for i, kv := range got {
				if want := fmt.Sprintf("k%02d=v", i); kv != want {
					t.Fatalf("after the cut: %v is not a prefix of the changes (at %d: %s, want %s)", got, i, kv, want)
				}
			}
			t.Logf("%d of %d changes survived, %d synced", len(got), n, synced)
			// The log goes on from there.
			s.mustPut("after", "x")
		})
	}
}

// TestWALPowerCutDamage is TestWALPowerCut's counterpart: a record that
// was durable when a later one was written and is damaged now is not a
// torn tail, and opening must refuse rather than drop it.
func TestWALPowerCutDamage(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{CommitInterval: time.Hour})
	for i := range 6 {
		s.putDeferred(fmt.Sprintf("k%d", i), "v")
		if err := s.kv.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	s.crash()
	gens := s.walFiles()
	g := gens[len(gens)-1]
	offs := s.recordOffsets(g)
	s.patch(g, offs[2]+walRecHdrLen, []byte{0xff})
	if err := s.openErr(); err == nil || !strings.Contains(err.Error(), "followed by valid record") {
		t.Fatalf("open with a damaged durable record: %v", err)
	}
}

// TestWALDeferredSync checks the deferred mode's accounting: deferred
// changes are visible at once and pending until Sync or the commit
// interval's timer makes them durable, with one fdatasync for many.
func TestWALDeferredSync(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{CommitInterval: time.Hour})
	s.mustPut("first", "x") // the file's first record is synced anyway
	before := s.kv.logStats()
	for i := range 5 {
		s.putDeferred(fmt.Sprintf("k%d", i), "v")
	}
	if got := s.dump(); got != "first=x k0=v k1=v k2=v k3=v k4=v" {
		t.Fatalf("deferred changes not visible: %s", got)
	}
	mid := s.kv.logStats()
	if mid.Syncs != before.Syncs || mid.Pending != 5 {
		t.Fatalf("after 5 deferred puts: %+v (before %+v)", mid, before)
	}
	if err := s.kv.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := s.kv.Sync(); err != nil { // nothing pending: no fdatasync
		t.Fatal(err)
	}
	after := s.kv.logStats()
	if after.Syncs != before.Syncs+1 || after.Pending != 0 {
		t.Fatalf("after Sync: %+v (before %+v)", after, before)
	}
	// A non-deferred update syncs what was deferred before it.
	s.putDeferred("d", "1")
	s.mustPut("e", "2")
	if st := s.kv.logStats(); st.Pending != 0 || st.Syncs != after.Syncs+1 {
		t.Fatalf("after a synced put: %+v", st)
	}

	// The timer: a short interval syncs without anyone asking.
	s.crash()
	s.opts.CommitInterval = time.Millisecond
	s.open(nil)
	s.mustPut("first", "y")
	s.putDeferred("timed", "1")
	for i := 0; s.kv.logStats().Pending != 0; i++ {
		if i == 1000 {
			t.Fatalf("deferred change not synced by the timer within 10 s: %+v", s.kv.logStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWALInodesNotReusedAfterPowerCut: a create answered under Deferred
// and lost in a machine crash gave its inode number (and so a file
// handle) to a client; reopening after an unclean shutdown must never
// hand that number out again.
func TestWALInodesNotReusedAfterPowerCut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meta.db")
	opts := BoltOptions{WAL: true, CommitInterval: time.Hour}
	open := func() (*kvEngine, *walKV) {
		e, err := OpenBolt(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		ke := e.(*kvEngine)
		return ke, ke.kv.(*walKV)
	}
	create := func(e *kvEngine, ctx context.Context, name string) Ino {
		n, _, err := e.Create(ctx, RootIno, name, CreateArgs{Type: TypeRegular, Mode: 0o644}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Ino
	}
	e, kv := open()
	create(e, context.Background(), "durable")
	lost := create(e, Deferred(context.Background()), "lost")
	// The power cut: the unsynced record never reached the disk.
	s := &walTestStore{t: t, path: path, opts: opts, kv: kv}
	s.powerCut(func(uint64) bool { return false })
	e, _ = open()
	defer e.Close()
	if _, err := e.Lookup(context.Background(), RootIno, "lost"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the unsynced create survived the cut (%v): the test proves nothing", err)
	}
	if got := create(e, context.Background(), "after"); got <= lost {
		t.Fatalf("inode %d handed out again after the cut (lost create had %d)", got, lost)
	}
	// A clean Close leaves nothing to skip.
	next := create(e, context.Background(), "next")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, _ = open()
	if got := create(e, context.Background(), "after-close"); got != next+1 {
		t.Fatalf("after a clean Close the next inode is %d, want %d", got, next+1)
	}
}

// TestWALSyncFailure: an fdatasync that fails leaves the deferred changes
// in doubt, so Sync reports it (the server then fails the COMPOUND that
// waited) and every later update is refused until a restart recovers
// what reached the disk.
func TestWALSyncFailure(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{CommitInterval: time.Hour})
	s.mustPut("a", "1")
	s.putDeferred("b", "2")
	s.kv.wal.f.Close() // the next fdatasync fails, as on an I/O error
	if err := s.kv.Sync(); err == nil {
		t.Fatal("Sync with a broken log succeeded")
	}
	if err := s.put("c", "3"); err == nil || !strings.Contains(err.Error(), "updates stopped") {
		t.Fatalf("put after a failed sync: %v", err)
	}
	if err := s.kv.Close(); err == nil {
		t.Fatal("Close of a failed store reported no error")
	}
	s.open(nil)
	if got := s.dump(); got != "a=1 b=2" {
		t.Fatalf("after reopening: %s", got)
	}
}

// TestWALAwait: Await waits for the log's next fdatasync, started by
// someone else, and adds none of its own; the commit interval's timer
// makes sure one comes.
func TestWALAwait(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{CommitInterval: time.Hour})
	s.mustPut("first", "x")
	s.putDeferred("a", "1")
	before := s.kv.logStats()
	done := make(chan error, 1)
	go func() { done <- s.kv.Await() }()
	if err := s.kv.Sync(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Await did not return after a Sync covered its changes")
	}
	if st := s.kv.logStats(); st.Syncs != before.Syncs+1 || st.Pending != 0 {
		t.Fatalf("after Sync and Await: %+v (before %+v): Await must add no fdatasync", st, before)
	}

	// Alone, it waits for the timer.
	s.crash()
	s.opts.CommitInterval = time.Millisecond
	s.open(nil)
	s.mustPut("first", "y")
	s.putDeferred("b", "2")
	go func() { done <- s.kv.Await() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Await alone did not return within 10 s with a 1 ms commit interval")
	}
	if st := s.kv.logStats(); st.Pending != 0 {
		t.Fatalf("Await returned with %d records pending", st.Pending)
	}
}
