package server

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
)

// anonStateid is the all-zeros special stateid.
var anonStateid nfs4.Stateid4

func TestCreateTypes(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	link := nfs4.Linktext4("target/of/link")
	tests := []struct {
		name     string
		typ      nfs4.Createtype4
		wantType nfs4.NfsFtype4
		rawdev   [2]uint64
	}{
		{"dir", nfs4.Createtype4{Type: nfs4.NF4DIR}, nfs4.NF4DIR, [2]uint64{}},
		{"symlink", nfs4.Createtype4{Type: nfs4.NF4LNK, Linkdata: &link}, nfs4.NF4LNK, [2]uint64{}},
		{"fifo", nfs4.Createtype4{Type: nfs4.NF4FIFO}, nfs4.NF4FIFO, [2]uint64{}},
		{"char", nfs4.Createtype4{Type: nfs4.NF4CHR, Devdata: &nfs4.Specdata4{Specdata1: 1, Specdata2: 3}}, nfs4.NF4CHR, [2]uint64{1, 3}},
		{"block", nfs4.Createtype4{Type: nfs4.NF4BLK, Devdata: &nfs4.Specdata4{Specdata1: 8, Specdata2: 1}}, nfs4.NF4BLK, [2]uint64{8, 1}},
		{"socket", nfs4.Createtype4{Type: nfs4.NF4SOCK}, nfs4.NF4SOCK, [2]uint64{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := must(t)(c.Compound(opPutRoot(), opCreate(tc.name, tc.typ, fattr(aMode(0o640))), opGetFH(),
				opGetattr(nfs4.FATTR4_TYPE, nfs4.FATTR4_MODE, nfs4.FATTR4_RAWDEV, nfs4.FATTR4_NUMLINKS)))
			cr := find(t, res, nfs4.OP_CREATE).Opcreate.Resok4
			if !cr.Cinfo.Atomic || cr.Cinfo.After == cr.Cinfo.Before {
				t.Errorf("change_info %+v", cr.Cinfo)
			}
			if !bitmapHas(cr.Attrset, nfs4.FATTR4_MODE) {
				t.Errorf("attrset %v lacks mode", cr.Attrset)
			}
			a := attrsOf(t, res)
			if a[nfs4.FATTR4_TYPE] != uint32(tc.wantType) {
				t.Errorf("type %v, want %v", a[nfs4.FATTR4_TYPE], tc.wantType)
			}
			if a[nfs4.FATTR4_MODE] != uint32(0o640) {
				t.Errorf("mode %o, want 640", a[nfs4.FATTR4_MODE])
			}
			if a[nfs4.FATTR4_RAWDEV] != tc.rawdev {
				t.Errorf("rawdev %v, want %v", a[nfs4.FATTR4_RAWDEV], tc.rawdev)
			}
			// The same name again is EXIST.
			want(t, nfs4.NFS4ERR_EXIST)(c.Compound(opPutRoot(), opCreate(tc.name, tc.typ, nfs4.Fattr4{})))
		})
	}
	res := must(t)(c.Compound(opPutRoot(), opLookup("symlink"), opReadlink()))
	if got := find(t, res, nfs4.OP_READLINK).Opreadlink.Resok4.Link; string(got) != string(link) {
		t.Errorf("READLINK %q", got)
	}
	// CREATE of a regular file is BADTYPE (RFC 8881 §18.4.3: use OPEN).
	want(t, nfs4.NFS4ERR_BADTYPE)(c.Compound(opPutRoot(), opCreate("reg", nfs4.Createtype4{Type: nfs4.NF4REG}, nfs4.Fattr4{})))
}

