package cluster

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/pnfs"
)

// TestFullRestart restarts the MDS and every DS at once, the DSes
// registering again in some order: each is known by its persistent ID, so
// placement and every file's stripe map are those of before, whatever the
// order.
func TestFullRestart(t *testing.T) {
	for _, tt := range []struct {
		name  string
		order []int // of the DSes registering again
	}{
		{"same order", []int{0, 1, 2, 3}},
		{"reverse order", []int{3, 2, 1, 0}},
		{"interleaved", []int{2, 0, 3, 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newCluster(t, 4)
			s := tc.striped(8192)
			ino := tc.newFile()
			data := pattern(200_000, 5)
			writeAll(t, s, ino, data, 999)
			m := stripeMap(t, s, ino)
			placement, cid := tc.reg.Placement(), tc.reg.ClusterID()

			for _, a := range tc.agents {
				a.Close()
			}
			tc.reg.Close()
			<-tc.serveCh

			ln, err := net.Listen("tcp", tc.addr)
			if err != nil {
				t.Fatal(err)
			}
			tc.startRegistry(ln)
			// Every DS is known, out of service, before any registers.
			dss := tc.reg.DataServers()
			if len(dss) != 4 {
				t.Fatalf("%d data servers before re-registration", len(dss))
			}
			for i, ds := range dss {
				if ds.ID != placement[i] || ds.Up || ds.State != Active {
					t.Errorf("data server %d = %+v before re-registration", i, ds)
				}
			}
			if p := tc.reg.Placement(); len(p) != 0 {
				t.Errorf("Placement %v with no DS registered", p)
			}
			s = tc.striped(8192)
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			defer cancel()
			// Within DownAfter of the restart, a file on absent DSes is to
			// be retried, not failed.
			if _, err := s.Layout(ctx, ino); !errors.Is(err, pnfs.ErrUnavailable) || errors.Is(err, pnfs.ErrDataServerDown) {
				t.Errorf("Layout before re-registration = %v, want pnfs.ErrUnavailable", err)
			}
			old, oldStores := tc.agents, tc.stores
			tc.agents, tc.stores = nil, nil
			for _, i := range tt.order {
				// The DS presents the cluster id it was given, as
				// wiring keeps it in the directory.
				cfg := tc.agentConfig(old[i].ID(), oldStores[i])
				cfg.ClusterID = old[i].ClusterID()
				tc.startAgentWith(cfg, oldStores[i])
			}
			if err := tc.reg.WaitFor(ctx, 4); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(tc.reg.ClusterID(), cid) {
				t.Errorf("cluster id %x after the restart, %x before", tc.reg.ClusterID(), cid)
			}
			if p := tc.reg.Placement(); !slices.Equal(p, placement) {
				t.Errorf("Placement %v after registering in order %v, %v before", p, tt.order, placement)
			}
			if got := stripeMap(t, s, ino); !got.Equal(m) {
				t.Errorf("stripe map %+v after a full restart, %+v before", got, m)
			}
			if got := readAll(t, s, ino, len(data), 999); !bytes.Equal(got, data) {
				t.Error("data differs after a full restart")
			}
			// A newcomer is placed after the others.
			tc.addAgent("new")
			if p := tc.reg.Placement(); !slices.Equal(p, append(slices.Clone(placement), "new")) {
				t.Errorf("Placement %v after a newcomer", p)
			}
		})
	}
}

