package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// These tests cover unlinked files kept for their opens (server/orphans.go)
// with real clients of the Go client library: two Clients are two NFS
// clients, each with its own client ID, so the Linux client's
// silly-rename, which covers only opens on the same client, plays no part.
// Every case runs against a single server and against a pNFS cluster with
// two data servers, where the data that must stay (and then go) is the
// data servers' objects.

// orphanEnv is one server setup under test.
type orphanEnv struct {
	t     *testing.T
	addr  string
	lease time.Duration
	// dataDirs are the store directories that hold file data: the
	// server's own, or the data servers'.
	dataDirs []string
	srv      func() *server.Server // the (metadata) server now running
	restart  func()                // stop and start the (metadata) server on addr
}

type orphanBackend struct {
	name  string
	start func(t *testing.T, lease time.Duration) *orphanEnv
}

var orphanBackends = []orphanBackend{
	{"single", startSingleOrphanEnv},
	{"pnfs", startPNFSOrphanEnv},
}

func testLogger() *slog.Logger {
	if os.Getenv("SHOAL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func startSingleOrphanEnv(t *testing.T, lease time.Duration) *orphanEnv {
	dir := t.TempDir()
	noSquash := false
	cfg := server.Config{
		Dir: dir, Lease: lease, Logger: testLogger(),
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
	}
	var (
		mu   sync.Mutex
		srv  *server.Server
		done chan error
	)
	serve := func(addr string) string {
		s, err := server.New(cfg)
		if err != nil {
			t.Fatalf("server.New: %v", err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			s.Close()
			t.Fatalf("listen %s: %v", addr, err)
		}
		d := make(chan error, 1)
		go func() { d <- s.Serve(ln) }()
		mu.Lock()
		srv, done = s, d
		mu.Unlock()
		return ln.Addr().String()
	}
	stop := func() {
		mu.Lock()
		s, d := srv, done
		mu.Unlock()
		if err := s.Close(); err != nil {
			t.Errorf("server close: %v", err)
		}
		select {
		case <-d:
		case <-time.After(30 * time.Second):
			t.Error("server did not stop within 30s")
		}
	}
	addr := serve("127.0.0.1:0")
	t.Cleanup(stop)
	return &orphanEnv{
		t: t, addr: addr, lease: lease,
		dataDirs: []string{filepath.Join(dir, "data")},
		srv: func() *server.Server {
			mu.Lock()
			defer mu.Unlock()
			return srv
		},
		restart: func() {
			stop()
			serve(addr)
		},
	}
}

func startPNFSOrphanEnv(t *testing.T, lease time.Duration) *orphanEnv {
	dir := t.TempDir()
	noSquash := false
	exports := []*server.Export{{Path: "/", RootSquash: &noSquash}}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cl, err := wiring.Start(ctx, wiring.Config{
		Dir: dir, DataServers: 2, Listen: "127.0.0.1:0",
		Exports: exports, Lease: lease, Logger: testLogger(),
	})
	if err != nil {
		t.Fatalf("wiring.Start: %v", err)
	}
	var mu sync.Mutex
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		cl.Close()
	})
	addr := cl.MDS.Addr.String()
	env := &orphanEnv{
		t: t, addr: addr, lease: lease,
		dataDirs: []string{filepath.Join(dir, "ds0", "data"), filepath.Join(dir, "ds1", "data")},
		srv: func() *server.Server {
			mu.Lock()
			defer mu.Unlock()
			return cl.MDS.Server
		},
	}
	env.restart = func() {
		mu.Lock()
		defer mu.Unlock()
		if err := cl.MDS.Close(); err != nil {
			t.Fatalf("closing the MDS: %v", err)
		}
		m, err := wiring.StartMDS(wiring.MDSConfig{
			Listen: addr, Dir: filepath.Join(dir, "mds"),
			Exports: exports, Lease: lease, Logger: testLogger(),
		})
		if err != nil {
			t.Fatalf("restarting the MDS: %v", err)
		}
		cl.MDS = m
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := m.Registry.WaitFor(ctx, len(cl.DS)); err != nil {
			t.Fatalf("data servers re-registering: %v", err)
		}
	}
	return env
}