func TestOpenCreateModes(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	cid := c.ClientID
	open := func(a openArgs) nfs4.NfsArgop4 { return opOpen(cid, a) }
	w := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)

	res := must(t)(c.Compound(opPutRoot(), open(openArgs{name: "u", access: w, create: true, mode: nfs4.UNCHECKED4, attrs: fattr(aMode(0o600))}),
		opGetattr(nfs4.FATTR4_MODE, nfs4.FATTR4_SIZE, nfs4.FATTR4_TYPE)))
	a := attrsOf(t, res)
	if a[nfs4.FATTR4_MODE] != uint32(0o600) || a[nfs4.FATTR4_SIZE] != uint64(0) || a[nfs4.FATTR4_TYPE] != uint32(nfs4.NF4REG) {
		t.Errorf("new file attrs %v", a)
	}
	sid := openSid(t, res)
	must(t)(c.Compound(opPutRoot(), opLookup("u"), opWrite(sid, 0, nfs4.FILE_SYNC4, []byte("hello"))))
	// UNCHECKED on an existing file opens it; size 0 truncates.
	res = must(t)(c.Compound(opPutRoot(), open(openArgs{name: "u", access: w, create: true, mode: nfs4.UNCHECKED4, attrs: fattr(aSize(0))}),
		opGetattr(nfs4.FATTR4_SIZE)))
	if a := attrsOf(t, res); a[nfs4.FATTR4_SIZE] != uint64(0) {
		t.Errorf("UNCHECKED with size 0 left size %v", a[nfs4.FATTR4_SIZE])
	}

	must(t)(c.Compound(opPutRoot(), open(openArgs{name: "g", access: w, create: true, mode: nfs4.GUARDED4})))
	want(t, nfs4.NFS4ERR_EXIST)(c.Compound(opPutRoot(), open(openArgs{name: "g", access: w, create: true, mode: nfs4.GUARDED4})))

	v1, v2 := nfs4.Verifier4{1, 2, 3}, nfs4.Verifier4{9, 9, 9}
	r1 := must(t)(c.Compound(opPutRoot(), open(openArgs{name: "x", access: w, create: true, mode: nfs4.EXCLUSIVE4_1, verf: v1}), opGetFH()))
	// A retransmission with the same verifier succeeds and opens the same file.
	r2 := must(t)(c.Compound(opPutRoot(), open(openArgs{name: "x", access: w, create: true, mode: nfs4.EXCLUSIVE4_1, verf: v1}), opGetFH()))
	if !bytes.Equal(fhOf(t, r1), fhOf(t, r2)) {
		t.Error("exclusive create retransmission opened another file")
	}
	want(t, nfs4.NFS4ERR_EXIST)(c.Compound(opPutRoot(), open(openArgs{name: "x", access: w, create: true, mode: nfs4.EXCLUSIVE4_1, verf: v2})))
	// Plain EXCLUSIVE4 is for 4.0 only, but the server may accept it.
	// Opening a missing file without create is NOENT; a directory is ISDIR.
	want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutRoot(), open(openArgs{name: "missing"})))
	must(t)(c.Compound(opPutRoot(), opMkdir("d")))
	want(t, nfs4.NFS4ERR_ISDIR)(c.Compound(opPutRoot(), open(openArgs{name: "d"})))
}

// openFile creates name in the root and returns its stateid and handle.
func openFile(t *testing.T, c *wiretest.Client, name string, access, deny uint32, owner string) (nfs4.Stateid4, []byte) {
	t.Helper()
	res := must(t)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: name, owner: owner, access: access, deny: deny,
		create: true, mode: nfs4.UNCHECKED4}), opGetFH()))
	return openSid(t, res), fhOf(t, res)
}

