package server

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestOpenArguments: the open_arguments attribute (RFC 9754, attribute 86)
// is in supported_attrs and answers GETATTR in NFSv4.2 only, and names
// exactly the OPEN arguments Shoal acts on: all share accesses and denies,
// the claims but DELEGATE_PREV and DELEG_PREV_FH, all four createmodes,
// and the wants ANY_DELEG (only with delegations on), NO_DELEG and CANCEL.
// (A data server answers no GETATTR at all: TestDSOpTable.) The expected bitmaps
// are wire words written out here, not built by the server's code.
func TestOpenArguments(t *testing.T) {
	full := nfs4.OpenArguments4{
		OaShareAccess:     nfs4.Bitmap4{1<<1 | 1<<2 | 1<<3},               // READ, WRITE, BOTH
		OaShareDeny:       nfs4.Bitmap4{1<<0 | 1<<1 | 1<<2 | 1<<3},        // NONE, READ, WRITE, BOTH
		OaShareAccessWant: nfs4.Bitmap4{1<<3 | 1<<4 | 1<<5},               // ANY_DELEG, NO_DELEG, CANCEL
		OaOpenClaim:       nfs4.Bitmap4{1<<0 | 1<<1 | 1<<2 | 1<<4 | 1<<5}, // NULL, PREVIOUS, DELEGATE_CUR, FH, DELEG_CUR_FH
		OaCreateMode:      nfs4.Bitmap4{1<<0 | 1<<1 | 1<<2 | 1<<3},        // UNCHECKED4, GUARDED, EXCLUSIVE4, EXCLUSIVE4_1
	}
	noDeleg := full
	noDeleg.OaShareAccessWant = nfs4.Bitmap4{1<<4 | 1<<5} // NO_DELEG, CANCEL
	const word2bit86 = 1 << (86 - 64)

	for _, tc := range []struct {
		name  string
		cfg   Config
		minor uint32               // COMPOUND minor version
		want  *nfs4.OpenArguments4 // nil: not supported in this minor version
	}{
		{"4.2", Config{}, 2, &full},
		{"4.2 delegations off", Config{NoDelegations: true}, 2, &noDeleg},
		{"4.1", Config{}, 1, nil},
		{"4.1 delegations off", Config{NoDelegations: true}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, tc.cfg)
			c := ts.client()
			fh := newFile(t, c, "f", 0o644)
			c.Minor = tc.minor
			for _, obj := range []struct {
				what string
				ops  []nfs4.NfsArgop4
			}{
				{"file", []nfs4.NfsArgop4{opPutFH(fh)}},
				{"root", []nfs4.NfsArgop4{opPutRoot()}},
			} {
				res := must(t)(c.Compound(append(obj.ops,
					opGetattr(nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_TYPE, nfs4.FATTR4_OPEN_ARGUMENTS))...))
				// The attrmask as sent, before decoding.
				mask := find(t, res, nfs4.OP_GETATTR).Opgetattr.Resok4.ObjAttributes.Attrmask
				a := attrsOf(t, res)
				sup := a[nfs4.FATTR4_SUPPORTED_ATTRS].(nfs4.Bitmap4)
				got, returned := a[nfs4.FATTR4_OPEN_ARGUMENTS]
				if tc.want == nil {
					if bitmapHas(sup, nfs4.FATTR4_OPEN_ARGUMENTS) || returned || len(mask) > 2 {
						t.Fatalf("%s: open_arguments in %d.%d: supported %#x, attrmask %#x, value %+v",
							obj.what, 4, tc.minor, sup, mask, got)
					}
					if _, ok := a[nfs4.FATTR4_TYPE]; !ok {
						t.Fatalf("%s: type not returned beside the ignored open_arguments", obj.what)
					}
					continue
				}
				if len(sup) < 3 || sup[2]&word2bit86 == 0 {
					t.Fatalf("%s: supported_attrs %#x lacks open_arguments", obj.what, sup)
				}
				if !returned || len(mask) < 3 || mask[2]&word2bit86 == 0 {
					t.Fatalf("%s: open_arguments not returned: attrmask %#x", obj.what, mask)
				}
				if !reflect.DeepEqual(got, *tc.want) {
					t.Fatalf("%s: open_arguments\n got %+v\nwant %+v", obj.what, got, *tc.want)
				}
			}
		})
	}
}

