package server

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/meta"
)

func opGetxattr(name string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_GETXATTR, Opgetxattr: &nfs4.GETXATTR4args{GxaName: []byte(name)}}
}

func opSetxattr(how nfs4.SetxattrOption4, name string, value []byte) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_SETXATTR, Opsetxattr: &nfs4.SETXATTR4args{SxaOption: how, SxaKey: []byte(name), SxaValue: value}}
}

func opListxattrs(cookie uint64, maxcount uint32) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LISTXATTRS, Oplistxattrs: &nfs4.LISTXATTRS4args{LxaCookie: cookie, LxaMaxcount: maxcount}}
}

func opRemovexattr(name string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_REMOVEXATTR, Opremovexattr: &nfs4.REMOVEXATTR4args{RxaName: []byte(name)}}
}

// newFile creates the regular file name in the root with mode, as root,
// and returns its filehandle.
func newFile(t *testing.T, c *wiretest.Client, name string, mode uint32) []byte {
	t.Helper()
	res := must(t)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: name, owner: "creator " + name,
		access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: nfs4.UNCHECKED4, attrs: fattr(aMode(mode))}), opGetFH()))
	fh := fhOf(t, res)
	must(t)(c.Compound(opPutFH(fh), opClose(openSid(t, res))))
	return fh
}

// TestXattrOps drives GETXATTR, SETXATTR and REMOVEXATTR (RFC 8276)
// through their cases, one COMPOUND per step, on one file.
func TestXattrOps(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	fh := newFile(t, c, "f", 0o644)
	value := func(want []byte) func(t *testing.T, r *nfs4.NfsResop4) {
		return func(t *testing.T, r *nfs4.NfsResop4) {
			t.Helper()
			if got := *r.Opgetxattr.GxrValue; !bytes.Equal(got, want) {
				t.Fatalf("value %q (%d bytes), want %q", got[:min(len(got), 32)], len(got), want[:min(len(want), 32)])
			}
		}
	}
	big := bytes.Repeat([]byte{0xa5}, meta.MaxXattrValueLen)
	long := strings.Repeat("n", 255)
	for _, step := range []struct {
		name  string
		op    nfs4.NfsArgop4
		want  nfs4.Nfsstat4
		check func(t *testing.T, r *nfs4.NfsResop4)
	}{
		{"get missing", opGetxattr("shoal"), nfs4.NFS4ERR_NOXATTR, nil},
		{"replace missing", opSetxattr(nfs4.SETXATTR4_REPLACE, "shoal", []byte("x")), nfs4.NFS4ERR_NOXATTR, nil},
		{"remove missing", opRemovexattr("shoal"), nfs4.NFS4ERR_NOXATTR, nil},
		{"create", opSetxattr(nfs4.SETXATTR4_CREATE, "shoal", []byte("hello")), nfs4.NFS4_OK, nil},
		{"get", opGetxattr("shoal"), nfs4.NFS4_OK, value([]byte("hello"))},
		{"create existing", opSetxattr(nfs4.SETXATTR4_CREATE, "shoal", []byte("x")), nfs4.NFS4ERR_EXIST, nil},
		{"get after refused create", opGetxattr("shoal"), nfs4.NFS4_OK, value([]byte("hello"))},
		{"replace", opSetxattr(nfs4.SETXATTR4_REPLACE, "shoal", []byte("world")), nfs4.NFS4_OK, nil},
		{"get replaced", opGetxattr("shoal"), nfs4.NFS4_OK, value([]byte("world"))},
		{"either creates", opSetxattr(nfs4.SETXATTR4_EITHER, "empty", nil), nfs4.NFS4_OK, nil},
		{"get empty value", opGetxattr("empty"), nfs4.NFS4_OK, value([]byte{})},
		{"either replaces", opSetxattr(nfs4.SETXATTR4_EITHER, "empty", []byte{0, 1, 0}), nfs4.NFS4_OK, nil},
		{"get binary value", opGetxattr("empty"), nfs4.NFS4_OK, value([]byte{0, 1, 0})},
		{"names are case sensitive", opGetxattr("SHOAL"), nfs4.NFS4ERR_NOXATTR, nil},
		{"64 KiB value", opSetxattr(nfs4.SETXATTR4_CREATE, "big", big), nfs4.NFS4_OK, nil},
		{"get 64 KiB value", opGetxattr("big"), nfs4.NFS4_OK, value(big)},
		{"value of 64 KiB + 1", opSetxattr(nfs4.SETXATTR4_EITHER, "bigger", append(slices.Clone(big), 1)), nfs4.NFS4ERR_XATTR2BIG, nil},
		{"255-byte name", opSetxattr(nfs4.SETXATTR4_CREATE, long, []byte("ok")), nfs4.NFS4_OK, nil},
		{"get 255-byte name", opGetxattr(long), nfs4.NFS4_OK, value([]byte("ok"))},
		{"256-byte name", opSetxattr(nfs4.SETXATTR4_CREATE, long+"n", []byte("no")), nfs4.NFS4ERR_XATTR2BIG, nil},
		{"get 256-byte name", opGetxattr(long + "n"), nfs4.NFS4ERR_XATTR2BIG, nil},
		{"empty name", opSetxattr(nfs4.SETXATTR4_EITHER, "", []byte("x")), nfs4.NFS4ERR_INVAL, nil},
		{"undefined option", opSetxattr(3, "other", []byte("x")), nfs4.NFS4ERR_INVAL, nil},
		{"remove", opRemovexattr("shoal"), nfs4.NFS4_OK, nil},
		{"get removed", opGetxattr("shoal"), nfs4.NFS4ERR_NOXATTR, nil},
		{"remove removed", opRemovexattr("shoal"), nfs4.NFS4ERR_NOXATTR, nil},
		{"others stay", opGetxattr("empty"), nfs4.NFS4_OK, value([]byte{0, 1, 0})},
	} {
		t.Run(step.name, func(t *testing.T) {
			res, err := c.Compound(opPutFH(fh), step.op)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != step.want {
				t.Fatalf("%s, want %s", summary(res), statName(step.want))
			}
			if step.check != nil {
				step.check(t, find(t, res, step.op.Argop))
			}
		})
	}
	t.Run("no filehandle", func(t *testing.T) {
		want(t, nfs4.NFS4ERR_NOFILEHANDLE)(c.Compound(opGetxattr("empty")))
	})
	t.Run("survive a restart", func(t *testing.T) {
		ts.restart()
		c := ts.client()
		res := must(t)(c.Compound(opPutFH(fh), opGetxattr("empty"), opGetxattr(long)))
		if got := *res.Resarray[2].Opgetxattr.GxrValue; !bytes.Equal(got, []byte{0, 1, 0}) {
			t.Fatalf("after restart: %q", got)
		}
	})
}