func TestWriteReadCommit(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	data := bytes.Repeat([]byte("0123456789abcdef"), 1000)
	res := must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.UNSTABLE4, data[:8000]),
		opWrite(sid, 8000, nfs4.FILE_SYNC4, data[8000:])))
	w1 := res.Resarray[2].Opwrite.Resok4
	w2 := res.Resarray[3].Opwrite.Resok4
	if w1.Count != 8000 || w2.Count != uint32(len(data)-8000) {
		t.Errorf("counts %d %d", w1.Count, w2.Count)
	}
	if w2.Committed != nfs4.FILE_SYNC4 {
		t.Errorf("FILE_SYNC write committed as %v", w2.Committed)
	}
	if w1.Writeverf != w2.Writeverf {
		t.Error("write verifiers differ within one boot")
	}
	res = must(t)(c.Compound(opPutFH(fh), opCommit()))
	if v := res.Resarray[2].Opcommit.Resok4.Writeverf; v != w1.Writeverf {
		t.Errorf("COMMIT verifier %x != WRITE verifier %x", v, w1.Writeverf)
	}
	res = must(t)(c.Compound(opPutFH(fh), opRead(sid, 0, uint32(len(data)+100)), opGetattr(nfs4.FATTR4_SIZE)))
	rd := res.Resarray[2].Opread.Resok4
	if !bytes.Equal(rd.Data, data) || !rd.Eof {
		t.Errorf("READ returned %d bytes eof=%v", len(rd.Data), rd.Eof)
	}
	if a := attrsOf(t, res); a[nfs4.FATTR4_SIZE] != uint64(len(data)) {
		t.Errorf("size %v", a[nfs4.FATTR4_SIZE])
	}
	// Reads at and past EOF.
	res = must(t)(c.Compound(opPutFH(fh), opRead(sid, uint64(len(data)), 10), opRead(sid, 1<<40, 10), opRead(sid, 10, 5)))
	for i, wantData := range []string{"", "", "abcde"} {
		r := res.Resarray[2+i].Opread.Resok4
		if string(r.Data) != wantData || r.Eof != (i < 2) {
			t.Errorf("read %d: %q eof=%v", i, r.Data, r.Eof)
		}
	}
	// A write into a hole past EOF reads back zeros in between.
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, 20000, nfs4.UNSTABLE4, []byte("z"))))
	res = must(t)(c.Compound(opPutFH(fh), opRead(sid, 15990, 20000)))
	got := res.Resarray[2].Opread.Resok4.Data
	wantTail := append(append(bytes.Clone(data[15990:]), make([]byte, 20000-16000)...), 'z')
	if !bytes.Equal(got, wantTail) {
		t.Errorf("read across hole: %d bytes, want %d", len(got), len(wantTail))
	}
	// READ of a directory is ISDIR; WRITE without a filehandle is NOFILEHANDLE.
	want(t, nfs4.NFS4ERR_ISDIR)(c.Compound(opPutRoot(), opRead(anonStateid, 0, 1)))
	want(t, nfs4.NFS4ERR_NOFILEHANDLE)(c.Compound(opWrite(sid, 0, nfs4.UNSTABLE4, []byte("x"))))
}

func TestSetattr(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, []byte("0123456789"))))
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 600, time.UTC)
	atime := time.Date(2019, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name  string
		attrs nfs4.Fattr4
		check func(a attrMap) error
	}{
		{"size shrink", fattr(aSize(4)), func(a attrMap) error {
			if a[nfs4.FATTR4_SIZE] != uint64(4) {
				return fmt.Errorf("size %v", a[nfs4.FATTR4_SIZE])
			}
			return nil
		}},
		{"size grow", fattr(aSize(1 << 20)), func(a attrMap) error {
			if a[nfs4.FATTR4_SIZE] != uint64(1<<20) {
				return fmt.Errorf("size %v", a[nfs4.FATTR4_SIZE])
			}
			return nil
		}},
		{"mode", fattr(aMode(0o4751)), func(a attrMap) error {
			if a[nfs4.FATTR4_MODE] != uint32(0o4751) {
				return fmt.Errorf("mode %o", a[nfs4.FATTR4_MODE])
			}
			return nil
		}},
		{"owner", fattr(aOwner("1000"), aGroup("1001")), func(a attrMap) error {
			if a[nfs4.FATTR4_OWNER] != "1000" || a[nfs4.FATTR4_OWNER_GROUP] != "1001" {
				return fmt.Errorf("owner %v group %v", a[nfs4.FATTR4_OWNER], a[nfs4.FATTR4_OWNER_GROUP])
			}
			return nil
		}},
		{"times", fattr(aMtime(mtime), aAtime(atime)), func(a attrMap) error {
			if !a[nfs4.FATTR4_TIME_MODIFY].(time.Time).Equal(mtime) || !a[nfs4.FATTR4_TIME_ACCESS].(time.Time).Equal(atime) {
				return fmt.Errorf("mtime %v atime %v", a[nfs4.FATTR4_TIME_MODIFY], a[nfs4.FATTR4_TIME_ACCESS])
			}
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := must(t)(c.Compound(opPutFH(fh), opSetattr(sid, tc.attrs), opGetattr(nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE,
				nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP, nfs4.FATTR4_TIME_MODIFY, nfs4.FATTR4_TIME_ACCESS)))
			set := find(t, res, nfs4.OP_SETATTR).Opsetattr.Attrsset
			bitmapEach(tc.attrs.Attrmask, func(n uint32) bool {
				if !bitmapHas(set, n) {
					t.Errorf("attrsset %v lacks %d", set, n)
				}
				return true
			})
			if err := tc.check(attrsOf(t, res)); err != nil {
				t.Error(err)
			}
		})
	}
	// Read-only attributes are INVAL, unknown ones ATTRNOTSUPP, bad owners BADOWNER.
	want(t, nfs4.NFS4ERR_INVAL)(c.Compound(opPutFH(fh), opSetattr(sid, fattr(aType(1)))))
	want(t, nfs4.NFS4ERR_BADOWNER)(c.Compound(opPutFH(fh), opSetattr(sid, fattr(aOwner("alice@example")))))
	bad := nfs4.Fattr4{Attrmask: makeBitmap([]uint32{nfs4.FATTR4_ACL})}
	want(t, nfs4.NFS4ERR_ATTRNOTSUPP)(c.Compound(opPutFH(fh), opSetattr(sid, bad)))
	// Truncated attribute values are BADXDR.
	short := fattr(aSize(1))
	short.AttrVals = short.AttrVals[:4]
	want(t, nfs4.NFS4ERR_BADXDR)(c.Compound(opPutFH(fh), opSetattr(sid, short)))
}

