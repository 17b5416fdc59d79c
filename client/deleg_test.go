package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/server"
)

// delegServer is a server that grants read delegations: Shoal's own (with
// delegations on, the default) and, with SHOAL_GANESHA=1, NFS-Ganesha
// (scripts/ganesha.sh turns them on).
type delegServer struct {
	name string
	addr string
	root string
}

// startShoalLease runs Shoal's server in-process with the given lease
// (0: the default), delegations on.
func startShoalLease(tb testing.TB, lease time.Duration) string {
	tb.Helper()
	noSquash := false
	srv, err := server.New(server.Config{
		Dir:     tb.TempDir(),
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}},
		Lease:   lease,
		Logger:  quietLogger(),
	})
	if err != nil {
		tb.Fatalf("server.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		srv.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			tb.Error("server did not stop within 10s")
		}
	})
	return ln.Addr().String()
}

func delegServers(t *testing.T, lease time.Duration) []delegServer {
	srvs := []delegServer{{name: "shoal", addr: startShoalLease(t, lease), root: "/"}}
	if os.Getenv("SHOAL_GANESHA") == "1" {
		srvs = append(srvs, delegServer{name: "ganesha", addr: ganeshaAddr(t), root: "/export"})
	}
	return srvs
}

func dialOpts(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	c := dialer(addr, opts)(t)
	t.Cleanup(func() { c.Close() })
	return c
}

