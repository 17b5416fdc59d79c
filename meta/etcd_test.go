package meta_test

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/meta/etcdtest"
	"github.com/shoalfs/shoal/meta/metatest"
)

// openEtcd opens engines on c, one prefix per state directory: reopening
// the same directory dials a new client to the same prefix.
func openEtcd(c *etcdtest.Cluster) metatest.Opener {
	return openEtcdOpts(c, meta.EtcdOptions{})
}

func openEtcdOpts(c *etcdtest.Cluster, opts meta.EtcdOptions) metatest.Opener {
	return func(t *testing.T, dir string) meta.Engine {
		t.Helper()
		opts := opts
		opts.Endpoints, opts.Prefix = c.Endpoints, "/metatest"+dir
		e, err := meta.OpenEtcd(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
}

// TestEtcd runs the conformance suite on etcd. It also checks that engine
// transactions stay far below etcd's per-transaction limit of 128
// operations: the budget here is 32 (the largest transaction of the suite,
// a rename over a symlink, had 10 writes plus the generation key when
// this was written).
func TestEtcd(t *testing.T) {
	metatest.Run(t, openEtcdOpts(etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true}), meta.EtcdOptions{MaxTxnOps: 32}))
}

// TestEtcdPrefixes checks that clusters sharing one etcd under different
// prefixes, even prefixes of each other, do not see each other's files.
func TestEtcdPrefixes(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	names := map[string]string{"/p/a": "in-a", "/p/ab": "in-ab", "/p/a/b": "in-a-b"}
	engines := map[string]meta.Engine{}
	for prefix, name := range names {
		e, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Endpoints: c.Endpoints, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		engines[prefix] = e
		if _, _, err := e.Create(ctx, meta.RootIno, name, meta.CreateArgs{Type: meta.TypeRegular}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	for prefix, e := range engines {
		ents, eof, err := e.ReadDir(ctx, meta.RootIno, 0, 100)
		if err != nil || !eof || len(ents) != 1 || ents[0].Name != names[prefix] {
			t.Fatalf("prefix %s lists %+v (eof %v, err %v)", prefix, ents, eof, err)
		}
		if st, err := e.StatFS(ctx); err != nil || st.Files != 2 {
			t.Fatalf("prefix %s: statfs %+v %v", prefix, st, err)
		}
	}
}

// TestEtcdReplication runs the engine on a three-member etcd cluster,
// stops the leader and checks that the engine keeps working and that a
// new engine on the two survivors sees everything.
func TestEtcdReplication(t *testing.T) {
	c := etcdtest.Start(t, 3, etcdtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Endpoints: c.Endpoints, Prefix: "/repl"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	create := func(e meta.Engine, parent meta.Ino, name string, typ meta.FileType) meta.Node {
		t.Helper()
		n, _, err := e.Create(ctx, parent, name, meta.CreateArgs{Type: typ, Mode: 0o644}, time.Time{})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return n
	}
	d := create(e, meta.RootIno, "d", meta.TypeDirectory)
	want := map[string]meta.Ino{}
	for i := range 20 {
		name := fmt.Sprintf("before-%02d", i)
		want[name] = create(e, d.Ino, name, meta.TypeRegular).Ino
	}

	var lead int
	for range 100 { // a leader is elected by the time members are ready; this only waits for agreement
		if lead = c.Leader(); lead >= 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if lead < 0 {
		t.Fatal("members do not agree on a leader")
	}
	t.Logf("stopping leader m%d (%s)", lead, c.Endpoints[lead])
	c.Stop(lead)

	// The engine, still configured with the dead member's endpoint, goes
	// on: the first requests may wait out the election.
	for i := range 20 {
		name := fmt.Sprintf("after-%02d", i)
		want[name] = create(e, d.Ino, name, meta.TypeRegular).Ino
	}
	if n, err := e.Lookup(ctx, d.Ino, "before-07"); err != nil || n.Ino != want["before-07"] {
		t.Fatalf("lookup after failover: %+v %v", n, err)
	}
	if _, err := e.Rename(ctx, d.Ino, "before-00", meta.RootIno, "moved", time.Time{}); err != nil {
		t.Fatal(err)
	}
	want["moved"] = want["before-00"]
	delete(want, "before-00")
	check := func(e meta.Engine) {
		t.Helper()
		got := map[string]meta.Ino{}
		for _, dir := range []meta.Ino{meta.RootIno, d.Ino} {
			ents, eof, err := e.ReadDir(ctx, dir, 0, 1000)
			if err != nil || !eof {
				t.Fatalf("readdir %d: eof %v, %v", dir, eof, err)
			}
			for _, en := range ents {
				if en.Name != "d" {
					got[en.Name] = en.Ino
				}
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("entries %v, want %v", got, want)
		}
	}
	check(e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e2, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Endpoints: c.Running(), Prefix: "/repl"})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	check(e2)
	st, err := e2.StatFS(ctx)
	if err != nil || st.Files != uint64(2+len(want)) {
		t.Fatalf("statfs %+v %v, want %d files", st, err, 2+len(want))
	}
}

// TestEtcdCallerClient: an engine on a client the caller made leaves it
// open on Close.
func TestEtcdCallerClient(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Client: cli, Prefix: "/own"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Create(ctx, meta.RootIno, "f", meta.CreateArgs{Type: meta.TypeRegular}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, "/own/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("client closed with the engine: %v", err)
	}
	if r.Count == 0 {
		t.Fatal("no keys under the prefix")
	}
}

func TestOpenEtcdUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	_, err = meta.OpenEtcd(context.Background(), meta.EtcdOptions{Endpoints: []string{addr}, DialTimeout: 500 * time.Millisecond})
	if err == nil {
		t.Fatal("opened an engine on a closed port")
	}
	_, err = meta.OpenEtcd(context.Background(), meta.EtcdOptions{})
	if err == nil {
		t.Fatal("opened an engine without endpoints")
	}
}

func TestParseEtcdURL(t *testing.T) {
	for _, c := range []struct {
		url       string
		endpoints []string
		prefix    string
		err       bool
	}{
		{url: "etcd://127.0.0.1:2379/shoal-a", endpoints: []string{"127.0.0.1:2379"}, prefix: "/shoal-a"},
		{url: "etcd://127.0.0.1:2379,127.0.0.1:22379/x/y/", endpoints: []string{"127.0.0.1:2379", "127.0.0.1:22379"}, prefix: "/x/y"},
		{url: "etcd://h1:1,h2:2,h3:3", endpoints: []string{"h1:1", "h2:2", "h3:3"}},
		{url: "etcd:///p", err: true},
		{url: "http://h:1/p", err: true},
		{url: "etcd://h:1,,h:2/p", err: true},
		{url: "etcd://u:pw@h:1/p", err: true},
		{url: "etcd://h:1/p?x=1", err: true},
		{url: "bolt", err: true},
	} {
		o, err := meta.ParseEtcdURL(c.url)
		if c.err {
			if err == nil {
				t.Errorf("%s: parsed as %+v", c.url, o)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(o.Endpoints, c.endpoints) || o.Prefix != c.prefix {
			t.Errorf("%s: %+v %v, want %v %q", c.url, o, err, c.endpoints, c.prefix)
		}
	}
}

// TestEtcdReadDirBatches lists a directory of many more entries than one
// etcd Txn may read (ReadDir fetches dentries and inodes in batches of
// MaxTxnOps), with hard links, removed entries and every file type, and
// checks that etcd lists exactly what bbolt lists after the same
// operations: names, inode numbers, cookies and attributes, whole and in
// pages.
func TestEtcdReadDirBatches(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	engines := map[string]meta.Engine{
		"bolt": openBolt(meta.BoltOptions{NoSync: true})(t, t.TempDir()),
		"etcd": openEtcdOpts(c, meta.EtcdOptions{MaxTxnOps: 16})(t, "/readdir"),
	}
	const n = 150
	for name, e := range engines {
		defer e.Close()
		fail := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		d, _, err := e.Create(ctx, meta.RootIno, "d", meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, now)
		fail(err)
		var files []meta.Ino
		for i := range n {
			args := meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644, UID: uint32(i)}
			switch i % 5 {
			case 1:
				args.Type = meta.TypeDirectory
			case 2:
				args.Type, args.Target = meta.TypeSymlink, fmt.Sprint("target-", i)
			}
			nd, _, err := e.Create(ctx, d.Ino, fmt.Sprintf("e%03d", i), args, now.Add(time.Duration(i)*time.Second))
			fail(err)
			if args.Type == meta.TypeRegular {
				files = append(files, nd.Ino)
			}
		}
		// Hard links in the same directory: one inode under several names.
		for i, ino := range files[:10] {
			_, _, err := e.Link(ctx, ino, d.Ino, fmt.Sprintf("link%02d", i), now)
			fail(err)
		}
		for i := 0; i < n; i += 7 {
			_, _, err := e.Remove(ctx, d.Ino, fmt.Sprintf("e%03d", i), now)
			fail(err)
		}
		_, err = e.SetAttr(ctx, files[3], meta.SetAttr{Mask: meta.SetSize | meta.SetMode, Size: 4096, Mode: 0o600}, now.Add(time.Hour))
		fail(err)
	}
	list := func(e meta.Engine, max int) []meta.Entry {
		t.Helper()
		d, err := e.Lookup(ctx, meta.RootIno, "d")
		if err != nil {
			t.Fatal(err)
		}
		var all []meta.Entry
		cookie := uint64(0)
		for range 1000 {
			ents, eof, err := e.ReadDir(ctx, d.Ino, cookie, max)
			if err != nil {
				t.Fatalf("readdir after %d (max %d): %v", cookie, max, err)
			}
			all = append(all, ents...)
			if eof {
				return all
			}
			if len(ents) == 0 {
				t.Fatalf("readdir after %d: no entries and no eof", cookie)
			}
			cookie = ents[len(ents)-1].Cookie
		}
		t.Fatal("readdir does not reach eof")
		return nil
	}
	want := list(engines["bolt"], 1000)
	if wantN := n - (n+6)/7 + 10; len(want) != wantN {
		t.Fatalf("bolt lists %d entries, want %d", len(want), wantN)
	}
	for _, max := range []int{1000, len(want), 16, 7, 1} {
		if got := list(engines["etcd"], max); !reflect.DeepEqual(got, want) {
			for i := range min(len(got), len(want)) {
				if !reflect.DeepEqual(got[i], want[i]) {
					t.Fatalf("max %d: entry %d is %+v on etcd, %+v on bolt", max, i, got[i], want[i])
				}
			}
			t.Fatalf("max %d: etcd lists %d entries, bolt %d", max, len(got), len(want))
		}
	}
}

// BenchmarkEtcd measures the etcd engine on a one-member etcd with fsync:
// durable serial creates (one linearisable read and one Txn each, plus a
// read per key the create looks at), lookups, and ReadDir of a
// 1000-entry directory (a scan of its index, then its dentries and their
// inodes in batches of up to 128 reads per round trip).
func BenchmarkEtcd(b *testing.B) {
	c := etcdtest.Start(b, 1, etcdtest.Options{})
	ctx := context.Background()
	e, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Endpoints: c.Endpoints, Prefix: "/bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	d, _, err := e.Create(ctx, meta.RootIno, "d", meta.CreateArgs{Type: meta.TypeDirectory}, time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	create := func(dir meta.Ino) {
		n++
		if _, _, err := e.Create(ctx, dir, fmt.Sprint("f", n), meta.CreateArgs{Type: meta.TypeRegular}, time.Time{}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("create", func(b *testing.B) {
		for b.Loop() {
			create(meta.RootIno)
		}
	})
	for range 1000 {
		create(d.Ino)
	}
	name := fmt.Sprint("f", n-500)
	b.Run("lookup", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.Lookup(ctx, d.Ino, name); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("readdir-1000", func(b *testing.B) {
		for b.Loop() {
			ents, eof, err := e.ReadDir(ctx, d.Ino, 0, 1000)
			if err != nil || !eof || len(ents) != 1000 {
				b.Fatalf("%d entries, eof %v, %v", len(ents), eof, err)
			}
		}
	})
}
