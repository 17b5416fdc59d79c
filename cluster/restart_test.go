package cluster

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
)

// TestFullRestart restarts the MDS and every DS at once, the DSes
// registering in reverse order without remembering their indexes: the
// state file must keep every DS on its stripe index.
func TestFullRestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "registry.json")
	tc := newClusterWith(t, 4, &testCluster{stateFile: state})
	s := NewStriped(tc.reg, 8192)
	data := pattern(200_000, 5)
	writeAll(t, s, 3, data, 999)
	ids := make([]string, 4)
	for i, ds := range tc.reg.Members() {
		ids[i] = ds.ID
	}

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
	// The width and the index map are known before anyone registers.
	ms := tc.reg.Members()
	if len(ms) != 4 {
		t.Fatalf("%d members before re-registration", len(ms))
	}
	for i, m := range ms {
		if m.ID != ids[i] || m.Up {
			t.Errorf("member %d = %+v before re-registration", i, m)
		}
	}
	if _, _, n := NewStriped(tc.reg, 8192).Layout(3); n != 4 {
		t.Errorf("stripe width %d before re-registration", n)
	}
	old := tc.agents
	tc.agents = nil
	for i := 3; i >= 0; i-- {
		a := tc.startAgent(old[i].cfg.ID, tc.stores[i])
		if a.Index() != i {
			t.Errorf("%s got index %d after a full restart, want %d", a.cfg.ID, a.Index(), i)
		}
	}
	tc.stores = tc.stores[4:] // startAgent appended them again, matching tc.agents
	s = NewStriped(tc.reg, 8192)
	if got := readAll(t, s, 3, len(data), 999); !bytes.Equal(got, data) {
		t.Error("data differs after a full restart")
	}
	// A newcomer is appended.
	if a := tc.addAgent("new"); a.Index() != 4 {
		t.Errorf("newcomer got index %d", a.Index())
	}
}

func TestFixedWidth(t *testing.T) {
	tc := newClusterWith(t, 2, &testCluster{width: 3})
	if n := len(tc.reg.Members()); n != 3 {
		t.Fatalf("%d members with width 3", n)
	}
	if _, _, n := NewStriped(tc.reg, 0).Layout(1); n != 3 {
		t.Errorf("stripe width %d", n)
	}
	c := tc.addAgent("c")
	if c.Index() != 2 {
		t.Errorf("third DS got index %d", c.Index())
	}
	st := tc.newStore()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	_, err := StartAgent(ctx, AgentConfig{MDS: tc.addr, ID: "d", Store: st, JoinToken: []byte("join")})
	if !errors.Is(err, ErrClusterFull) {
		t.Errorf("fourth DS in a width-3 cluster: %v", err)
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

	// The MDS speaks revision 2 only: revision 1 lacks missed_beats in
	// the REGISTER reply.
	for _, rev := range []uint32{0, 1, 3, 99} {
		var res ctlproto.CtlRegisterRes
		err = call(ctx, conn, ctlproto.CTLPROC_REGISTER, &ctlproto.CtlRegisterArgs{Revision: rev, Token: []byte("join"), DsId: "x"}, &res)
		if err != nil {
			t.Fatalf("REGISTER revision %d: %v", rev, err)
		}
		if res.Status != ctlproto.CTL_ERR_VERSION || res.Versions == nil || res.Versions.Low != 2 || res.Versions.High != 2 {
			t.Errorf("REGISTER revision %d: %+v, want CTL_ERR_VERSION 2..2", rev, res)
		}
	}
	if n := len(tc.reg.Members()); n != 0 {
		t.Errorf("%d members after refused revisions", n)
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

	// An unregistered connection may neither heartbeat nor check stateids.
	var st ctlproto.CtlStatusRes
	if err := call(ctx, conn, ctlproto.CTLPROC_HEARTBEAT, &ctlproto.CtlHeartbeatArgs{Registration: 1}, &st); err != nil || st.Status != ctlproto.CTL_ERR_STALE_GEN {
		t.Errorf("unregistered HEARTBEAT: %v, %v", err, st.Status)
	}
	var cr ctlproto.CtlCheckStateidRes
	if err := call(ctx, conn, ctlproto.CTLPROC_CHECK_STATEID, &ctlproto.CtlCheckStateidArgs{Ino: 1}, &cr); err != nil || cr.Status != ctlproto.CTL_ERR_NOTREG {
		t.Errorf("unregistered CHECK_STATEID: %v, %v", err, cr.Status)
	}
	if n := tc.checker.calls.Load(); n != 0 {
		t.Errorf("checker called %d times for unregistered peers", n)
	}
}
