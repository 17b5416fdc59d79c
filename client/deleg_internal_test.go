package client

import (
	"context"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// cbCompound runs one CB_COMPOUND through c's callback handler.
func cbCompound(t *testing.T, c *Client, ops ...nfs4.NfsCbArgop4) nfs4.CBCOMPOUND4res {
	t.Helper()
	args := nfs4.CBCOMPOUND4args{Minorversion: 1, Argarray: append([]nfs4.NfsCbArgop4{
		{Argop: nfs4.OP_CB_SEQUENCE, Opcbsequence: &nfs4.CBSEQUENCE4args{CsaSequenceid: 1}}}, ops...)}
	e := xdr.NewEncoder(128)
	if stat := c.serveCallback(context.Background(), &rpc.Call{Prog: nfs4.NFS4_CALLBACK, Proc: nfs4.CB_COMPOUND, Args: xdr.Marshal(&args)}, e); stat != rpc.Success {
		t.Fatalf("accept stat %v", stat)
	}
	var res nfs4.CBCOMPOUND4res
	if err := xdr.Unmarshal(e.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestCallbackDelegationErrors: the answers to CB_RECALL and CB_GETATTR
// that need no round trip (RFC 8881 §20.1, §20.2).
func TestCallbackDelegationErrors(t *testing.T) {
	var held, unknown nfs4.Stateid4
	copy(held.Other[:], "held-deleg-1")
	copy(unknown.Other[:], "unknown-sid-")
	fh := []byte("file-handle")
	tests := []struct {
		name    string
		opening int // OPENs in flight
		op      nfs4.NfsCbArgop4
		want    nfs4.Nfsstat4
	}{
		{"recall of an unknown stateid", 0, nfs4.NfsCbArgop4{Argop: nfs4.OP_CB_RECALL,
			Opcbrecall: &nfs4.CBRECALL4args{Stateid: unknown, Fh: fh}}, nfs4.NFS4ERR_BAD_STATEID},
		{"recall of an unknown stateid racing an OPEN reply", 1, nfs4.NfsCbArgop4{Argop: nfs4.OP_CB_RECALL,
			Opcbrecall: &nfs4.CBRECALL4args{Stateid: unknown, Fh: fh}}, nfs4.NFS4_OK},
		{"recall with another file's handle", 0, nfs4.NfsCbArgop4{Argop: nfs4.OP_CB_RECALL,
			Opcbrecall: &nfs4.CBRECALL4args{Stateid: held, Fh: []byte("other")}}, nfs4.NFS4ERR_BADHANDLE},
		{"getattr without a write delegation", 0, nfs4.NfsCbArgop4{Argop: nfs4.OP_CB_GETATTR,
			Opcbgetattr: &nfs4.CBGETATTR4args{Fh: fh}}, nfs4.NFS4ERR_BADHANDLE},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{}
			c.ctx, c.cancel = context.WithCancel(context.Background())
			defer c.cancel()
			c.delegs.init()
			d := &delegation{fh: fh, sid: held, local: map[*File]struct{}{}}
			c.delegs.byFH[string(fh)] = d
			c.delegs.byOther[held.Other] = d
			c.delegs.n.Store(1)
			c.delegs.opening = tc.opening
			res := cbCompound(t, c, tc.op)
			if res.Status != tc.want || len(res.Resarray) != 2 {
				t.Fatalf("status %v with %d results, want %v", res.Status, len(res.Resarray), tc.want)
			}
			if tc.want == nfs4.NFS4_OK && !c.delegs.early[unknown.Other] {
				t.Errorf("early recall not remembered")
			}
		})
	}
}

// FuzzCallback feeds arbitrary CB_COMPOUND arguments to the callback
// handler of a Client holding no state: it must never panic, and what it
// answers must decode.
func FuzzCallback(f *testing.F) {
	var sid nfs4.Stateid4
	copy(sid.Other[:], "some-stateid")
	for _, ops := range [][]nfs4.NfsCbArgop4{
		{{Argop: nfs4.OP_CB_SEQUENCE, Opcbsequence: &nfs4.CBSEQUENCE4args{CsaSequenceid: 1}},
			{Argop: nfs4.OP_CB_RECALL, Opcbrecall: &nfs4.CBRECALL4args{Stateid: sid, Fh: []byte("fh")}}},
		{{Argop: nfs4.OP_CB_SEQUENCE, Opcbsequence: &nfs4.CBSEQUENCE4args{}},
			{Argop: nfs4.OP_CB_GETATTR, Opcbgetattr: &nfs4.CBGETATTR4args{Fh: []byte("fh")}}},
		{{Argop: nfs4.OP_CB_RECALL, Opcbrecall: &nfs4.CBRECALL4args{}}},
	} {
		f.Add(xdr.Marshal(&nfs4.CBCOMPOUND4args{Minorversion: 1, Argarray: ops}))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c := &Client{}
		c.ctx, c.cancel = context.WithCancel(context.Background())
		defer c.cancel()
		e := xdr.NewEncoder(128)
		if c.serveCallback(context.Background(), &rpc.Call{Prog: nfs4.NFS4_CALLBACK, Proc: nfs4.CB_COMPOUND, Args: b}, e) != rpc.Success {
			return
		}
		var res nfs4.CBCOMPOUND4res
		if err := xdr.Unmarshal(e.Bytes(), &res); err != nil {
			t.Fatalf("decoding own reply: %v", err)
		}
	})
}