// TestJoinKeepsFiles: a data server joining changes nothing for files
// that have a stripe map, whether their data was written before or after
// it joined; files placed afterwards are striped over it too.
func TestJoinKeepsFiles(t *testing.T) {
	const unit = 4096
	tc := newCluster(t, 2)
	s := tc.striped(unit)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	type file struct {
		ino    uint64
		data   []byte
		m      pnfs.FileLayout
		before []string // the map's data servers
	}
	var files []file
	for i := range 3 {
		ino := tc.newFile()
		data := pattern(10*unit+17, byte(i))
		writeAll(t, s, ino, data, 0)
		l, err := s.Layout(ctx, ino)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, file{ino, data, l, stripeMap(t, s, ino).DataServers})
	}
	// Placed (by LAYOUTGET) but never written before the join.
	placedOnly := tc.newFile()
	if _, err := s.Layout(ctx, placedOnly); err != nil {
		t.Fatal(err)
	}

	_, newStore := tc.agent(tc.addAgent("c").ID())
	if p := tc.reg.Placement(); !slices.Equal(p, []string{"ds0", "ds1", "c"}) {
		t.Fatalf("Placement after the join: %v", p)
	}
	for _, tt := range []struct {
		name string
		s    *Striped
	}{
		{"same Striped", s},
		{"new Striped", tc.striped(unit)}, // no cached maps: read from the engine
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, f := range files {
				m := stripeMap(t, tt.s, f.ino)
				if !slices.Equal(m.DataServers, f.before) || m.Gen != 1 {
					t.Errorf("ino %d: map %+v after a join, was over %v", f.ino, m, f.before)
				}
				if got := readAll(t, tt.s, f.ino, len(f.data), 0); !bytes.Equal(got, f.data) {
					t.Errorf("ino %d reads back differently after a join", f.ino)
				}
				l, err := tt.s.Layout(ctx, f.ino)
				if err != nil || l.Count != 2 || l.First != f.m.First || l.Unit != unit {
					t.Errorf("ino %d: layout %+v, %v after a join; was %+v", f.ino, l, err, f.m)
				}
				if localObject(t, newStore, f.ino) != nil {
					t.Errorf("ino %d has an object on the new data server", f.ino)
				}
			}
			if m := stripeMap(t, tt.s, placedOnly); len(m.DataServers) != 2 {
				t.Errorf("a file placed before the join and written after: map %+v", m)
			}
		})
	}
	// Writing the placed file after the join keeps it where it was placed.
	data := pattern(8*unit, 9)
	writeAll(t, s, placedOnly, data, 0)
	if localObject(t, newStore, placedOnly) != nil {
		t.Error("a file placed before the join wrote to the new data server")
	}
	// A file placed after the join uses all three.
	ino := tc.newFile()
	writeAll(t, s, ino, data, 0)
	if m := stripeMap(t, s, ino); !slices.Equal(m.DataServers, []string{"ds0", "ds1", "c"}) {
		t.Errorf("new file's map %+v", m)
	}
	checkPlacement(t, tc, s, ino, data, 0)
	l, err := s.Layout(ctx, ino)
	if err != nil || l.Count != 3 {
		t.Fatalf("new file's layout %+v, %v", l, err)
	}
	oldL, err := s.Layout(ctx, files[0].ino)
	if err != nil {
		t.Fatal(err)
	}
	if l.Device == oldL.Device {
		t.Error("files over different data servers share a device")
	}
	for _, tt := range []struct {
		name string
		dev  [16]byte
		want int
	}{
		{"old files' device", oldL.Device, 2},
		{"new file's device", l.Device, 3},
	} {
		if addrs, ok := s.Device(tt.dev); !ok || len(addrs) != tt.want {
			t.Errorf("%s: %d data servers (known %v), want %d", tt.name, len(addrs), ok, tt.want)
		}
	}
}

