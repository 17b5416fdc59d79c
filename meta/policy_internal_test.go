package meta

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta/etcdtest"
)

func TestPolicyCodec(t *testing.T) {
	for m := 1; m <= MaxMirrors; m++ {
		p := Policy{Mirrors: m}
		b := p.encode()
		if !bytes.Equal(b, []byte{1, byte(m)}) {
			t.Fatalf("encode(%+v) = %x", p, b)
		}
		// Trailing fields from a newer version are ignored.
		if got, err := decodePolicy(append(b, 0, 0, 0xff)); err != nil || got != p {
			t.Fatalf("decode(%x) = %+v, %v", b, got, err)
		}
	}
	// Layouts: the record grows by the layout bytes, mirrors may be 0.
	for _, tc := range []struct {
		p   Policy
		rec []byte
	}{
		{Policy{Layout: LayoutFlexFiles}, []byte{1, 0, 2, 0}},
		{Policy{Mirrors: 2, Layout: LayoutFiles}, []byte{1, 2, 1, 0}},
		{Policy{LayoutsBelow: LayoutSet(0).With(LayoutFlexFiles)}, []byte{1, 0, 0, 4}},
		{Policy{Mirrors: 3, Layout: LayoutFlexFiles, LayoutsBelow: layoutSetAll}, []byte{1, 3, 2, 6}},
	} {
		if b := tc.p.encode(); !bytes.Equal(b, tc.rec) {
			t.Fatalf("encode(%+v) = %x, want %x", tc.p, b, tc.rec)
		}
		if got, err := decodePolicy(append(tc.rec, 0xff)); err != nil || got != tc.p {
			t.Fatalf("decode(%x) = %+v, %v", tc.rec, got, err)
		}
	}
	for _, bad := range [][]byte{nil, {}, {1}, {1, 0}, {1, MaxMirrors + 1}, {1, 0xff}, {2, 1}, {0, 1},
		{1, 1, 2}, {1, 0, 0, 0}, {1, 1, 3, 0}, {1, 1, 1, 1}, {1, 1, 1, 8}} {
		if p, err := decodePolicy(bad); err == nil {
			t.Fatalf("decoded corrupt record %x as %+v", bad, p)
		}
	}
}

// Golden stripe-map records: a version-1 record as binaries before
// replicas wrote it, and a version-2 one.
var (
	stripeV1Golden = []byte{
		1,                       // version
		0, 0, 0, 0, 0, 0, 16, 0, // unit 4096
		0, 0, 0, 1, // first
		0, 0, 0, 0, 0, 0, 0, 7, // gen
		0, 2, // data servers
		1, 'x', 2, 'y', 'z',
	}
	stripeV1Map = StripeMap{Unit: 4096, First: 1, Gen: 7, DataServers: []string{"x", "yz"}}

	stripeV2Golden = []byte{
		2,
		0, 0, 0, 0, 0, 1, 0, 0, // unit 65536
		0, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0, 2,
		0, 2, 1, 'a', 1, 'b',
		2, // replicas per position
		1, 'b', 1, 'c', 1, 'c', 1, 'a',
		0, 1, 1, 'c', // stale
	}
	stripeV2Map = StripeMap{Unit: 65536, Gen: 2, DataServers: []string{"a", "b"},
		Replicas: [][]string{{"b", "c"}, {"c", "a"}}, Stale: []string{"c"}}
)

