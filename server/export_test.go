package server

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/wiretest"
)

func TestReadOnlyExport(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, []byte("data")), opClose(sid)))
	ts.cfg.Exports = []*Export{{Path: "/", ReadOnly: true, RootSquash: &noSquash}}
	ts.restart()
	c = ts.client()
	tests := []struct {
		name string
		ops  []nfs4.NfsArgop4
	}{
		{"CREATE", []nfs4.NfsArgop4{opPutRoot(), opMkdir("d")}},
		{"WRITE", []nfs4.NfsArgop4{opPutFH(fh), opWrite(anonStateid, 0, nfs4.UNSTABLE4, []byte("x"))}},
		{"SETATTR", []nfs4.NfsArgop4{opPutFH(fh), opSetattr(anonStateid, fattr(aMode(0o600)))}},
		{"REMOVE", []nfs4.NfsArgop4{opPutRoot(), opRemove("f")}},
		{"RENAME", []nfs4.NfsArgop4{opPutRoot(), opSaveFH(), opRename("f", "g")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want(t, nfs4.NFS4ERR_ROFS)(c.Compound(tc.ops...))
		})
	}
	// Reading still works, and ACCESS does not grant modification.
	res := must(t)(c.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE),
		nfs4.NfsArgop4{Argop: nfs4.OP_ACCESS, Opaccess: &nfs4.ACCESS4args{Access: nfs4.ACCESS4_READ | nfs4.ACCESS4_MODIFY}}))
	if a := find(t, res, nfs4.OP_ACCESS).Opaccess.Resok4; a.Access&nfs4.ACCESS4_MODIFY != 0 || a.Access&nfs4.ACCESS4_READ == 0 {
		t.Errorf("ACCESS on read-only export = %+v", a)
	}
}

// TestReadOnlyExceptWriteClients: a read-only export with rw_clients is
// read-write for those clients only (the image builder of a diskless root
// tree), and read-only, ACCESS included, for everyone else.
func TestReadOnlyExceptWriteClients(t *testing.T) {
	for _, tc := range []struct {
		name     string
		writers  []string
		writable bool
	}{
		{"caller listed", []string{"10.0.0.0/8", "127.0.0.1"}, true},
		{"caller's network listed", []string{"127.0.0.0/8"}, true},
		{"caller not listed", []string{"10.0.0.0/8"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Config{Exports: []*Export{{Path: "/", ReadOnly: true, RootSquash: &noSquash, WriteClients: tc.writers}}})
			c := ts.client()
			res, err := c.Compound(opPutRoot(), opMkdir("d"))
			if tc.writable {
				must(t)(res, err)
			} else {
				want(t, nfs4.NFS4ERR_ROFS)(res, err)
			}
			res = must(t)(c.Compound(opPutRoot(),
				nfs4.NfsArgop4{Argop: nfs4.OP_ACCESS, Opaccess: &nfs4.ACCESS4args{Access: nfs4.ACCESS4_READ | nfs4.ACCESS4_MODIFY}}))
			if got := find(t, res, nfs4.OP_ACCESS).Opaccess.Resok4.Access&nfs4.ACCESS4_MODIFY != 0; got != tc.writable {
				t.Errorf("ACCESS grants MODIFY: %v, want %v", got, tc.writable)
			}
		})
	}
	if _, err := newNamespace([]*Export{{Path: "/", WriteClients: []string{"127.0.0.1"}}}); err == nil {
		t.Error("rw_clients on a read-write export: no error")
	}
	if _, err := newNamespace([]*Export{{Path: "/", ReadOnly: true, WriteClients: []string{"not-a-net"}}}); err == nil {
		t.Error("bad rw_clients network: no error")
	}
}

// TestClientRestriction: an export whose client list excludes the caller
// answers NFS4ERR_ACCESS for every operation that touches it, and is left
// out of pseudo-root listings. (RFC 8881 leaves the choice open between
// hiding the export, WRONGSEC and ACCESS; Shoal uses ACCESS because no
// security flavor would help.)
func TestClientRestriction(t *testing.T) {
	ts := startServer(t, Config{Exports: []*Export{
		{Path: "/open", RootSquash: &noSquash},
		{Path: "/private", RootSquash: &noSquash, Clients: []string{"10.0.0.0/8"}},
		{Path: "/mine", RootSquash: &noSquash, Clients: []string{"127.0.0.1"}},
	}})
	c := ts.client()
	want(t, nfs4.NFS4ERR_ACCESS)(c.Compound(opPutRoot(), opLookup("private")))
	must(t)(c.Compound(opPutRoot(), opLookup("open"), opMkdir("x")))
	must(t)(c.Compound(opPutRoot(), opLookup("mine"), opMkdir("x")))
	res := must(t)(c.Compound(opPutRoot(), opReaddir(0, nfs4.Verifier4{}, 4096, nfs4.FATTR4_FSID)))
	if names := readdirNames(t, res); !slices.Equal(names, []string{"mine", "open"}) {
		t.Errorf("pseudo-root lists %q", names)
	}

	// A single restricted root export.
	ts2 := startServer(t, Config{Exports: []*Export{{Path: "/", RootSquash: &noSquash, Clients: []string{"10.0.0.0/8"}}}})
	c2 := ts2.client()
	want(t, nfs4.NFS4ERR_ACCESS)(c2.Compound(opPutRoot(), opGetattr(nfs4.FATTR4_TYPE)))
	want(t, nfs4.NFS4ERR_ACCESS)(c2.Compound(opPutRoot(), opMkdir("x")))
}