func TestProtocolVersions(t *testing.T) {
	tc := newCluster(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	conn, err := rpc.Dial(ctx, "tcp", tc.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// The MDS speaks revision 8 only: revision 7 has no OBJ_LIST (the
	// sweep of objects no file owns), revision 6 no terms (failover),
	// revision 5 no OBJ_ALLOCATE and OBJ_SEEK, revision 4 no I/O counters
	// in HEARTBEAT, revision 3 no replicated stripes, revision 2 stripe
	// indexes and no cluster id.
	for _, rev := range []uint32{0, 1, 2, 3, 4, 5, 6, 7, 9, 99} {
		var res ctlproto.CtlRegisterRes
		err = call(ctx, conn, ctlproto.CTLPROC_REGISTER, &ctlproto.CtlRegisterArgs{Revision: rev, Token: testSecret, DsId: "x"}, &res)
		if err != nil {
			t.Fatalf("REGISTER revision %d: %v", rev, err)
		}
		if res.Status != ctlproto.CTL_ERR_VERSION || res.Versions == nil || res.Versions.Low != 8 || res.Versions.High != 8 {
			t.Errorf("REGISTER revision %d: %+v, want CTL_ERR_VERSION 8..8", rev, res)
		}
	}
	if n := len(tc.reg.DataServers()); n != 0 {
		t.Errorf("%d data servers after refused revisions", n)
	}

	_, err = conn.Call(ctx, ctlproto.SHOAL_CONTROL, 2, ctlproto.CTLPROC_NULL, rpc.OpaqueAuth{}, nil)
	var ae *rpc.AcceptError
	if !errors.As(err, &ae) || ae.Stat != rpc.ProgMismatch || ae.Low != 1 || ae.High != 1 {
		t.Errorf("call to version 2: %v", err)
	}
	_, err = conn.Call(ctx, ctlproto.SHOAL_CONTROL, 1, 99, rpc.OpaqueAuth{}, nil)
	if !errors.As(err, &ae) || ae.Stat != rpc.ProcUnavail {
		t.Errorf("call to proc 99: %v", err)
	}

	// An unregistered connection may neither heartbeat, check stateids nor
	// ask file sizes.
	var st ctlproto.CtlStatusRes
	if err := call(ctx, conn, ctlproto.CTLPROC_HEARTBEAT, &ctlproto.CtlHeartbeatArgs{Registration: 1}, &st); err != nil || st.Status != ctlproto.CTL_ERR_STALE_GEN {
		t.Errorf("unregistered HEARTBEAT: %v, %v", err, st.Status)
	}
	var cr ctlproto.CtlCheckStateidRes
	if err := call(ctx, conn, ctlproto.CTLPROC_CHECK_STATEID, &ctlproto.CtlCheckStateidArgs{Ino: 1}, &cr); err != nil || cr.Status != ctlproto.CTL_ERR_NOTREG {
		t.Errorf("unregistered CHECK_STATEID: %v, %v", err, cr.Status)
	}
	var sr ctlproto.CtlGetsizeRes
	if err := call(ctx, conn, ctlproto.CTLPROC_FILE_SIZE, &ctlproto.CtlInoArgs{Ino: 1}, &sr); err != nil || sr.Status != ctlproto.CTL_ERR_NOTREG {
		t.Errorf("unregistered FILE_SIZE: %v, %v", err, sr.Status)
	}
	if n := tc.checker.calls.Load(); n != 0 {
		t.Errorf("checker called %d times for unregistered peers", n)
	}
}

// adminRecorder is an AdminHandler that records the commands it is given.
type adminRecorder struct {
	mu       sync.Mutex
	commands []string
	err      error
}

func (h *adminRecorder) set(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commands, h.err = nil, err
}

func (h *adminRecorder) calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.commands)
}

func (h *adminRecorder) Admin(_ context.Context, command string, request []byte) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commands = append(h.commands, command)
	if h.err != nil {
		return nil, h.err
	}
	return append([]byte(`{"echo":`), append(request, '}')...), nil
}

// TestAdminCall: ADMIN needs the join secret (it needs no registration),
// and reaches the installed handler, whose errors come back as statuses.
func TestAdminCall(t *testing.T) {
	tc := newCluster(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	conn, err := rpc.Dial(ctx, "tcp", tc.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := func(token []byte) ctlproto.CtlAdminRes {
		t.Helper()
		var res ctlproto.CtlAdminRes
		if err := call(ctx, conn, ctlproto.CTLPROC_ADMIN, &ctlproto.CtlAdminArgs{Token: token, Command: "status", Request: []byte(`1`)}, &res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := admin(testSecret); res.Status != ctlproto.CTL_ERR_DELAY {
		t.Errorf("ADMIN before a handler is installed: %+v", res)
	}
	h := &adminRecorder{}
	tc.reg.SetAdmin(h)
	for _, tt := range []struct {
		name    string
		token   []byte
		err     error
		want    ctlproto.CtlStatus
		reached bool
	}{
		{"no secret", nil, nil, ctlproto.CTL_ERR_AUTH, false},
		{"wrong secret", []byte("nope"), nil, ctlproto.CTL_ERR_AUTH, false},
		{"ok", testSecret, nil, ctlproto.CTL_OK, true},
		{"busy", testSecret, ErrBusy, ctlproto.CTL_ERR_BUSY, true},
		{"unknown data server", testSecret, ErrUnknownDataServer, ctlproto.CTL_ERR_NOENT, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h.set(tt.err)
			res := admin(tt.token)
			if res.Status != tt.want {
				t.Errorf("ADMIN: %+v, want %v", res, tt.want)
			}
			if reached := h.calls() == 1; reached != tt.reached {
				t.Errorf("handler reached: %v, want %v", reached, tt.reached)
			}
			if tt.want == ctlproto.CTL_OK && string(res.Body) != `{"echo":1}` {
				t.Errorf("ADMIN body %q", res.Body)
			}
			if tt.err != nil && res.Message == "" {
				t.Error("ADMIN error without a message")
			}
		})
	}
}