// TestStripeMapCodec pins both record versions byte for byte, and checks
// that corrupt and invalid records are refused.
func TestStripeMapCodec(t *testing.T) {
	for _, c := range []struct {
		name   string
		golden []byte
		m      StripeMap
	}{{"v1", stripeV1Golden, stripeV1Map}, {"v2", stripeV2Golden, stripeV2Map}} {
		got, err := decodeStripeMap(c.golden)
		if err != nil || !got.Equal(c.m) || got.Gen != c.m.Gen || !slices.Equal(got.Stale, c.m.Stale) {
			t.Fatalf("%s: decode = %+v, %v; want %+v", c.name, got, err, c.m)
		}
		if b := c.m.encode(); !bytes.Equal(b, c.golden) {
			t.Fatalf("%s: encode = %x\nwant %x", c.name, b, c.golden)
		}
		for n := range len(c.golden) {
			if _, err := decodeStripeMap(c.golden[:n]); err == nil {
				t.Fatalf("%s: decoded a record cut to %d bytes", c.name, n)
			}
		}
		if _, err := decodeStripeMap(append(slices.Clone(c.golden), 0)); err == nil {
			t.Fatalf("%s: decoded a record with a trailing byte", c.name)
		}
	}
	// A single-copy map with nothing stale is written as version 1, so
	// that older binaries read it.
	if b := stripeV1Map.encode(); b[0] != stripeMapVersion {
		t.Fatalf("single-copy map written as version %d", b[0])
	}
	// Version 2 without replicas or stale ids is accepted (nothing writes
	// it) and is a single-copy map.
	v2plain := append([]byte{2}, stripeV1Golden[1:]...)
	v2plain = append(v2plain, 0, 0, 0)
	if got, err := decodeStripeMap(v2plain); err != nil || !got.Equal(stripeV1Map) || got.Replicas != nil || got.Stale != nil {
		t.Fatalf("plain version 2 = %+v, %v", got, err)
	}

	mutate := func(f func(b []byte) []byte) []byte { return f(slices.Clone(stripeV2Golden)) }
	for name, b := range map[string][]byte{
		"version 0": mutate(func(b []byte) []byte { b[0] = 0; return b }),
		"version 3": mutate(func(b []byte) []byte { b[0] = 3; return b }),
		"four copies": mutate(func(b []byte) []byte {
			b[27] = 3
			return append(b[:28], 1, 'b', 1, 'c', 1, 'd', 1, 'c', 1, 'a', 1, 'd', 0, 0)
		}),
		"duplicate member":   mutate(func(b []byte) []byte { b[29] = 'a'; return b }), // position 0: a, a, c
		"stale not a member": mutate(func(b []byte) []byte { b[len(b)-1] = 'z'; return b }),
		"zero unit":          mutate(func(b []byte) []byte { b[6] = 0; return b }),
		"first out of range": mutate(func(b []byte) []byte { b[12] = 2; return b }),
		"id length past end": mutate(func(b []byte) []byte { b[len(b)-2] = 9; return b }),
	} {
		if m, err := decodeStripeMap(b); err == nil {
			t.Errorf("%s: decoded %x as %+v", name, b, m)
		}
	}
}