func TestVerify(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	must(t)(c.Compound(opPutFH(fh), opSetattr(sid, fattr(aMode(0o644), aSize(7)))))
	same := fattr(aMode(0o644), aSize(7))
	diff := fattr(aMode(0o600), aSize(7))
	tests := []struct {
		name string
		op   nfs4.NfsArgop4
		want nfs4.Nfsstat4
	}{
		{"verify same", opVerify(same), nfs4.NFS4_OK},
		{"verify differs", opVerify(diff), nfs4.NFS4ERR_NOT_SAME},
		{"nverify same", opNVerify(same), nfs4.NFS4ERR_SAME},
		{"nverify differs", opNVerify(diff), nfs4.NFS4_OK},
		{"verify unsupported", opVerify(nfs4.Fattr4{Attrmask: makeBitmap([]uint32{nfs4.FATTR4_ACL})}), nfs4.NFS4ERR_ATTRNOTSUPP},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want(t, tc.want)(c.Compound(opPutFH(fh), tc.op))
		})
	}
}

func TestRenameLinkRemove(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	for _, d := range []string{"d1", "d2"} {
		must(t)(c.Compound(opPutRoot(), opMkdir(d)))
	}
	mk := func(dir, name string) []byte {
		res := must(t)(c.Compound(opPutRoot(), opLookup(dir), opOpen(c.ClientID, openArgs{name: name, access: nfs4.OPEN4_SHARE_ACCESS_BOTH,
			create: true, mode: nfs4.GUARDED4}), opGetFH()))
		sid := openSid(t, res)
		must(t)(c.Compound(opPutFH(fhOf(t, res)), opClose(sid)))
		return fhOf(t, res)
	}
	a := mk("d1", "a")
	mk("d1", "b")
	// Within a directory.
	must(t)(c.Compound(opPutRoot(), opLookup("d1"), opSaveFH(), opRename("a", "a2")))
	want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutRoot(), opLookup("d1"), opLookup("a")))
	// Across directories.
	res := must(t)(c.Compound(opPutRoot(), opLookup("d1"), opSaveFH(), opPutRoot(), opLookup("d2"), opRename("a2", "a3"),
		opLookup("a3"), opGetFH()))
	if !bytes.Equal(fhOf(t, res), a) {
		t.Error("rename changed the filehandle")
	}
	// Over an existing file: the target is replaced.
	bfh := must(t)(c.Compound(opPutRoot(), opLookup("d1"), opLookup("b"), opGetFH()))
	must(t)(c.Compound(opPutRoot(), opLookup("d2"), opSaveFH(), opPutRoot(), opLookup("d1"), opRename("a3", "b")))
	res = must(t)(c.Compound(opPutRoot(), opLookup("d1"), opLookup("b"), opGetFH()))
	if !bytes.Equal(fhOf(t, res), a) {
		t.Error("rename over existing: target is not the renamed file")
	}
	want(t, nfs4.NFS4ERR_STALE)(c.Compound(opPutFH(fhOf(t, bfh)), opGetattr(nfs4.FATTR4_SIZE)))
	// Rename of a directory over a non-empty directory fails.
	must(t)(c.Compound(opPutRoot(), opLookup("d2"), opMkdir("sub")))
	// RFC 8881 lists both EXIST and NOTEMPTY for RENAME; either is fine.
	res, err := c.Compound(opPutRoot(), opSaveFH(), opRename("d2", "d1"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nfs4.NFS4ERR_EXIST && res.Status != nfs4.NFS4ERR_NOTEMPTY {
		t.Errorf("rename over non-empty directory: %s", summary(res))
	}

	// LINK and numlinks.
	res = must(t)(c.Compound(opPutFH(a), opSaveFH(), opPutRoot(), opLookup("d2"), opLink("hard"),
		opPutFH(a), opGetattr(nfs4.FATTR4_NUMLINKS)))
	if n := attrsOf(t, res)[nfs4.FATTR4_NUMLINKS]; n != uint32(2) {
		t.Errorf("numlinks after LINK = %v", n)
	}
	want(t, nfs4.NFS4ERR_EXIST)(c.Compound(opPutFH(a), opSaveFH(), opPutRoot(), opLookup("d2"), opLink("hard")))
	want(t, nfs4.NFS4ERR_ISDIR)(c.Compound(opPutRoot(), opLookup("d1"), opSaveFH(), opPutRoot(), opLink("dirlink")))
	must(t)(c.Compound(opPutRoot(), opLookup("d1"), opRemove("b")))
	res = must(t)(c.Compound(opPutFH(a), opGetattr(nfs4.FATTR4_NUMLINKS)))
	if n := attrsOf(t, res)[nfs4.FATTR4_NUMLINKS]; n != uint32(1) {
		t.Errorf("numlinks after REMOVE = %v", n)
	}
	want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutRoot(), opLookup("d1"), opRemove("b")))
	want(t, nfs4.NFS4ERR_NOTEMPTY)(c.Compound(opPutRoot(), opRemove("d2")))
	must(t)(c.Compound(opPutRoot(), opRemove("d1")))
}