// TestOpenArgumentsMatchOpen: what open_arguments names, OPEN accepts, and
// the claims it leaves out answer NFS4ERR_NOTSUPP.
func TestOpenArgumentsMatchOpen(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	oa := attrsOf(t, must(t)(c.Compound(opPutRoot(), opGetattr(nfs4.FATTR4_OPEN_ARGUMENTS))))[nfs4.FATTR4_OPEN_ARGUMENTS].(nfs4.OpenArguments4)
	rootFH := fhOf(t, must(t)(c.Compound(opPutRoot(), opGetFH())))
	n := 0
	open := func(a openArgs, want nfs4.Nfsstat4) {
		t.Helper()
		n++
		a.owner = fmt.Sprintf("owner-%d", n) // a fresh owner: no seqid or share state carried over
		res, err := c.Compound(opPutFH(rootFH), opOpen(c.ClientID, a))
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != want {
			t.Fatalf("OPEN %+v: %s, want %s", a, summary(res), statName(want))
		}
		if want == nfs4.NFS4_OK {
			must(t)(c.Compound(opPutFH(rootFH), opLookup(a.name), opClose(openSid(t, res))))
		}
	}
	modes := map[uint32]nfs4.Createmode4{
		nfs4.OPEN_ARGS_CREATEMODE_UNCHECKED4: nfs4.UNCHECKED4, nfs4.OPEN_ARGS_CREATE_MODE_GUARDED: nfs4.GUARDED4,
		nfs4.OPEN_ARGS_CREATEMODE_EXCLUSIVE4: nfs4.EXCLUSIVE4, nfs4.OPEN_ARGS_CREATE_MODE_EXCLUSIVE4_1: nfs4.EXCLUSIVE4_1,
	}
	bitmapEach(oa.OaCreateMode, func(m uint32) bool {
		mode, ok := modes[m]
		if !ok {
			t.Fatalf("createmode %d advertised", m)
		}
		open(openArgs{name: "create-" + mode.String(), access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: mode}, nfs4.NFS4_OK)
		return true
	})
	bitmapEach(oa.OaShareAccess, func(acc uint32) bool {
		bitmapEach(oa.OaShareDeny, func(deny uint32) bool {
			open(openArgs{name: "share", access: acc, deny: deny, create: true, mode: nfs4.UNCHECKED4}, nfs4.NFS4_OK)
			return true
		})
		return true
	})
	wants := map[uint32]uint32{
		nfs4.OPEN_ARGS_SHARE_ACCESS_WANT_ANY_DELEG: nfs4.OPEN4_SHARE_ACCESS_WANT_ANY_DELEG,
		nfs4.OPEN_ARGS_SHARE_ACCESS_WANT_NO_DELEG:  nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
		nfs4.OPEN_ARGS_SHARE_ACCESS_WANT_CANCEL:    nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL,
	}
	bitmapEach(oa.OaShareAccessWant, func(w uint32) bool {
		flag, ok := wants[w]
		if !ok {
			t.Fatalf("want %d advertised", w)
		}
		open(openArgs{name: "want", access: nfs4.OPEN4_SHARE_ACCESS_READ | flag, create: true, mode: nfs4.UNCHECKED4}, nfs4.NFS4_OK)
		return true
	})
	for _, claim := range []nfs4.OpenClaimType4{nfs4.CLAIM_DELEGATE_PREV, nfs4.CLAIM_DELEG_PREV_FH} {
		if bitmapHas(oa.OaOpenClaim, uint32(claim)) {
			t.Errorf("claim %v advertised", claim)
		}
		open(openArgs{name: "share", claim: claim}, nfs4.NFS4ERR_NOTSUPP)
	}
}

// TestSetattrReadOnly42: SETATTR of a read-only NFSv4.2 attribute is
// INVAL in 4.2, where the attribute exists, and ATTRNOTSUPP in 4.1, where
// it does not (RFC 8881 §18.30.3). The check once knew only the 4.1 set.
func TestSetattrReadOnly42(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	for _, tc := range []struct {
		minor uint32
		attr  uint32
		want  nfs4.Nfsstat4
	}{
		{2, nfs4.FATTR4_OPEN_ARGUMENTS, nfs4.NFS4ERR_INVAL},
		{2, nfs4.FATTR4_CLONE_BLKSIZE, nfs4.NFS4ERR_INVAL},
		{2, nfs4.FATTR4_XATTR_SUPPORT, nfs4.NFS4ERR_INVAL},
		{1, nfs4.FATTR4_OPEN_ARGUMENTS, nfs4.NFS4ERR_ATTRNOTSUPP},
		{1, nfs4.FATTR4_CLONE_BLKSIZE, nfs4.NFS4ERR_ATTRNOTSUPP},
	} {
		t.Run(fmt.Sprintf("4.%d attribute %d", tc.minor, tc.attr), func(t *testing.T) {
			c.Minor = tc.minor
			want(t, tc.want)(c.Compound(opPutFH(fh), opSetattr(sid, nfs4.Fattr4{Attrmask: makeBitmap([]uint32{tc.attr})})))
		})
	}
}