// TestXattrChangeInfo: SETXATTR and REMOVEXATTR bump the file's change
// attribute and ctime, not mtime, and report the change before and after
// in change_info4 (RFC 8276); refused calls change nothing.
func TestXattrChangeInfo(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	fh := newFile(t, c, "f", 0o644)
	attrs := []uint32{nfs4.FATTR4_CHANGE, nfs4.FATTR4_TIME_METADATA, nfs4.FATTR4_TIME_MODIFY}
	get := func() attrMap { return attrsOf(t, must(t)(c.Compound(opPutFH(fh), opGetattr(attrs...)))) }
	for _, step := range []struct {
		name string
		op   nfs4.NfsArgop4
		info func(r *nfs4.NfsResop4) *nfs4.ChangeInfo4
	}{
		{"set", opSetxattr(nfs4.SETXATTR4_CREATE, "k", []byte("v")), func(r *nfs4.NfsResop4) *nfs4.ChangeInfo4 { return r.Opsetxattr.SxrInfo }},
		{"replace", opSetxattr(nfs4.SETXATTR4_REPLACE, "k", []byte("w")), func(r *nfs4.NfsResop4) *nfs4.ChangeInfo4 { return r.Opsetxattr.SxrInfo }},
		{"remove", opRemovexattr("k"), func(r *nfs4.NfsResop4) *nfs4.ChangeInfo4 { return r.Opremovexattr.RxrInfo }},
	} {
		t.Run(step.name, func(t *testing.T) {
			before := get()
			res := must(t)(c.Compound(opPutFH(fh), step.op, opGetattr(attrs...)))
			after := attrsOf(t, res)
			ci := step.info(find(t, res, step.op.Argop))
			b, a := before[nfs4.FATTR4_CHANGE].(uint64), after[nfs4.FATTR4_CHANGE].(uint64)
			if !ci.Atomic || ci.Before != b || ci.After != a || a <= b {
				t.Fatalf("change_info %+v; change %d -> %d", *ci, b, a)
			}
			bm, am := before[nfs4.FATTR4_TIME_MODIFY].(time.Time), after[nfs4.FATTR4_TIME_MODIFY].(time.Time)
			bc, ac := before[nfs4.FATTR4_TIME_METADATA].(time.Time), after[nfs4.FATTR4_TIME_METADATA].(time.Time)
			if !am.Equal(bm) || ac.Before(bc) {
				t.Fatalf("mtime %v -> %v, ctime %v -> %v; want mtime kept, ctime set", bm, am, bc, ac)
			}
		})
	}
	t.Run("refused calls", func(t *testing.T) {
		before := get()
		want(t, nfs4.NFS4ERR_NOXATTR)(c.Compound(opPutFH(fh), opRemovexattr("k")))
		want(t, nfs4.NFS4ERR_NOXATTR)(c.Compound(opPutFH(fh), opSetxattr(nfs4.SETXATTR4_REPLACE, "k", nil)))
		if after := get(); after[nfs4.FATTR4_CHANGE] != before[nfs4.FATTR4_CHANGE] {
			t.Fatalf("change %v -> %v", before[nfs4.FATTR4_CHANGE], after[nfs4.FATTR4_CHANGE])
		}
	})
}