func TestReaddirPaging(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	dirFH := fhOf(t, must(t)(c.Compound(opPutRoot(), opMkdir("big"), opGetFH())))
	const n = 500
	// Batch the creates, several per COMPOUND (under the session's op limit).
	for i := 0; i < n; i += 5 {
		ops := []nfs4.NfsArgop4{opPutFH(dirFH)}
		for j := i; j < i+5; j++ {
			ops = append(ops, opCreate(fmt.Sprintf("entry-%03d", j), nfs4.Createtype4{Type: nfs4.NF4SOCK}, nfs4.Fattr4{}), opPutFH(dirFH))
		}
		must(t)(c.Compound(ops...))
	}
	seen := map[string]int{}
	var cookie uint64
	var verf nfs4.Verifier4
	removed := map[string]bool{}
	for page := 0; ; page++ {
		if page > 2*n {
			t.Fatal("READDIR does not reach EOF")
		}
		res := must(t)(c.Compound(opPutFH(dirFH), opReaddir(cookie, verf, 512, nfs4.FATTR4_FILEID, nfs4.FATTR4_TYPE)))
		ok := find(t, res, nfs4.OP_READDIR).Opreaddir.Resok4
		verf = ok.Cookieverf
		count := 0
		for e := ok.Reply.Entries; e != nil; e = e.Nextentry {
			seen[string(e.Name)]++
			if e.Cookie <= cookie {
				t.Fatalf("cookie went from %d to %d", cookie, e.Cookie)
			}
			cookie = e.Cookie
			count++
			if _, err := decodeAttrs(&e.Attrs); err != nil {
				t.Fatalf("entry %s: %v", e.Name, err)
			}
		}
		if ok.Reply.Eof {
			break
		}
		if count == 0 {
			t.Fatal("READDIR returned no entries and no EOF")
		}
		// Remove entries not yet returned, between calls: the cookie of
		// the next page must stay valid and the removed names must not
		// show up.
		if page == 2 {
			for _, i := range []int{400, 401, 499} {
				name := fmt.Sprintf("entry-%03d", i)
				must(t)(c.Compound(opPutFH(dirFH), opRemove(name)))
				removed[name] = true
			}
		}
	}
	for i := range n {
		name := fmt.Sprintf("entry-%03d", i)
		switch {
		case removed[name] && seen[name] != 0:
			t.Errorf("%s returned after removal", name)
		case !removed[name] && seen[name] != 1:
			t.Errorf("%s returned %d times", name, seen[name])
		}
	}
	if len(seen) != n-len(removed) {
		t.Errorf("saw %d names, want %d", len(seen), n-len(removed))
	}
	// A wrong cookie verifier with a non-zero cookie is NOT_SAME.
	res := must(t)(c.Compound(opPutFH(dirFH), opReaddir(0, nfs4.Verifier4{}, 512)))
	first := find(t, res, nfs4.OP_READDIR).Opreaddir.Resok4
	bad := first.Cookieverf
	bad[0] ^= 0xff
	want(t, nfs4.NFS4ERR_NOT_SAME)(c.Compound(opPutFH(dirFH), opReaddir(first.Reply.Entries.Cookie, bad, 512)))
	// maxcount too small for even one entry is TOOSMALL.
	want(t, nfs4.NFS4ERR_TOOSMALL)(c.Compound(opPutFH(dirFH), opReaddir(0, nfs4.Verifier4{}, 20)))
	// Reserved cookies 1 and 2 are BAD_COOKIE.
	want(t, nfs4.NFS4ERR_BAD_COOKIE)(c.Compound(opPutFH(dirFH), opReaddir(1, verf, 512)))
}