// TestStaleOpenReplyAfterReturn: a delegation this Client gave back (after
// an early recall, or as a second delegation of a file it holds one of)
// or dropped is never taken for live when another OPEN's reply carries
// it afterwards. Two OPENs of one file in flight get the same delegation
// from the server; a REMOVE by another client in between recalled it, and
// the late reply once made Stat answer from its attributes (nlink 1 after
// the remove: server TestUnlinkRacesOpen).
func TestStaleOpenReplyAfterReturn(t *testing.T) {
	fh := []byte("file-handle")
	var x, y nfs4.Stateid4
	copy(x.Other[:], "delegation-x")
	copy(y.Other[:], "delegation-y")
	read := func(sid nfs4.Stateid4) *nfs4.OpenDelegation4 {
		return &nfs4.OpenDelegation4{DelegationType: nfs4.OPEN_DELEGATE_READ,
			Read: &nfs4.OpenReadDelegation4{Stateid: sid}}
	}
	tests := []struct {
		name    string
		prepare func(c *Client) // before the replies
		replies []nfs4.Stateid4
		want    *nfs4.Stateid4 // the delegation held at the end
	}{
		{"early recall, then two replies with it", func(c *Client) {
			c.delegs.opening = 2
			cbCompound(t, c, nfs4.NfsCbArgop4{Argop: nfs4.OP_CB_RECALL, Opcbrecall: &nfs4.CBRECALL4args{Stateid: x, Fh: fh}})
		}, []nfs4.Stateid4{x, x}, nil},
		{"returned, then a late reply with it", func(c *Client) {
			c.gotDelegation(fh, read(x), &Attr{Nlink: 1}, attrSnap{})
			c.delegs.mu.Lock()
			c.delegs.removeLocked(c.delegs.byFH[string(fh)])
			c.delegs.mu.Unlock()
		}, []nfs4.Stateid4{x}, nil},
		{"second delegation returned, then the first still held", func(c *Client) {
			c.gotDelegation(fh, read(x), &Attr{Nlink: 1}, attrSnap{})
		}, []nfs4.Stateid4{y, x}, &x},
		{"a new delegation after a returned one", func(c *Client) {
			c.gotDelegation(fh, read(x), &Attr{Nlink: 1}, attrSnap{})
			c.delegs.mu.Lock()
			c.delegs.removeLocked(c.delegs.byFH[string(fh)])
			c.delegs.mu.Unlock()
		}, []nfs4.Stateid4{y}, &y},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A closed Client: the DELEGRETURNs it starts fail at once.
			c := &Client{endpoint: endpoint{closed: true}}
			c.ctx, c.cancel = context.WithCancel(context.Background())
			c.cancel()
			c.delegs.init()
			tc.prepare(c)
			for _, sid := range tc.replies {
				c.gotDelegation(fh, read(sid), &Attr{Nlink: 1}, attrSnap{})
			}
			c.wg.Wait()
			c.delegs.mu.Lock()
			d := c.delegs.byFH[string(fh)]
			c.delegs.mu.Unlock()
			switch {
			case tc.want == nil && d != nil:
				t.Fatalf("holds delegation %q, want none", d.sid.Other)
			case tc.want != nil && (d == nil || d.sid.Other != tc.want.Other):
				t.Fatalf("holds %v, want %q", d, tc.want.Other)
			}
			if _, ok := c.cachedDelegAttr(fh); ok != (tc.want != nil) {
				t.Fatalf("cached attributes: %v, want %v", ok, tc.want != nil)
			}
		})
	}
}