// TestXattrList pages through LISTXATTRS with small maxcounts (RFC 8276):
// names come without the "user." prefix, in order, each once;
// the cookie continues where the last page ended; a maxcount that cannot
// hold the next name is NFS4ERR_TOOSMALL.
func TestXattrList(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	fh := newFile(t, c, "f", 0o644)
	res := must(t)(c.Compound(opPutFH(fh), opListxattrs(0, 1024)))
	if ok := res.Resarray[2].Oplistxattrs.LxrValue; len(ok.LxrNames) != 0 || !ok.LxrEof {
		t.Fatalf("new file lists %q, eof %v", ok.LxrNames, ok.LxrEof)
	}
	var all []string
	for _, name := range []string{"shoal", "a", "mime_type", "b.c", "0123456789abcdef", "x"} {
		must(t)(c.Compound(opPutFH(fh), opSetxattr(nfs4.SETXATTR4_CREATE, name, []byte(name))))
		all = append(all, name)
	}
	slices.Sort(all)
	list := func(cookie uint64, maxcount uint32) *nfs4.COMPOUND4res {
		t.Helper()
		res, err := c.Compound(opPutFH(fh), opListxattrs(cookie, maxcount))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// A page holds the cookie, the array length and eof (16 bytes) and
	// each name as a length and its bytes padded to 4.
	for _, maxcount := range []uint32{24, 28, 36, 40, 64, 1 << 20} {
		t.Run(fmt.Sprintf("maxcount %d", maxcount), func(t *testing.T) {
			var got []string
			cookie, pages := uint64(0), 0
			for pages = 1; pages < 20; pages++ {
				res := list(cookie, maxcount)
				if res.Status == nfs4.NFS4ERR_TOOSMALL {
					if maxcount >= 16+4+16 {
						t.Fatalf("TOOSMALL with maxcount %d", maxcount)
					}
					// Only "0123456789abcdef" (16 bytes) does not fit.
					if all[len(got)] != "0123456789abcdef" {
						t.Fatalf("TOOSMALL after %q", got)
					}
					return
				}
				if res.Status != nfs4.NFS4_OK {
					t.Fatalf("page %d: %s", pages, summary(res))
				}
				ok := res.Resarray[2].Oplistxattrs.LxrValue
				size := 16
				for _, n := range ok.LxrNames {
					got = append(got, string(n))
					size += 4 + (len(n)+3)&^3
				}
				if size > int(maxcount) || len(ok.LxrNames) == 0 && !ok.LxrEof {
					t.Fatalf("page %d: %d names in %d bytes, maxcount %d, eof %v", pages, len(ok.LxrNames), size, maxcount, ok.LxrEof)
				}
				cookie = ok.LxrCookie
				if ok.LxrEof {
					break
				}
			}
			if !slices.Equal(got, all) {
				t.Fatalf("listed %q in %d pages, want %q", got, pages, all)
			}
			if maxcount >= 1<<20 && pages != 1 {
				t.Fatalf("%d pages with a large maxcount", pages)
			}
		})
	}
	t.Run("TOOSMALL", func(t *testing.T) {
		for _, maxcount := range []uint32{0, 8, 15, 16, 19} {
			if res := list(0, maxcount); res.Status != nfs4.NFS4ERR_TOOSMALL {
				t.Errorf("maxcount %d: %s, want TOOSMALL", maxcount, summary(res))
			}
		}
	})
	t.Run("cookie at the end", func(t *testing.T) {
		res := list(uint64(len(all)), 16)
		if res.Status != nfs4.NFS4_OK {
			t.Fatalf("%s", summary(res))
		}
		if ok := res.Resarray[2].Oplistxattrs.LxrValue; len(ok.LxrNames) != 0 || !ok.LxrEof {
			t.Fatalf("past the end: %q, eof %v", ok.LxrNames, ok.LxrEof)
		}
	})
}

// TestXattrMinorVersion: the xattr operations exist only in NFSv4.2 (a
// 4.1 COMPOUND gets OP_ILLEGAL), and so do the xattr_support attribute
// and the ACCESS bits XAREAD, XAWRITE and XALIST.
func TestXattrMinorVersion(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	fh := newFile(t, c, "f", 0o644)
	const xaBits = nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XAWRITE | nfs4.ACCESS4_XALIST
	access := func(r *nfs4.COMPOUND4res) *nfs4.ACCESS4resok { return find(t, r, nfs4.OP_ACCESS).Opaccess.Resok4 }

	c.Minor = 2
	res := must(t)(c.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_XATTR_SUPPORT),
		nfs4.NfsArgop4{Argop: nfs4.OP_ACCESS, Opaccess: &nfs4.ACCESS4args{Access: xaBits | nfs4.ACCESS4_READ}}))
	a := attrsOf(t, res)
	if !bitmapHas(a[nfs4.FATTR4_SUPPORTED_ATTRS].(nfs4.Bitmap4), nfs4.FATTR4_XATTR_SUPPORT) || a[nfs4.FATTR4_XATTR_SUPPORT] != true {
		t.Errorf("4.2: supported %v, xattr_support %v", a[nfs4.FATTR4_SUPPORTED_ATTRS], a[nfs4.FATTR4_XATTR_SUPPORT])
	}
	if ac := access(res); ac.Supported != xaBits|nfs4.ACCESS4_READ || ac.Access != xaBits|nfs4.ACCESS4_READ {
		t.Errorf("4.2 ACCESS as root: supported %#x access %#x", ac.Supported, ac.Access)
	}

	c.Minor = 1
	defer func() { c.Minor = 2 }()
	for _, op := range []nfs4.NfsArgop4{opGetxattr("a"), opSetxattr(nfs4.SETXATTR4_EITHER, "a", nil), opListxattrs(0, 100), opRemovexattr("a")} {
		res := want(t, nfs4.NFS4ERR_OP_ILLEGAL)(c.Compound(opPutFH(fh), op))
		if last := res.Resarray[len(res.Resarray)-1]; last.Resop != nfs4.OP_ILLEGAL {
			t.Errorf("%v in 4.1: %s", op.Argop, summary(res))
		}
	}
	res = must(t)(c.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_XATTR_SUPPORT),
		nfs4.NfsArgop4{Argop: nfs4.OP_ACCESS, Opaccess: &nfs4.ACCESS4args{Access: xaBits | nfs4.ACCESS4_READ}}))
	a = attrsOf(t, res)
	if _, ok := a[nfs4.FATTR4_XATTR_SUPPORT]; ok || bitmapHas(a[nfs4.FATTR4_SUPPORTED_ATTRS].(nfs4.Bitmap4), nfs4.FATTR4_XATTR_SUPPORT) {
		t.Errorf("4.1 returns xattr_support: %v", a)
	}
	if ac := access(res); ac.Supported != nfs4.ACCESS4_READ || ac.Access != nfs4.ACCESS4_READ {
		t.Errorf("4.1 ACCESS: supported %#x access %#x", ac.Supported, ac.Access)
	}
}