func TestLookupPAndSecinfo(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	root := fhOf(t, must(t)(c.Compound(opPutRoot(), opGetFH())))
	res := must(t)(c.Compound(opPutRoot(), opMkdir("a"), opMkdir("b"), opLookupP(), opLookupP(), opGetFH()))
	if !bytes.Equal(fhOf(t, res), root) {
		t.Error("LOOKUPP twice from /a/b is not the root")
	}
	want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutRoot(), opLookupP()))
	sec := func(style nfs4.SecinfoStyle4) nfs4.NfsArgop4 {
		s := style
		return nfs4.NfsArgop4{Argop: nfs4.OP_SECINFO_NO_NAME, OpsecinfoNoName: &s}
	}
	res = must(t)(c.Compound(opPutRoot(), sec(nfs4.SECINFO_STYLE4_CURRENT_FH)))
	flavors := find(t, res, nfs4.OP_SECINFO_NO_NAME).OpsecinfoNoName.Resok4
	if flavors == nil || len(*flavors) == 0 {
		t.Error("SECINFO_NO_NAME returned no flavors")
	}
	// SECINFO_NO_NAME consumes the current filehandle.
	want(t, nfs4.NFS4ERR_NOFILEHANDLE)(c.Compound(opPutRoot(), sec(nfs4.SECINFO_STYLE4_CURRENT_FH), opGetFH()))
	must(t)(c.Compound(opPutRoot(), opLookup("a"), sec(nfs4.SECINFO_STYLE4_PARENT)))
	want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutRoot(), sec(nfs4.SECINFO_STYLE4_PARENT)))
}

func TestSparseFile(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "sparse", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	seek := func(off uint64, what nfs4.DataContent4) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_SEEK, Opseek: &nfs4.SEEK4args{SaStateid: sid, SaOffset: off, SaWhat: what}}
	}
	const mib = 1 << 20
	// Data at [1 MiB, 1 MiB+4 KiB), size 4 MiB.
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, mib, nfs4.FILE_SYNC4, bytes.Repeat([]byte{7}, 4096)),
		opSetattr(sid, fattr(aSize(4*mib)))))
	res, err := c.Compound(opPutFH(fh), seek(0, nfs4.NFS4_CONTENT_DATA))
	if err == nil && res.Status == nfs4.NFS4ERR_NOTSUPP {
		t.Skip("SEEK not supported by the store")
	}
	res = must(t)(res, err)
	sr := find(t, res, nfs4.OP_SEEK).Opseek.Resok4
	if sr.SrOffset > mib || sr.SrEof {
		t.Errorf("SEEK_DATA from 0 = %+v, want <= 1 MiB", sr)
	}
	res = must(t)(c.Compound(opPutFH(fh), seek(mib, nfs4.NFS4_CONTENT_HOLE)))
	if sr := find(t, res, nfs4.OP_SEEK).Opseek.Resok4; sr.SrOffset < mib+4096 || sr.SrOffset > 4*mib {
		t.Errorf("SEEK_HOLE from 1 MiB = %+v", sr)
	}
	want(t, nfs4.NFS4ERR_NXIO)(c.Compound(opPutFH(fh), seek(4*mib, nfs4.NFS4_CONTENT_DATA)))

	alloc := nfs4.NfsArgop4{Argop: nfs4.OP_ALLOCATE, Opallocate: &nfs4.ALLOCATE4args{AaStateid: sid, AaOffset: 0, AaLength: 8 * mib}}
	res, err = c.Compound(opPutFH(fh), alloc, opGetattr(nfs4.FATTR4_SIZE))
	if err != nil {
		t.Fatal(err)
	}
	switch res.Status {
	case nfs4.NFS4ERR_NOTSUPP:
		t.Log("ALLOCATE not supported by the store")
	case nfs4.NFS4_OK:
		if a := attrsOf(t, res); a[nfs4.FATTR4_SIZE] != uint64(8*mib) {
			t.Errorf("size after ALLOCATE past EOF = %v", a[nfs4.FATTR4_SIZE])
		}
	default:
		t.Errorf("ALLOCATE: %s", summary(res))
	}
	dealloc := nfs4.NfsArgop4{Argop: nfs4.OP_DEALLOCATE, Opdeallocate: &nfs4.DEALLOCATE4args{DaStateid: sid, DaOffset: mib, DaLength: 4096}}
	res, err = c.Compound(opPutFH(fh), dealloc, opGetattr(nfs4.FATTR4_SIZE), opRead(sid, mib, 4096))
	if err != nil {
		t.Fatal(err)
	}
	switch res.Status {
	case nfs4.NFS4ERR_NOTSUPP:
		t.Log("DEALLOCATE not supported by the store")
	case nfs4.NFS4_OK:
		if d := find(t, res, nfs4.OP_READ).Opread.Resok4.Data; !bytes.Equal(d, make([]byte, 4096)) {
			t.Error("DEALLOCATE'd range does not read as zeros")
		}
	default:
		t.Errorf("DEALLOCATE: %s", summary(res))
	}
}