// makeFiles creates n files of size bytes under dir (a new directory)
// and returns their handles as c2 sees them.
func makeFiles(t *testing.T, ctx context.Context, w, r *client.Client, dir string, n, size int) [][]byte {
	t.Helper()
	if err := w.Mkdir(ctx, dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		f, err := w.Open(ctx, fmt.Sprintf("%s/f%03d", dir, i), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(i)}, size), 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	dfh, _, err := r.Lookup(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := r.ReadDirHandle(ctx, dfh)
	if err != nil {
		t.Fatal(err)
	}
	fhs := make([][]byte, 0, n)
	for _, e := range ents {
		if e.Handle == nil {
			t.Fatalf("readdir returned no handle for %s", e.Name)
		}
		fhs = append(fhs, e.Handle)
	}
	if len(fhs) != n {
		t.Fatalf("readdir: %d entries, want %d", len(fhs), n)
	}
	return fhs
}

// pass opens, reads and closes every file once (by handle or by path)
// and returns the operations it sent.
func pass(t *testing.T, ctx context.Context, c *client.Client, fhs [][]byte, paths []string, size int) map[string]uint64 {
	t.Helper()
	before := c.OpCounts()
	buf := make([]byte, size)
	for i := range max(len(fhs), len(paths)) {
		var f *client.File
		var err error
		if fhs != nil {
			f, err = c.OpenHandle(ctx, fhs[i], os.O_RDONLY)
		} else {
			f, err = c.Open(ctx, paths[i], os.O_RDONLY, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		if n, err := f.ReadAt(buf, 0); n != size || (err != nil && !errors.Is(err, io.EOF)) {
			t.Fatalf("read %s: %d, %v", f.Name(), n, err)
		}
		if _, err := f.Stat(ctx); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	after := c.OpCounts()
	d := map[string]uint64{}
	for k, v := range after {
		if v > before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// TestDelegationCounts opens, reads, stats and closes 200 small files
// twice, with delegations and without, and compares the operations the
// second pass sends. Rerun it with -v to see the counts.
func TestDelegationCounts(t *testing.T) {
	const nfiles, size = 200, 512
	for _, srv := range delegServers(t, 0) {
		t.Run(srv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			w := dialOpts(t, srv.addr, client.Options{Root: srv.root, NoDelegations: true})
			dir := fmt.Sprintf("/deleg-counts-%d", time.Now().UnixNano())
			t.Cleanup(func() { w.RemoveAll(context.Background(), dir) })
			probe := dialOpts(t, srv.addr, client.Options{Root: srv.root, NoDelegations: true})
			fhs := makeFiles(t, ctx, w, probe, dir, nfiles, size)
			paths := make([]string, nfiles)
			for i := range paths {
				paths[i] = fmt.Sprintf("%s/f%03d", dir, i)
			}
			for _, by := range []string{"handle", "path"} {
				for _, acc := range []client.Access{client.AccessDirect, client.AccessCached} {
					second := map[bool]map[string]uint64{}
					for _, deleg := range []bool{false, true} {
						c := dialOpts(t, srv.addr, client.Options{Root: srv.root, NoDelegations: !deleg,
							Policy: client.Policy{Access: acc}})
						h, p := fhs, []string(nil)
						if by == "path" {
							h, p = nil, paths
						}
						first := pass(t, ctx, c, h, p, size)
						second[deleg] = pass(t, ctx, c, h, p, size)
						st := c.Stats()
						t.Logf("by %s, %s, delegations %v: first pass %v; second pass %v; kept %d local opens %d attr hits %d",
							by, acc, deleg, first, second[deleg], st.DelegationsKept, st.LocalOpens, st.DelegatedAttrHits)
						if err := c.Close(); err != nil {
							t.Fatal(err)
						}
						if deleg && st.DelegationsKept == 0 {
							t.Skipf("%s granted no read delegation (NFS-Ganesha's VFS backend has no delegation support)", srv.name)
						}
						if deleg && c.Stats().DelegationReturns < st.DelegationsKept {
							t.Errorf("Close returned %d of %d delegations", c.Stats().DelegationReturns, st.DelegationsKept)
						}
					}
					on, off := second[true], second[false]
					if by == "handle" && on["OPEN"]+on["GETATTR"] > (off["OPEN"]+off["GETATTR"])/4 {
						t.Errorf("by handle, %s: second pass sent OPEN %d GETATTR %d with delegations, OPEN %d GETATTR %d without",
							acc, on["OPEN"], on["GETATTR"], off["OPEN"], off["GETATTR"])
					}
					if on["SEQUENCE"] > off["SEQUENCE"] {
						t.Errorf("by %s, %s: more COMPOUNDs with delegations (%d) than without (%d)", by, acc, on["SEQUENCE"], off["SEQUENCE"])
					}
				}
			}
		})
	}
}

// TestDelegationRecall: a reader holds a read delegation and a File opened
// under it; a second client opens the file for writing, the server
// recalls the delegation, the reader returns it, and both see the
// writer's data afterwards, with every access method.
func TestDelegationRecall(t *testing.T) {
	for _, srv := range delegServers(t, 0) {
		for _, acc := range []client.Access{client.AccessDirect, client.AccessODirect, client.AccessCached} {
			t.Run(srv.name+"/"+acc.String(), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
				defer cancel()
				w := dialOpts(t, srv.addr, client.Options{Root: srv.root})
				path := fmt.Sprintf("/deleg-recall-%s-%d", acc, time.Now().UnixNano())
				t.Cleanup(func() { w.Remove(context.Background(), path) })
				v1, v2 := bytes.Repeat([]byte("1"), 3000), bytes.Repeat([]byte("two"), 2000)
				writeAll(t, ctx, w, path, v1)

				r := dialOpts(t, srv.addr, client.Options{Root: srv.root, Policy: client.Policy{Access: acc}})
				fh, _, err := r.Lookup(ctx, path)
				if err != nil {
					t.Fatal(err)
				}
				f1, err := r.OpenHandle(ctx, fh, os.O_RDONLY)
				if err != nil {
					t.Fatal(err)
				}
				checkRead(t, f1, v1)
				if err := f1.Close(); err != nil {
					t.Fatal(err)
				}
				if r.Delegations() != 1 {
					noDelegations(t, srv, r)
				}
				ops := r.OpCounts()
				f2, err := r.OpenHandle(ctx, fh, os.O_RDONLY) // under the delegation
				if err != nil {
					t.Fatal(err)
				}
				if got := r.OpCounts()["OPEN"]; got != ops["OPEN"] {
					t.Errorf("open under a delegation sent %d OPENs", got-ops["OPEN"])
				}
				checkRead(t, f2, v1)

				// The conflicting open waits (NFS4ERR_DELAY) until the
				// reader has returned the delegation.
				writeAll(t, ctx, w, path, v2)
				st := r.Stats()
				if st.DelegationRecalls != 1 || st.DelegationReturns != 1 || r.Delegations() != 0 {
					t.Errorf("reader: %d recalls, %d returns, %d held; want 1, 1, 0", st.DelegationRecalls, st.DelegationReturns, r.Delegations())
				}
				// f2 is an open on the server now (CLAIM_DELEG_CUR_FH).
				buf := make([]byte, len(v2))
				if _, err := f2.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
					t.Errorf("read after the recall: %v", err)
				}
				if acc == client.AccessDirect && !bytes.Equal(buf, v2) {
					t.Errorf("direct read after the recall does not see the writer's data")
				}
				closes := r.OpCounts()["CLOSE"]
				if err := f2.Close(); err != nil {
					t.Errorf("close after the recall: %v", err)
				}
				if r.OpCounts()["CLOSE"] != closes+1 {
					t.Errorf("close of a File reopened at the recall sent no CLOSE")
				}
				f3, err := r.OpenHandle(ctx, fh, os.O_RDONLY)
				if err != nil {
					t.Fatal(err)
				}
				checkRead(t, f3, v2)
				if a, err := f3.Stat(ctx); err != nil || a.Size != uint64(len(v2)) {
					t.Errorf("stat after the recall: size %d, %v; want %d", a.Size, err, len(v2))
				}
				if err := f3.Close(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestDelegationRevoked: a reader that does not return a recalled
// delegation has it revoked; it notices from SEQUENCE's status flags,
// frees the stateid, and its File opened under the delegation goes on
// working as a server open.
func TestDelegationRevoked(t *testing.T) {
	for _, srv := range delegServers(t, 3*time.Second) {
		t.Run(srv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			w := dialOpts(t, srv.addr, client.Options{Root: srv.root})
			path := fmt.Sprintf("/deleg-revoked-%d", time.Now().UnixNano())
			t.Cleanup(func() { w.Remove(context.Background(), path) })
			v1, v2 := []byte("before the revocation"), []byte("after the revocation!")
			writeAll(t, ctx, w, path, v1)

			r := dialOpts(t, srv.addr, client.Options{Root: srv.root})
			client.IgnoreRecalls(r)
			fh, _, err := r.Lookup(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			f1, err := r.OpenHandle(ctx, fh, os.O_RDONLY)
			if err != nil {
				t.Fatal(err)
			}
			if err := f1.Close(); err != nil {
				t.Fatal(err)
			}
			f2, err := r.OpenHandle(ctx, fh, os.O_RDONLY)
			if err != nil {
				t.Fatal(err)
			}
			if r.Stats().LocalOpens != 1 {
				noDelegations(t, srv, r)
			}
			writeAll(t, ctx, w, path, v2) // waits for the revocation
			// The reader learns of it at its next SEQUENCE.
			for i := 0; i < 100 && (r.Stats().DelegationsRevoked == 0 || r.Delegations() != 0); i++ {
				if _, err := r.StatHandle(ctx, fh); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if st := r.Stats(); st.DelegationsRevoked != 1 || r.Delegations() != 0 {
				t.Fatalf("reader: %d revoked, %d held; want 1, 0", st.DelegationsRevoked, r.Delegations())
			}
			checkRead(t, f2, v2)
			if err := f2.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
}

// noDelegations ends a test that needs a delegation the server did not
// grant: a failure with Shoal's server, a skip with NFS-Ganesha, whose VFS
// backend does not support delegations whatever its configuration says
// (its log at FULL_DEBUG: "Delegation type not supported").
func noDelegations(t *testing.T, srv delegServer, r *client.Client) {
	t.Helper()
	if srv.name == "shoal" {
		t.Fatalf("Shoal granted no read delegation (client stats %+v)", r.Stats())
	}
	t.Skipf("%s granted no read delegation", srv.name)
}

func writeAll(t *testing.T, ctx context.Context, c *client.Client, path string, data []byte) {
	t.Helper()
	f, err := c.Open(ctx, path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatalf("open %s for writing: %v", path, err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func checkRead(t *testing.T, f *client.File, want []byte) {
	t.Helper()
	buf := make([]byte, len(want)+10)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read %s: %v", f.Name(), err)
	}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("read %s: %q, want %q", f.Name(), buf[:n], want)
	}
}

// localOpen returns a File of path opened by r under a read delegation
// (an OPEN, a CLOSE, then an open without OPEN).
func localOpen(t *testing.T, ctx context.Context, srv delegServer, r *client.Client, path string) *client.File {
	t.Helper()
	fh, _, err := r.Lookup(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	f1, err := r.OpenHandle(ctx, fh, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	if err := f1.Close(); err != nil {
		t.Fatal(err)
	}
	local := r.Stats().LocalOpens
	f2, err := r.OpenHandle(ctx, fh, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	if r.Stats().LocalOpens != local+1 {
		f2.Close()
		noDelegations(t, srv, r)
	}
	return f2
}

// TestDelegationLock: a byte-range lock needs an open stateid, so a File
// opened under a delegation is opened on the server first
// (CLAIM_DELEG_CUR_FH), and keeps the delegation.
func TestDelegationLock(t *testing.T) {
	for _, srv := range delegServers(t, 0) {
		t.Run(srv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			r := dialOpts(t, srv.addr, client.Options{Root: srv.root})
			path := fmt.Sprintf("/deleg-lock-%d", time.Now().UnixNano())
			t.Cleanup(func() { r.Remove(context.Background(), path) })
			writeAll(t, ctx, r, path, []byte("locked"))
			f := localOpen(t, ctx, srv, r, path)
			opens := r.OpCounts()["OPEN"]
			if err := f.Lock(ctx, 0, 0, false, false); err != nil {
				t.Fatalf("read lock on a File opened under a delegation: %v", err)
			}
			if got := r.OpCounts()["OPEN"] - opens; got != 1 {
				t.Errorf("lock sent %d OPENs, want 1 (CLAIM_DELEG_CUR_FH)", got)
			}
			checkRead(t, f, []byte("locked"))
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if r.Delegations() != 1 {
				t.Errorf("delegation lost with the lock: %d held", r.Delegations())
			}
		})
	}
}

// TestDelegationServerRestart: a restart of Shoal's server loses the
// delegations; the client drops them, reclaims the File it opened under
// one as an ordinary open, and goes on.
func TestDelegationServerRestart(t *testing.T) {
	dir := t.TempDir()
	noSquash := false
	cfg := server.Config{Dir: dir, Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}}, Lease: 3 * time.Second,
		Logger: quietLogger()}
	start := func(addr string) (*server.Server, chan error, string) {
		srv, err := server.New(cfg)
		if err != nil {
			t.Fatalf("server.New: %v", err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		return srv, done, ln.Addr().String()
	}
	srv, done, addr := start("127.0.0.1:0")
	t.Cleanup(func() { srv.Close(); <-done })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	r := dialOpts(t, addr, client.Options{})
	writeAll(t, ctx, r, "/restarted", []byte("survives"))
	f := localOpen(t, ctx, delegServer{name: "shoal", addr: addr, root: "/"}, r, "/restarted")

	srv.Close()
	<-done
	srv, done, _ = start(addr)

	checkRead(t, f, []byte("survives"))
	if st := r.Stats(); st.Recoveries == 0 || r.Delegations() != 0 {
		t.Errorf("after the restart: %d recoveries, %d delegations held; want >0, 0", st.Recoveries, r.Delegations())
	}
	closes := r.OpCounts()["CLOSE"]
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if r.OpCounts()["CLOSE"] != closes+1 {
		t.Errorf("close of a File reclaimed after the restart sent no CLOSE")
	}
}