func (e *orphanEnv) dial(addr string) *client.Client {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		e.t.Fatalf("dial %s: %v", addr, err)
	}
	return c
}

// dataFiles lists the store files holding ino's data.
func (e *orphanEnv) dataFiles(ino uint64) []string {
	var out []string
	for _, d := range e.dataDirs {
		p := filepath.Join(d, fmt.Sprintf("%02x", ino&0xff), strconv.FormatUint(ino, 10))
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			e.t.Fatal(err)
		}
	}
	return out
}

// wantData checks that ino's data is in the store on every data
// directory it is striped over.
func (e *orphanEnv) wantData(ino uint64, what string) {
	e.t.Helper()
	if got := e.dataFiles(ino); len(got) != len(e.dataDirs) {
		e.t.Fatalf("%s: data of ino %d in %d of %d stores: %v", what, ino, len(got), len(e.dataDirs), got)
	}
}

// waitFreed waits until ino is gone from the metadata engine and its data
// from every store.
func (e *orphanEnv) waitFreed(ino uint64, what string) {
	e.t.Helper()
	e.waitFreedWithin(ino, 3*e.lease+30*time.Second, what)
}

func (e *orphanEnv) waitFreedWithin(ino uint64, within time.Duration, what string) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		files := e.dataFiles(ino)
		_, err := e.srv().Meta().GetAttr(e.t.Context(), meta.Ino(ino))
		if len(files) == 0 && errors.Is(err, meta.ErrStale) {
			for _, o := range e.orphans() {
				if uint64(o) == ino {
					e.t.Fatalf("%s: ino %d still in the orphan set after the free", what, ino)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: ino %d not freed: data %v, getattr err %v", what, ino, files, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantOrphan checks that the metadata server keeps ino as an orphan.
func (e *orphanEnv) wantOrphan(ino uint64, what string) {
	e.t.Helper()
	a, err := e.srv().Meta().GetAttr(e.t.Context(), meta.Ino(ino))
	if err != nil || a.Nlink != 0 {
		e.t.Fatalf("%s: ino %d: %+v, %v; want an orphan", what, ino, a, err)
	}
	for _, o := range e.orphans() {
		if uint64(o) == ino {
			return
		}
	}
	e.t.Fatalf("%s: ino %d not in the orphan set %v", what, ino, e.orphans())
}

func (e *orphanEnv) orphans() []meta.Ino {
	e.t.Helper()
	o, err := e.srv().Meta().Orphans(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	return o
}

// fill returns n bytes that depend on their offset and on seed.
func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i>>9) ^ seed
	}
	return b
}

// writeFile creates path with data through c and returns its inode number.
func writeFile(t *testing.T, c *client.Client, path string, data []byte) uint64 {
	t.Helper()
	ctx := t.Context()
	f, err := c.Open(ctx, path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("create %s: %v", path, err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close %s: %v", path, err)
	}
	a, err := c.Stat(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	return a.Fileid
}

func readAll(t *testing.T, f *client.File, size int) []byte {
	t.Helper()
	got := make([]byte, size+1)
	n, err := f.ReadAt(got, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read %s: %v", f.Name(), err)
	}
	return got[:n]
}

// size is striped over both data servers (1 MiB stripe unit) and goes
// through them rather than the MDS.
const orphanSize = 3<<20 + 12345

// TestUnlinkedOpenFile: client A has a file open, client B unlinks it
// (REMOVE, or RENAME over it). A keeps reading, writing and getting
// attributes of its open file; B sees the name gone (or naming the new
// file). The data goes when the last open goes: at A's (and C's) CLOSE.
func TestUnlinkedOpenFile(t *testing.T) {
	cases := []struct {
		name   string
		rename bool // B renames a new file over the open one
		second bool // client C holds the file open too and closes last
	}{
		{"remove", false, false},
		{"rename-over", true, false},
		{"remove-two-holders", false, true},
	}
	for _, be := range orphanBackends {
		for _, tc := range cases {
			t.Run(be.name+"/"+tc.name, func(t *testing.T) {
				env := be.start(t, 10*time.Second)
				ctx := t.Context()
				a, b := env.dial(env.addr), env.dial(env.addr)
				defer a.Close()
				defer b.Close()
				want := fill(orphanSize, 1)
				ino := writeFile(t, b, "/log", want)
				env.wantData(ino, "after write")

				af, err := a.Open(ctx, "/log", os.O_RDWR, 0)
				if err != nil {
					t.Fatalf("A open: %v", err)
				}
				var cf *client.File
				if tc.second {
					c := env.dial(env.addr)
					defer c.Close()
					if cf, err = c.Open(ctx, "/log", os.O_RDONLY, 0); err != nil {
						t.Fatalf("C open: %v", err)
					}
				}
				if got := readAll(t, af, orphanSize); !bytes.Equal(got, want) {
					t.Fatal("A read wrong data before the unlink")
				}

				if tc.rename {
					newer := fill(1000, 2)
					writeFile(t, b, "/log.new", newer)
					if err := b.Rename(ctx, "/log.new", "/log"); err != nil {
						t.Fatalf("B rename over the open file: %v", err)
					}
					bf, err := b.Open(ctx, "/log", os.O_RDONLY, 0)
					if err != nil {
						t.Fatal(err)
					}
					if got := readAll(t, bf, 1000); !bytes.Equal(got, newer) {
						t.Fatalf("B reads %d bytes of the new file, want the %d it wrote", len(got), len(newer))
					}
					bf.Close()
				} else {
					if err := b.Remove(ctx, "/log"); err != nil {
						t.Fatalf("B remove of a file A has open: %v", err)
					}
					if _, err := b.Stat(ctx, "/log"); !errors.Is(err, fs.ErrNotExist) {
						t.Fatalf("B stat after remove: %v, want not exist", err)
					}
					if _, err := a.Stat(ctx, "/log"); !errors.Is(err, fs.ErrNotExist) {
						t.Fatalf("A lookup after remove: %v, want not exist", err)
					}
				}
				env.wantOrphan(ino, "after the unlink")
				env.wantData(ino, "after the unlink")

				// A goes on as if nothing happened.
				if got := readAll(t, af, orphanSize); !bytes.Equal(got, want) {
					t.Fatal("A reads wrong data after the unlink")
				}
				tail := fill(2<<20, 3)
				if _, err := af.WriteAt(tail, orphanSize); err != nil {
					t.Fatalf("A write after the unlink: %v", err)
				}
				if err := af.Sync(); err != nil {
					t.Fatalf("A sync after the unlink: %v", err)
				}
				want = append(want, tail...)
				at, err := af.Stat(ctx)
				if err != nil {
					t.Fatalf("A fstat after the unlink: %v", err)
				}
				if at.Nlink != 0 || at.Size != uint64(len(want)) || at.Fileid != ino {
					t.Fatalf("A fstat after the unlink: %+v, want nlink 0, size %d, fileid %d", at, len(want), ino)
				}
				if got := readAll(t, af, len(want)); !bytes.Equal(got, want) {
					t.Fatal("A reads wrong data after writing to the unlinked file")
				}

				if cf != nil {
					if err := af.Close(); err != nil {
						t.Fatalf("A close: %v", err)
					}
					// C still holds it: nothing is freed.
					env.wantOrphan(ino, "after A's close, C holding")
					env.wantData(ino, "after A's close, C holding")
					if got := readAll(t, cf, len(want)); !bytes.Equal(got, want) {
						t.Fatal("C reads wrong data after A closed")
					}
					af = cf
				}
				if err := af.Close(); err != nil {
					t.Fatalf("last close: %v", err)
				}
				env.waitFreed(ino, "after the last close")
			})
		}
	}
}

// TestUnlinkedFileNotOpen: an unlinked file nobody holds open is gone for
// clients at once (its handle is stale), and its data and inode are
// freed in the background right after the REMOVE or RENAME answered.
func TestUnlinkedFileNotOpen(t *testing.T) {
	for _, be := range orphanBackends {
		for _, rename := range []bool{false, true} {
			name := be.name + "/remove"
			if rename {
				name = be.name + "/rename-over"
			}
			t.Run(name, func(t *testing.T) {
				env := be.start(t, 10*time.Second)
				ctx := t.Context()
				b := env.dial(env.addr)
				defer b.Close()
				ino := writeFile(t, b, "/f", fill(orphanSize, 4))
				fh, _, err := b.Lookup(ctx, "/f")
				if err != nil {
					t.Fatal(err)
				}
				if rename {
					writeFile(t, b, "/f.new", fill(1000, 5))
					err = b.Rename(ctx, "/f.new", "/f")
				} else {
					err = b.Remove(ctx, "/f")
				}
				if err != nil {
					t.Fatal(err)
				}
				if f, err := b.OpenHandle(ctx, fh, os.O_RDONLY); !errors.Is(err, syscall.ESTALE) {
					if err == nil {
						f.Close()
					}
					t.Fatalf("open by handle after the unlink: %v, want ESTALE", err)
				}
				env.waitFreedWithin(ino, 30*time.Second, "after the unlink")
				if o := env.orphans(); len(o) != 0 {
					t.Fatalf("orphans %v after unlinking a file nobody had open", o)
				}
			})
		}
	}
}

// TestManyUnlinkedFilesNotOpen: clients remove many files nobody holds
// open at the same time; the background frees keep up with them and
// every file's data and inode go.
func TestManyUnlinkedFilesNotOpen(t *testing.T) {
	const clients, files = 4, 25
	for _, be := range orphanBackends {
		t.Run(be.name, func(t *testing.T) {
			env := be.start(t, 10*time.Second)
			ctx := t.Context()
			cs := make([]*client.Client, clients)
			inos := make([][]uint64, clients)
			for i := range cs {
				cs[i] = env.dial(env.addr)
				defer cs[i].Close()
				if err := cs[i].Mkdir(ctx, fmt.Sprintf("/d%d", i), 0o755); err != nil {
					t.Fatal(err)
				}
				for j := range files {
					inos[i] = append(inos[i], writeFile(t, cs[i], fmt.Sprintf("/d%d/f%d", i, j), fill(4096, byte(j))))
				}
			}
			var wg sync.WaitGroup
			errs := make([]error, clients)
			for i, c := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range files {
						if err := c.Remove(ctx, fmt.Sprintf("/d%d/f%d", i, j)); err != nil {
							errs[i] = err
							return
						}
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for i := range cs {
				for _, ino := range inos[i] {
					env.waitFreedWithin(ino, 30*time.Second, "after concurrent removes")
				}
			}
			if o := env.orphans(); len(o) != 0 {
				t.Fatalf("orphans left: %v", o)
			}
		})
	}
}

// TestUnlinkedFileDeadHolder: the holder dies without closing; the remove
// does not wait for it, and the file goes when its lease expires.
func TestUnlinkedFileDeadHolder(t *testing.T) {
	for _, be := range orphanBackends {
		t.Run(be.name, func(t *testing.T) {
			env := be.start(t, 3*time.Second)
			ctx := t.Context()
			b := env.dial(env.addr)
			defer b.Close()
			want := fill(orphanSize, 5)
			ino := writeFile(t, b, "/held", want)

			proxy := newKillProxy(t, env.addr)
			a := env.dial(proxy.addr())
			defer a.Close() // after the kill: cannot reach the server
			af, err := a.Open(ctx, "/held", os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, af, orphanSize); !bytes.Equal(got, want) {
				t.Fatal("A read wrong data")
			}
			if err := b.Remove(ctx, "/held"); err != nil {
				t.Fatal(err)
			}
			env.wantOrphan(ino, "A alive")
			env.wantData(ino, "A alive")
			if got := readAll(t, af, orphanSize); !bytes.Equal(got, want) {
				t.Fatal("A read wrong data after the remove")
			}
			// A dies: no CLOSE, no lease renewal.
			proxy.kill()
			env.waitFreed(ino, "after A's lease expired")
		})
	}
}

// TestUnlinkedFileRestart: the server restarts while unlinked files are
// open. A, alive, reclaims its open (CLAIM_PREVIOUS by filehandle) and
// keeps reading; D, dead, reclaims nothing, and its file goes when the
// grace period ends; A's goes at A's close.
func TestUnlinkedFileRestart(t *testing.T) {
	for _, be := range orphanBackends {
		t.Run(be.name, func(t *testing.T) {
			// Grace, one lease, must outlast the restart of a cluster
			// and A's reclaim.
			env := be.start(t, 5*time.Second)
			ctx := t.Context()
			b := env.dial(env.addr)
			defer b.Close()
			wantA, wantD := fill(orphanSize, 6), fill(orphanSize, 7)
			inoA := writeFile(t, b, "/a", wantA)
			inoD := writeFile(t, b, "/d", wantD)

			a := env.dial(env.addr)
			defer a.Close()
			af, err := a.Open(ctx, "/a", os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			proxy := newKillProxy(t, env.addr)
			d := env.dial(proxy.addr())
			defer d.Close()
			df, err := d.Open(ctx, "/d", os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, df, orphanSize); !bytes.Equal(got, wantD) {
				t.Fatal("D read wrong data")
			}
			for _, p := range []string{"/a", "/d"} {
				if err := b.Remove(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			env.wantOrphan(inoA, "before the restart")
			env.wantOrphan(inoD, "before the restart")

			// D dies and the server restarts before D's lease runs out.
			proxy.kill()
			env.restart()
			env.wantOrphan(inoA, "after the restart")

			if got := readAll(t, af, orphanSize); !bytes.Equal(got, wantA) {
				t.Fatal("A reads wrong data after the restart")
			}
			if a.Stats().Recoveries == 0 {
				t.Fatalf("A did not recover its state after the restart: %+v", a.Stats())
			}
			// Nobody reclaims D's open: its file goes after grace.
			env.waitFreed(inoD, "unreclaimed, after grace")
			env.wantOrphan(inoA, "reclaimed, after grace")
			env.wantData(inoA, "reclaimed, after grace")
			if got := readAll(t, af, orphanSize); !bytes.Equal(got, wantA) {
				t.Fatal("A reads wrong data after grace")
			}
			if err := af.Close(); err != nil {
				t.Fatalf("A close: %v", err)
			}
			env.waitFreed(inoA, "after A's close")
		})
	}
}

// TestOrphanGracelessRestart: an orphan nobody holds open survives a
// crash between the unlink and the free (made here by unlinking through
// the engine, behind the server's back). With no client records there is
// no grace period after the restart, so the server frees it when it
// starts serving, not a lease later.
func TestOrphanGracelessRestart(t *testing.T) {
	const lease = time.Minute
	for _, be := range orphanBackends {
		t.Run(be.name, func(t *testing.T) {
			env := be.start(t, lease)
			b := env.dial(env.addr)
			ino := writeFile(t, b, "/g", fill(orphanSize, 8))
			// DESTROY_CLIENTID deletes b's record: nobody to wait for.
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			nd, _, err := env.srv().Meta().Remove(t.Context(), meta.RootIno, "g", time.Time{})
			if err != nil || nd.Ino != meta.Ino(ino) {
				t.Fatalf("engine remove: %+v, %v", nd, err)
			}
			env.wantOrphan(ino, "unlinked behind the server's back")
			env.wantData(ino, "unlinked behind the server's back")
			start := time.Now()
			env.restart()
			env.waitFreedWithin(ino, lease/2, "after a graceless restart")
			t.Logf("freed %v after the restart began", time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestUnlinkRacesOpen races REMOVE against OPENs of the file by name
// (CLAIM_NULL) and by filehandle (CLAIM_FH) from another client, and the
// two resulting CLOSEs against each other. Whichever way each race goes,
// an OPEN that succeeds has a file that stays readable until its close,
// and every file is freed exactly once, after its last close.
func TestUnlinkRacesOpen(t *testing.T) {
	const rounds = 30
	for _, be := range orphanBackends {
		t.Run(be.name, func(t *testing.T) {
			env := be.start(t, 10*time.Second)
			ctx := t.Context()
			a, b := env.dial(env.addr), env.dial(env.addr)
			defer a.Close()
			defer b.Close()
			opened := 0
			for i := range rounds {
				path := fmt.Sprintf("/race%d", i)
				want := fill(100<<10, byte(i))
				ino := writeFile(t, b, path, want)
				fh, _, err := b.Lookup(ctx, path)
				if err != nil {
					t.Fatal(err)
				}
				var (
					wg             sync.WaitGroup
					byName, byFH   *client.File
					nameErr, fhErr error
					rmErr          error
				)
				wg.Add(3)
				go func() { defer wg.Done(); byName, nameErr = a.Open(ctx, path, os.O_RDONLY, 0) }()
				go func() { defer wg.Done(); byFH, fhErr = a.OpenHandle(ctx, fh, os.O_RDONLY) }()
				go func() { defer wg.Done(); rmErr = b.Remove(ctx, path) }()
				wg.Wait()
				if rmErr != nil {
					t.Fatalf("round %d: remove: %v", i, rmErr)
				}
				if nameErr != nil && !errors.Is(nameErr, fs.ErrNotExist) {
					t.Fatalf("round %d: open by name: %v", i, nameErr)
				}
				if fhErr != nil && !errors.Is(fhErr, syscall.ESTALE) {
					t.Fatalf("round %d: open by handle: %v", i, fhErr)
				}
				var files []*client.File
				for _, f := range []*client.File{byName, byFH} {
					if f == nil {
						continue
					}
					files = append(files, f)
					if got := readAll(t, f, len(want)); !bytes.Equal(got, want) {
						t.Fatalf("round %d: %s read %d bytes, want the %d written", i, f.Name(), len(got), len(want))
					}
					if at, err := f.Stat(ctx); err != nil || at.Nlink != 0 {
						t.Fatalf("round %d: fstat of the open file after the remove: %+v, %v", i, at, err)
					}
				}
				opened += len(files)
				if len(files) > 0 {
					env.wantOrphan(ino, fmt.Sprintf("round %d, open", i))
				}
				closeErrs := make([]error, len(files))
				for j, f := range files {
					wg.Add(1)
					go func() { defer wg.Done(); closeErrs[j] = f.Close() }()
				}
				wg.Wait()
				if err := errors.Join(closeErrs...); err != nil {
					t.Fatalf("round %d: close: %v", i, err)
				}
				env.waitFreed(ino, fmt.Sprintf("round %d, closed", i))
			}
			t.Logf("%d of %d opens won the race against the remove", opened, 2*rounds)
			if o := env.orphans(); len(o) != 0 {
				t.Fatalf("orphans left: %v", o)
			}
		})
	}
}

// killProxy forwards TCP connections to a server until kill, which resets
// them and refuses new ones: to the server, the client behind it crashed.
type killProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	killed bool
	wg     sync.WaitGroup
}

func newKillProxy(t *testing.T, target string) *killProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &killProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { p.kill(); p.wg.Wait() })
	return p
}

func (p *killProxy) addr() string { return p.ln.Addr().String() }

func (p *killProxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		sc, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			cc.Close()
			continue
		}
		p.mu.Lock()
		if p.killed {
			p.mu.Unlock()
			cc.Close()
			sc.Close()
			return
		}
		p.conns = append(p.conns, cc, sc)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(cc, sc)
		go p.pipe(sc, cc)
	}
}

func (p *killProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	io.Copy(dst, src)
	dst.Close()
	src.Close()
}

func (p *killProxy) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed {
		return
	}
	p.killed = true
	p.ln.Close()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // reset, not an orderly close
		}
		c.Close()
	}
}