// TestCreateAttrset: attributes the server did not set must not be
// reported in CREATE's and OPEN's attrset.
func TestCreateAttrset(t *testing.T) {
	ts := startServer(t, Config{})
	root := ts.client()
	must(t)(root.Compound(opPutRoot(), opSetattr(anonStateid, fattr(aMode(0o777)))))
	c := ts.dial()
	c.Cred = wiretest.Cred(1000, 1000)
	if _, err := c.ExchangeID(testCtx(t), []byte("attrset"), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSession(testCtx(t), false); err != nil {
		t.Fatal(err)
	}
	if err := c.ReclaimComplete(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// A non-root user cannot give a new directory to root.
	res, err := c.Compound(opPutRoot(), opCreate("d", nfs4.Createtype4{Type: nfs4.NF4DIR}, fattr(aMode(0o700), aOwner("0"))),
		opGetattr(nfs4.FATTR4_OWNER, nfs4.FATTR4_MODE))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status == nfs4.NFS4_OK {
		a := attrsOf(t, res)
		set := find(t, res, nfs4.OP_CREATE).Opcreate.Resok4.Attrset
		if bitmapHas(set, nfs4.FATTR4_OWNER) && a[nfs4.FATTR4_OWNER] != "0" {
			t.Errorf("CREATE reports owner set, but owner is %v", a[nfs4.FATTR4_OWNER])
		}
	} else if res.Status != nfs4.NFS4ERR_PERM {
		t.Errorf("CREATE with foreign owner: %s", summary(res))
	}
	res, err = c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "f", access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true,
		mode: nfs4.GUARDED4, attrs: fattr(aMode(0o600), aOwner("0"))}), opGetattr(nfs4.FATTR4_OWNER))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status == nfs4.NFS4_OK {
		a := attrsOf(t, res)
		set := find(t, res, nfs4.OP_OPEN).Opopen.Resok4.Attrset
		if bitmapHas(set, nfs4.FATTR4_OWNER) && a[nfs4.FATTR4_OWNER] != "0" {
			t.Errorf("OPEN reports owner set, but owner is %v", a[nfs4.FATTR4_OWNER])
		}
	} else if res.Status != nfs4.NFS4ERR_PERM {
		t.Errorf("OPEN with foreign owner: %s", summary(res))
	}
}