// TestXattrPermissions: reading and listing need read permission,
// setting and removing write permission (RFC 8276, as Linux's
// user namespace asks), and ACCESS says the same.
func TestXattrPermissions(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	shared := newFile(t, c, "shared", 0o644)
	private := newFile(t, c, "private", 0o600)
	for _, fh := range [][]byte{shared, private} {
		must(t)(c.Compound(opPutFH(fh), opSetxattr(nfs4.SETXATTR4_CREATE, "k", []byte("v"))))
	}
	other := ts.client()
	other.Cred = wiretest.Cred(1000, 1000)
	const xaBits = nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XAWRITE | nfs4.ACCESS4_XALIST
	for _, tc := range []struct {
		name   string
		fh     []byte
		op     nfs4.NfsArgop4
		want   nfs4.Nfsstat4
		access uint32
	}{
		{"get readable", shared, opGetxattr("k"), nfs4.NFS4_OK, nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XALIST},
		{"list readable", shared, opListxattrs(0, 1024), nfs4.NFS4_OK, 0},
		{"set without write", shared, opSetxattr(nfs4.SETXATTR4_EITHER, "k", []byte("w")), nfs4.NFS4ERR_ACCESS, 0},
		{"create without write", shared, opSetxattr(nfs4.SETXATTR4_CREATE, "new", []byte("w")), nfs4.NFS4ERR_ACCESS, 0},
		{"remove without write", shared, opRemovexattr("k"), nfs4.NFS4ERR_ACCESS, 0},
		{"get unreadable", private, opGetxattr("k"), nfs4.NFS4ERR_ACCESS, 0},
		{"list unreadable", private, opListxattrs(0, 1024), nfs4.NFS4ERR_ACCESS, 0},
		{"set unwritable", private, opSetxattr(nfs4.SETXATTR4_EITHER, "k", nil), nfs4.NFS4ERR_ACCESS, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := other.Compound(opPutFH(tc.fh), tc.op)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want {
				t.Fatalf("%s, want %s", summary(res), statName(tc.want))
			}
		})
	}
	for _, tc := range []struct {
		name string
		fh   []byte
		want uint32
	}{
		{"ACCESS on shared", shared, nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XALIST},
		{"ACCESS on private", private, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := must(t)(other.Compound(opPutFH(tc.fh), nfs4.NfsArgop4{Argop: nfs4.OP_ACCESS, Opaccess: &nfs4.ACCESS4args{Access: xaBits}}))
			if ac := find(t, res, nfs4.OP_ACCESS).Opaccess.Resok4; ac.Supported != xaBits || ac.Access != tc.want {
				t.Fatalf("supported %#x access %#x, want access %#x", ac.Supported, ac.Access, tc.want)
			}
		})
	}
	// Nothing changed.
	res := must(t)(c.Compound(opPutFH(shared), opGetxattr("k"), opListxattrs(0, 1024)))
	if got := *res.Resarray[2].Opgetxattr.GxrValue; string(got) != "v" {
		t.Fatalf("value %q after refused calls", got)
	}
	if names := res.Resarray[3].Oplistxattrs.LxrValue.LxrNames; len(names) != 1 {
		t.Fatalf("names %q after refused calls", names)
	}
}

// TestXattrDataServer: data servers hold no metadata, so the xattr
// operations are NFS4ERR_NOTSUPP there (as is GETATTR, so xattr_support
// is not asked of them).
func TestXattrDataServer(t *testing.T) {
	mds := startServer(t, Config{})
	c := startDataServer(t, mds, "xattr-ds")
	fh := mds.srv.fh.encode(fhandle{kind: fhData, ino: 1234}) // what LAYOUTGET hands out
	for _, op := range []nfs4.NfsArgop4{opGetxattr("a"), opSetxattr(nfs4.SETXATTR4_EITHER, "a", nil), opListxattrs(0, 100), opRemovexattr("a")} {
		want(t, nfs4.NFS4ERR_NOTSUPP)(c.Compound(opPutFH(fh), op))
	}
}