// TestPolicyRecordsFreed checks, in the store itself, what the
// conformance suite cannot see: a policy record goes with its inode
// however the inode goes, and inodes that hold no data never get one.
func TestPolicyRecordsFreed(t *testing.T) {
	t.Run("bolt", func(t *testing.T) {
		kv, err := openBoltKV(filepath.Join(t.TempDir(), "kv.db"), BoltOptions{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		testPolicyRecordsFreed(t, kv)
	})
	t.Run("etcd", func(t *testing.T) {
		c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
		testPolicyRecordsFreed(t, openTestEtcdKV(t, c, "/policy", EtcdOptions{}))
	})
}

func testPolicyRecordsFreed(t *testing.T, kv kvStore) {
	ctx := context.Background()
	e := newKVEngine(kv)
	defer e.Close()
	if err := e.Init(ctx); err != nil {
		t.Fatal(err)
	}
	create := func(parent Ino, name string, typ FileType) Ino {
		t.Helper()
		n, _, err := e.Create(ctx, parent, name, CreateArgs{Type: typ, Target: "t"}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Ino
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	records := func() []Ino {
		t.Helper()
		var inos []Ino
		must(kv.View(func(x kvTxn) error {
			return x.Scan([]byte{pPolicy}, nil, func(k, _ []byte) bool {
				inos = append(inos, Ino(be.Uint64(k[1:])))
				return true
			})
		}))
		return inos
	}

	d := create(RootIno, "d", TypeDirectory)
	must(e.SetPolicy(ctx, d, Policy{Mirrors: 3}))
	sub := create(d, "sub", TypeDirectory)
	victim := create(d, "victim", TypeDirectory)
	mover := create(d, "mover", TypeDirectory)
	f := create(d, "f", TypeRegular)
	linked := create(d, "linked", TypeRegular)
	for _, typ := range []FileType{TypeSymlink, TypeFIFO, TypeSocket, TypeChar, TypeBlock} {
		create(d, typ.String(), typ)
	}
	if got, want := records(), []Ino{d, sub, victim, mover, f, linked}; !slices.Equal(got, want) {
		t.Fatalf("policy records for %v, want %v", got, want)
	}

	_, _, err := e.Remove(ctx, d, "sub", time.Time{})
	must(err)
	_, err = e.Rename(ctx, d, "mover", d, "victim", time.Time{})
	must(err)
	_, _, err = e.Link(ctx, linked, RootIno, "other", time.Time{})
	must(err)
	_, _, err = e.Remove(ctx, d, "linked", time.Time{}) // one link left
	must(err)
	_, _, err = e.Remove(ctx, d, "f", time.Time{}) // an orphan keeps its record
	must(err)
	if got, want := records(), []Ino{d, mover, f, linked}; !slices.Equal(got, want) {
		t.Fatalf("after rmdir, rename over a directory and unlinks: records for %v, want %v", got, want)
	}
	_, err = e.FreeOrphan(ctx, f)
	must(err)
	_, _, err = e.Remove(ctx, RootIno, "other", time.Time{})
	must(err)
	_, err = e.FreeOrphan(ctx, linked)
	must(err)
	must(e.SetPolicy(ctx, d, Policy{}))
	if got, want := records(), []Ino{mover}; !slices.Equal(got, want) {
		t.Fatalf("after freeing and clearing: records for %v, want %v", got, want)
	}
}

// TestPolicyCorruptRecord checks that a corrupt policy record is reported,
// not copied to new inodes or read as a policy.
func TestPolicyCorruptRecord(t *testing.T) {
	ctx := context.Background()
	kv := openTestKV(t, BoltOptions{NoSync: true})
	e := newKVEngine(kv)
	if err := e.Init(ctx); err != nil {
		t.Fatal(err)
	}
	d, _, err := e.Create(ctx, RootIno, "d", CreateArgs{Type: TypeDirectory}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Update(func(x kvTxn) error { return x.Put(policyKey(d.Ino), []byte{1, 9}) }); err != nil {
		t.Fatal(err)
	}
	if p, err := e.Policy(ctx, d.Ino); err == nil {
		t.Fatalf("Policy of a corrupt record = %+v", p)
	}
	for _, typ := range []FileType{TypeRegular, TypeDirectory} {
		if n, _, err := e.Create(ctx, d.Ino, "x", CreateArgs{Type: typ}, time.Time{}); err == nil {
			t.Fatalf("create %v under a corrupt policy = %+v", typ, n)
		}
	}
	// Inodes that inherit nothing do not read it; a new policy replaces it.
	if _, _, err := e.Create(ctx, d.Ino, "l", CreateArgs{Type: TypeSymlink, Target: "t"}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := e.SetPolicy(ctx, d.Ino, Policy{Mirrors: 2}); err != nil {
		t.Fatal(err)
	}
	n, _, err := e.Create(ctx, d.Ino, "x", CreateArgs{Type: TypeRegular}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := e.Policy(ctx, n.Ino); err != nil || p.Mirrors != 2 {
		t.Fatalf("policy after repair = %+v, %v", p, err)
	}
}