// authNone in TestSquash's uid column means: use AUTH_NONE.
const authNone = 1<<32 - 1

func TestSquash(t *testing.T) {
	anon := uint32(4242)
	tests := []struct {
		name   string
		export Export
		uid    uint32
		owner  string
	}{
		{"root squashed by default", Export{Path: "/"}, 0, "65534"},
		{"non-root kept", Export{Path: "/"}, 1000, "1000"},
		{"no root squash", Export{Path: "/", RootSquash: &noSquash}, 0, "0"},
		{"all squash", Export{Path: "/", AllSquash: true}, 1000, "65534"},
		{"all squash anonuid", Export{Path: "/", AllSquash: true, AnonUID: &anon}, 1000, "4242"},
		{"AUTH_NONE is anonymous", Export{Path: "/", RootSquash: &noSquash, AnonUID: &anon}, authNone, "4242"},
	}
	// Make the root directory world-writable first, then restart with the
	// export under test.
	ts := startServer(t, Config{})
	c := ts.client()
	must(t)(c.Compound(opPutRoot(), opSetattr(anonStateid, fattr(aMode(0o777)))))
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.export
			ts.cfg.Exports = []*Export{&e}
			ts.restart()
			c := ts.dial()
			c.Cred = wiretest.Cred(tc.uid, tc.uid)
			if tc.uid == authNone {
				c.Cred = rpc.OpaqueAuth{Flavor: rpc.AuthNone}
			}
			if _, err := c.ExchangeID(testCtx(t), []byte(tc.name), nfs4.Verifier4{1}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.CreateSession(testCtx(t), false); err != nil {
				t.Fatal(err)
			}
			name := string(rune('a' + i))
			res := must(t)(c.Compound(opPutRoot(), opMkdir(name), opGetattr(nfs4.FATTR4_OWNER)))
			if got := attrsOf(t, res)[nfs4.FATTR4_OWNER]; got != tc.owner {
				t.Errorf("owner %v, want %s", got, tc.owner)
			}
		})
	}
}

func TestMultipleExports(t *testing.T) {
	ts := startServer(t, Config{Exports: []*Export{
		{Path: "/a", RootSquash: &noSquash},
		{Path: "/b", RootSquash: &noSquash},
		{Path: "/x/y", RootSquash: &noSquash},
	}})
	c := ts.client()
	res := must(t)(c.Compound(opPutRoot(), opReaddir(0, nfs4.Verifier4{}, 4096, nfs4.FATTR4_TYPE)))
	if names := readdirNames(t, res); !slices.Equal(names, []string{"a", "b", "x"}) {
		t.Errorf("pseudo-root lists %q", names)
	}
	fsidOf := func(ops ...nfs4.NfsArgop4) ([2]uint64, []byte) {
		res := must(t)(c.Compound(append(ops, opGetFH(), opGetattr(nfs4.FATTR4_FSID, nfs4.FATTR4_TYPE))...))
		return attrsOf(t, res)[nfs4.FATTR4_FSID].([2]uint64), fhOf(t, res)
	}
	rootFsid, rootFH := fsidOf(opPutRoot())
	aFsid, aFH := fsidOf(opPutRoot(), opLookup("a"))
	bFsid, bFH := fsidOf(opPutRoot(), opLookup("b"))
	yFsid, _ := fsidOf(opPutRoot(), opLookup("x"), opLookup("y"))
	if rootFsid == aFsid || aFsid == bFsid || rootFsid == bFsid || yFsid == aFsid {
		t.Errorf("fsids not distinct: root %v a %v b %v y %v", rootFsid, aFsid, bFsid, yFsid)
	}
	// Files live in their export; LOOKUPP climbs back out.
	must(t)(c.Compound(opPutFH(aFH), opMkdir("ina")))
	want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutFH(bFH), opLookup("ina")))
	res = must(t)(c.Compound(opPutFH(aFH), opLookupP(), opGetFH()))
	if !bytes.Equal(fhOf(t, res), rootFH) {
		t.Error("LOOKUPP from /a is not the pseudo-root")
	}
	// The pseudo-root is read-only.
	want(t, nfs4.NFS4ERR_ROFS)(c.Compound(opPutRoot(), opMkdir("z")))
	// Cross-export RENAME and LINK are XDEV.
	must(t)(c.Compound(opPutFH(aFH), opCreate("s", nfs4.Createtype4{Type: nfs4.NF4SOCK}, nfs4.Fattr4{})))
	want(t, nfs4.NFS4ERR_XDEV)(c.Compound(opPutFH(aFH), opSaveFH(), opPutFH(bFH), opRename("s", "s")))
	want(t, nfs4.NFS4ERR_XDEV)(c.Compound(opPutFH(aFH), opLookup("s"), opSaveFH(), opPutFH(bFH), opLink("s")))

	// A handle of export a edited to name export b is rejected.
	if len(aFH) != fhLen {
		t.Fatalf("unexpected handle length %d", len(aFH))
	}
	forged := bytesClone(aFH)
	binary.BigEndian.PutUint16(forged[2:4], binary.BigEndian.Uint16(bFH[2:4]))
	want(t, nfs4.NFS4ERR_BADHANDLE)(c.Compound(opPutFH(forged), opGetattr(nfs4.FATTR4_TYPE)))
}