// TestAllAttributes fetches every supported attribute of every kind of
// object (pseudo-root, export root, file, directory entry), decodes them
// with the test's own decoder, and feeds the values back through VERIFY.
func TestAllAttributes(t *testing.T) {
	ts := startServer(t, Config{Exports: []*Export{{Path: "/e", RootSquash: &noSquash}}})
	c := ts.client()
	sid, fh := openFile2(t, c, "e", "f")
	must(t)(c.Compound(opPutFH(fh), opWrite(sid, 0, nfs4.FILE_SYNC4, []byte("abc"))))
	readable := readableAttrs()
	// Write-only attributes cannot be read (RFC 8881 §5.7).
	for _, n := range []uint32{nfs4.FATTR4_TIME_ACCESS_SET, nfs4.FATTR4_TIME_MODIFY_SET} {
		want(t, nfs4.NFS4ERR_INVAL)(c.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE, n)))
		want(t, nfs4.NFS4ERR_INVAL)(c.Compound(opPutRoot(), opReaddir(0, nfs4.Verifier4{}, 4096, n)))
		want(t, nfs4.NFS4ERR_INVAL)(c.Compound(opPutFH(fh), opVerify(fattr(aMtime(time.Unix(1, 0)), aAtime(time.Unix(1, 0))))))
	}
	stable := []uint32{nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE, nfs4.FATTR4_FILEID,
		nfs4.FATTR4_OWNER, nfs4.FATTR4_NUMLINKS, nfs4.FATTR4_FSID, nfs4.FATTR4_FILEHANDLE, nfs4.FATTR4_CHANGE}
	for _, tc := range []struct {
		name string
		ops  []nfs4.NfsArgop4
	}{
		{"pseudo-root", []nfs4.NfsArgop4{opPutRoot()}},
		{"export root", []nfs4.NfsArgop4{opPutRoot(), opLookup("e")}},
		{"file", []nfs4.NfsArgop4{opPutFH(fh)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := must(t)(c.Compound(append(tc.ops, opGetattr(readable...))...))
			a := attrsOf(t, res)
			for _, n := range readable {
				if _, ok := a[n]; !ok && n != nfs4.FATTR4_RDATTR_ERROR {
					t.Errorf("supported attribute %d not returned", n)
				}
			}
			got := find(t, res, nfs4.OP_GETATTR).Opgetattr.Resok4.ObjAttributes
			if !bytes.Equal(xdrBitmap(got.Attrmask), xdrBitmap(bitmapAnd(got.Attrmask, supportedMask))) {
				t.Errorf("returned bitmap %v has unsupported bits", got.Attrmask)
			}
			res = must(t)(c.Compound(append(tc.ops, opGetattr(stable...))...))
			f := find(t, res, nfs4.OP_GETATTR).Opgetattr.Resok4.ObjAttributes
			must(t)(c.Compound(append(tc.ops, opVerify(f))...))
			want(t, nfs4.NFS4ERR_SAME)(c.Compound(append(tc.ops, opNVerify(f))...))
		})
	}
	for _, dir := range [][]nfs4.NfsArgop4{{opPutRoot()}, {opPutRoot(), opLookup("e")}} {
		res := must(t)(c.Compound(append(dir, opReaddir(0, nfs4.Verifier4{}, 1<<16, readable...))...))
		for e := find(t, res, nfs4.OP_READDIR).Opreaddir.Resok4.Reply.Entries; e != nil; e = e.Nextentry {
			a, err := decodeAttrs(&e.Attrs)
			if err != nil {
				t.Errorf("READDIR entry %s: %v", e.Name, err)
				continue
			}
			if a[nfs4.FATTR4_RDATTR_ERROR] != uint32(0) {
				t.Errorf("READDIR entry %s: rdattr_error %v", e.Name, a[nfs4.FATTR4_RDATTR_ERROR])
			}
		}
	}
}

func openFile2(t *testing.T, c *wiretest.Client, dir, name string) (nfs4.Stateid4, []byte) {
	t.Helper()
	res := must(t)(c.Compound(opPutRoot(), opLookup(dir), opOpen(c.ClientID, openArgs{name: name, owner: "o",
		access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: nfs4.UNCHECKED4}), opGetFH()))
	return openSid(t, res), fhOf(t, res)
}

func xdrBitmap(bm nfs4.Bitmap4) []byte {
	e := xdr.NewEncoder(16)
	encodeBitmap(e, bm)
	return e.Bytes()
}

// readableAttrs is supportedAttrs without the write-only attributes.
func readableAttrs() []uint32 {
	var out []uint32
	for _, n := range supportedAttrs {
		if !bitmapHas(writeOnlyMask, n) {
			out = append(out, n)
		}
	}
	return out
}
