package meta

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestInodeCodec(t *testing.T) {
	cases := []inode{
		{},
		{Attr: Attr{Type: TypeRegular, Mode: 0o7777, Nlink: 1<<32 - 1, UID: 1, GID: 2, Size: 1<<64 - 1,
			RdevMajor: 8, RdevMinor: 9,
			Atime: time.Unix(-1<<40, 1), Mtime: time.Unix(1<<40, 999_999_999), Ctime: time.Unix(0, 0), Btime: time.Unix(1_700_000_000, 5),
			Change: 1<<64 - 1, Parent: 77, Verifier: [8]byte{1, 2, 3, 4, 5, 6, 7, 8}}, nextSeq: 12345},
	}
	for i, c := range cases {
		b := c.encode()
		if len(b) != inodeV1Len {
			t.Fatalf("case %d: len %d, want %d", i, len(b), inodeV1Len)
		}
		got, err := decodeInode(append(b, 0xff, 0xee)) // trailing fields from a newer version are ignored
		if err != nil {
			t.Fatal(err)
		}
		if got.nextSeq != c.nextSeq || !bytes.Equal(got.encode(), b) {
			t.Fatalf("case %d: round trip\n got %+v\nwant %+v", i, *got, c)
		}
	}
	for _, bad := range [][]byte{nil, {2}, (&inode{}).encode()[:50]} {
		if _, err := decodeInode(bad); err == nil {
			t.Fatalf("decoded corrupt record %x", bad)
		}
	}
	d := dentry{ino: 42, typ: TypeSymlink, seq: 7}
	if got, err := decodeDentry(d.encode()); err != nil || got != d {
		t.Fatalf("dentry round trip %+v %v", got, err)
	}
	if _, err := decodeDentry([]byte{1, 2}); err == nil {
		t.Fatal("decoded short dentry")
	}
}

func openTestKV(t *testing.T, opts BoltOptions) *boltKV {
	t.Helper()
	kv, err := openBoltKV(filepath.Join(t.TempDir(), "kv.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kv.Close() })
	return kv
}

func TestBoltScan(t *testing.T) {
	kv := openTestKV(t, BoltOptions{NoSync: true})
	keys := []string{"a", "b1", "b2", "b3", "c"}
	if err := kv.Update(func(tx kvTxn) error {
		for _, k := range keys {
			if err := tx.Put([]byte(k), []byte("v"+k)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		prefix, start string
		limit         int
		want          string
	}{
		{"b", "", 10, "[b1 b2 b3]"},
		{"b", "b2", 10, "[b2 b3]"},
		{"b", "a", 10, "[b1 b2 b3]"},
		{"b", "b9", 10, "[]"},
		{"b", "", 2, "[b1 b2]"},
		{"", "", 10, "[a b1 b2 b3 c]"},
		{"d", "", 10, "[]"},
	} {
		var got []string
		err := kv.View(func(tx kvTxn) error {
			return tx.Scan([]byte(c.prefix), []byte(c.start), func(k, v []byte) bool {
				got = append(got, string(k))
				return len(got) < c.limit
			})
		})
		if err != nil || fmt.Sprint(got) != c.want {
			t.Fatalf("scan(%q,%q) = %v %v, want %s", c.prefix, c.start, got, err, c.want)
		}
	}
}

// TestGroupCommitReplay mixes calls that succeed, fail before writing and
// fail after writing inside shared transactions: only the successful
// calls' writes survive and every caller gets its own result.
func TestGroupCommitReplay(t *testing.T) {
	kv := openTestKV(t, BoltOptions{GroupCommit: true, MaxBatch: 4, NoSync: true})
	errEarly, errLate := errors.New("early"), errors.New("late")
	const n = 60
	var wg sync.WaitGroup
	results := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = kv.Update(func(tx kvTxn) error {
				key := []byte(fmt.Sprintf("k%03d", i))
				switch i % 3 {
				case 1:
					return errEarly
				case 2:
					if err := tx.Put(key, []byte("bad")); err != nil {
						return err
					}
					return errLate
				}
				return tx.Put(key, []byte("ok"))
			})
		}()
	}
	wg.Wait()
	for i, err := range results {
		want := []error{nil, errEarly, errLate}[i%3]
		if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Fatalf("call %d: %v, want %v", i, err, want)
		}
	}
	err := kv.View(func(tx kvTxn) error {
		for i := range n {
			v, _ := tx.Get([]byte(fmt.Sprintf("k%03d", i)))
			if (i%3 == 0) != (string(v) == "ok") || (i%3 != 0 && v != nil) {
				return fmt.Errorf("key %d = %q", i, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
