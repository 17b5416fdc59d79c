package flexv3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/flexv3"
	"github.com/shoalfs/shoal/internal/ganeshatest"
	"github.com/shoalfs/shoal/internal/nfs3"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

func TestParseServer(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want flexv3.Server
		err  bool
	}{
		{in: "127.0.0.1:2049/export", want: flexv3.Server{Addr: "127.0.0.1:2049", MountAddr: "127.0.0.1:2049", Path: "/export", Advertise: "127.0.0.1:2049"}},
		{in: "10.0.0.1:20490/srv/ds?mount=20491&advertise=10.0.2.2:20490",
			want: flexv3.Server{Addr: "10.0.0.1:20490", MountAddr: "10.0.0.1:20491", Path: "/srv/ds", Advertise: "10.0.2.2:20490"}},
		{in: "[::1]:2049/e", want: flexv3.Server{Addr: "[::1]:2049", MountAddr: "[::1]:2049", Path: "/e", Advertise: "[::1]:2049"}},
		{in: "127.0.0.1:2049", err: true},
		{in: "127.0.0.1/export", err: true},
		{in: "127.0.0.1:0/export", err: true},
		{in: "127.0.0.1:2049/e?mount=x", err: true},
		{in: "127.0.0.1:2049/e?bogus=1", err: true},
		{in: "u@127.0.0.1:2049/e", err: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := flexv3.ParseServer(tc.in)
			if tc.err {
				if err == nil {
					t.Fatalf("parsed as %+v", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			if again, err := flexv3.ParseServer(got.String()); err != nil || again != got {
				t.Fatalf("String %q parses as %+v, %v", got.String(), again, err)
			}
		})
	}
}

// cluster is two NFS-Ganesha NFSv3 servers in a network namespace.
type cluster struct {
	ns      *ganeshatest.Netns
	servers []*ganeshatest.Server
}

func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	if why := ganeshatest.Available(); why != "" {
		t.Skip("ganesha: " + why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ns, err := ganeshatest.NewNetns(ctx, fmt.Sprintf("shoal-fv3-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	c := &cluster{ns: ns}
	for i := range n {
		srv, err := ganeshatest.Start(ctx, ns, t.TempDir(), 20500+10*i)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		c.servers = append(c.servers, srv)
	}
	return c
}

func (c *cluster) config() flexv3.Config {
	cfg := flexv3.Config{Dial: c.ns.Dial}
	for _, s := range c.servers {
		cfg.Servers = append(cfg.Servers, flexv3.Server{Addr: s.Addr(), MountAddr: s.MountAddr(), Path: s.Path, Advertise: s.Addr()})
	}
	return cfg
}

// asClient returns an NFSv3 client of server i calling with uid and gid,
// as a client holding a layout with those ids would.
func (c *cluster) asClient(t *testing.T, i int, uid, gid uint32) *nfs3.Client {
	t.Helper()
	cl, err := nfs3.Dial(context.Background(), c.servers[i].Addr(), nfs3.Options{Dial: c.ns.Dial, UID: uid, GID: gid})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func ids(t *testing.T, ds nfs4.FfDataServer4) (uid, gid uint32) {
	t.Helper()
	u, err1 := strconv.ParseUint(string(ds.FfdsUser), 10, 32)
	g, err2 := strconv.ParseUint(string(ds.FfdsGroup), 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("ffds_user %q, ffds_group %q: not numbers", ds.FfdsUser, ds.FfdsGroup)
	}
	return uint32(u), uint32(g)
}

func denied(err error) bool {
	s := nfs3.Status(err)
	return s == nfs3.NFS3ERR_ACCES || s == nfs3.NFS3ERR_PERM
}

// TestStore runs the loosely coupled store on two real NFS-Ganesha
// servers: data files created with synthetic owners on both, I/O through
// the MDS, the layouts' entries and devices, what the data servers let
// the layouts' credentials do, fencing by owner change, truncation and
// removal.
func TestStore(t *testing.T) {
	c := startCluster(t, 2)
	ctx := context.Background()
	st, err := flexv3.New(c.config())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	const ino = 7
	if _, err := st.Open(ino, false); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open without create of a new file: %v, want fs.ErrNotExist", err)
	}
	f, err := st.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20+12345)
	rand.Read(data)
	if n, err := f.WriteAt(data, 0); err != nil || n != len(data) {
		t.Fatalf("WriteAt: %d, %v", n, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 0); err != nil || n != len(data) || !bytes.Equal(got, data) {
		t.Fatalf("ReadAt: %d, %v, equal %v", n, err, bytes.Equal(got, data))
	}
	if sz, err := f.Size(); err != nil || sz != int64(len(data)) {
		t.Fatalf("Size: %d, %v", sz, err)
	}

	owner, err := st.Owner(ctx, ino)
	if err != nil {
		t.Fatal(err)
	}
	// Both data files on the host: the bytes, the synthetic owner and
	// group, mode 0640.
	for i, srv := range c.servers {
		p := filepath.Join(srv.Export, "shoal-"+strconv.Itoa(ino))
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(b, data) {
			t.Fatalf("server %d's data file: %d bytes, %v", i, len(b), err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		sys := fi.Sys().(*syscall.Stat_t)
		if sys.Uid != owner || sys.Gid != st.GID(ino) || fi.Mode().Perm() != flexv3.DataFileMode {
			t.Fatalf("server %d's data file: uid %d gid %d mode %v; want %d %d %o", i, sys.Uid, sys.Gid, fi.Mode().Perm(), owner, st.GID(ino), flexv3.DataFileMode)
		}
	}

	rw, err := st.Layout(ctx, ino, true, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := st.Layout(ctx, ino, false, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(rw.FflMirrors) != 2 || rw.FflFlags != 0 {
		t.Fatalf("layout: %d mirrors, flags %#x", len(rw.FflMirrors), rw.FflFlags)
	}
	seen := map[[16]byte]bool{}
	for j, m := range rw.FflMirrors {
		if len(m.FfmDataServers) != 1 {
			t.Fatalf("mirror %d: %d data servers", j, len(m.FfmDataServers))
		}
		ds := m.FfmDataServers[0]
		if ds.FfdsStateid != (nfs4.Stateid4{}) {
			t.Errorf("mirror %d: stateid %v, want the anonymous one", j, ds.FfdsStateid)
		}
		if uid, gid := ids(t, ds); uid != owner || gid != st.GID(ino) {
			t.Errorf("mirror %d read/write ids %d/%d, want %d/%d", j, uid, gid, owner, st.GID(ino))
		}
		if uid, _ := ids(t, ro.FflMirrors[j].FfmDataServers[0]); uid != st.ReadOnlyUID(ino) || uid == owner {
			t.Errorf("mirror %d read-only uid %d, want %d", j, uid, st.ReadOnlyUID(ino))
		}
		seen[ds.FfdsDeviceid] = true
		body, ok, err := st.DeviceAddr(ds.FfdsDeviceid)
		if err != nil || !ok {
			t.Fatalf("DeviceAddr: %v %v", ok, err)
		}
		var da nfs4.FfDeviceAddr4
		if err := xdr.Unmarshal(body, &da); err != nil {
			t.Fatal(err)
		}
		v := da.FfdaVersions
		if len(v) != 1 || v[0].FfdvVersion != 3 || v[0].FfdvMinorversion != 0 || v[0].FfdvTightlyCoupled {
			t.Errorf("device versions %+v, want NFSv3 loosely coupled", v)
		}
		if len(da.FfdaNetaddrs) != 1 || da.FfdaNetaddrs[0].NaRNetid != "tcp" {
			t.Errorf("device addresses %+v", da.FfdaNetaddrs)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("the mirrors share a data server: %v", seen)
	}
	if _, ok, _ := st.DeviceAddr([16]byte{1}); ok {
		t.Error("a foreign device id is the store's")
	}

	// What each layout's credentials may do on each data server, with the
	// layout's own handle (the device of mirror j is server j's).
	server := func(dev [16]byte) int {
		for i, d := range st.Devices() {
			if d == dev {
				return i
			}
		}
		t.Fatalf("unknown device %x", dev)
		return -1
	}
	io := func(l nfs4.FfLayout4, j int, write bool) error {
		ds := l.FflMirrors[j].FfmDataServers[0]
		uid, gid := ids(t, ds)
		cl := c.asClient(t, server(ds.FfdsDeviceid), uid, gid)
		if write {
			_, err := cl.Write(ctx, ds.FfdsFhVers[0], 0, data[:4096], nfs3.FILE_SYNC)
			return err
		}
		_, _, err := cl.Read(ctx, ds.FfdsFhVers[0], 0, 4096)
		return err
	}
	for j := range 2 {
		if err := io(rw, j, true); err != nil {
			t.Errorf("mirror %d: read/write layout's WRITE: %v", j, err)
		}
		if err := io(ro, j, false); err != nil {
			t.Errorf("mirror %d: read layout's READ: %v", j, err)
		}
		if err := io(ro, j, true); !denied(err) {
			t.Errorf("mirror %d: read layout's WRITE: %v, want an access error", j, err)
		}
	}

	// Fence: a fresh owner; the old layout's credentials are refused, a
	// new layout carries the new owner and works.
	newOwner, err := st.Fence(ctx, ino)
	if err != nil {
		t.Fatal(err)
	}
	if newOwner == owner {
		t.Fatal("fence kept the owner")
	}
	rw2, err := st.Layout(ctx, ino, true, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for j := range 2 {
		if err := io(rw, j, true); !denied(err) {
			t.Errorf("mirror %d: fenced layout's WRITE: %v, want an access error", j, err)
		}
		if uid, _ := ids(t, rw2.FflMirrors[j].FfmDataServers[0]); uid != newOwner {
			t.Errorf("mirror %d: new layout's uid %d, want %d", j, uid, newOwner)
		}
		if err := io(rw2, j, true); err != nil {
			t.Errorf("mirror %d: new layout's WRITE: %v", j, err)
		}
	}
	// A restarted MDS (a new Store) learns the owner from the data files.
	st2, err := flexv3.New(c.config())
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if o, err := st2.Owner(ctx, ino); err != nil || o != newOwner {
		t.Fatalf("a new store sees owner %d, %v; want %d", o, err, newOwner)
	}

	if err := st.Truncate(ino, 1000); err != nil {
		t.Fatal(err)
	}
	for i, srv := range c.servers {
		if fi, err := os.Stat(filepath.Join(srv.Export, "shoal-"+strconv.Itoa(ino))); err != nil || fi.Size() != 1000 {
			t.Fatalf("server %d after Truncate: %v, %v", i, fi, err)
		}
	}
	if err := st.Remove(ino); err != nil {
		t.Fatal(err)
	}
	for i, srv := range c.servers {
		if _, err := os.Stat(filepath.Join(srv.Export, "shoal-"+strconv.Itoa(ino))); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("server %d after Remove: %v", i, err)
		}
	}
	if err := st.Remove(ino); err != nil {
		t.Fatalf("Remove of a removed file: %v", err)
	}
}
