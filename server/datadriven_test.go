package server

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
)

// TestDataDriven replays testdata/*.txt against a live server, one server
// per file. Commands:
//
//	compound [minor=N] [uid=N]   one COMPOUND, an operation per input line;
//	                             SEQUENCE is added and left out of the output
//	restart                      restart the server on the same directory
//
// Operations (names as in RFC 8881; "cur" is the current stateid):
//
//	PUTROOTFH | GETFH [as=label] | PUTFH label | SAVEFH | RESTOREFH | LOOKUPP
//	LOOKUP name | REMOVE name | RENAME old new | LINK name | READLINK
//	CREATE dir|fifo|sock|chr|blk name | CREATE lnk name target
//	OPEN name [create=unchecked|guarded|exclusive] [access=r|w|rw] [deny=n|r|w|rw] [owner=o]
//	CLOSE | WRITE off data | READ off count | COMMIT
//	GETATTR a,b,... | SETATTR a=v,... | VERIFY a=v,... | NVERIFY a=v,...
//	READDIR [cookie] | SECINFO_NO_NAME current|parent | OP number
//
// The output is the COMPOUND status, then one line per operation result
// with details for GETATTR, READ, READDIR and READLINK.
func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			ts := startServer(t, Config{Lease: 30 * time.Second})
			r := &ddRunner{ts: ts, handles: map[string][]byte{}, clients: map[uint32]*wiretest.Client{}}
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				switch d.Cmd {
				case "compound":
					return r.compound(t, d)
				case "restart":
					ts.restart()
					r.clients = map[uint32]*wiretest.Client{}
					return "ok"
				}
				t.Fatalf("unknown command %q", d.Cmd)
				return ""
			})
		})
	}
}

type ddRunner struct {
	ts      *testServer
	handles map[string][]byte
	clients map[uint32]*wiretest.Client // by uid
}

func (r *ddRunner) client(t *testing.T, uid uint32) *wiretest.Client {
	if c := r.clients[uid]; c != nil {
		return c
	}
	c := r.ts.dial()
	c.Cred = wiretest.Cred(uid, uid)
	ctx := testCtx(t)
	if _, err := c.ExchangeID(ctx, []byte(fmt.Sprintf("dd-%d-%d", uid, ownerSeq.Add(1))), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSession(ctx, false); err != nil {
		t.Fatal(err)
	}
	// Finish any grace period left by a restart: this client has nothing
	// to reclaim.
	rc := nfs4.NfsArgop4{Argop: nfs4.OP_RECLAIM_COMPLETE, OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{}}
	must(t)(c.Compound(rc))
	r.clients[uid] = c
	return c
}

func (r *ddRunner) compound(t *testing.T, d *datadriven.TestData) string {
	uid, minor := uint32(0), uint32(2)
	for _, a := range d.CmdArgs {
		v, err := strconv.ParseUint(a.Vals[0], 10, 32)
		if err != nil {
			d.Fatalf(t, "%s: %v", a.Key, err)
		}
		switch a.Key {
		case "uid":
			uid = uint32(v)
		case "minor":
			minor = uint32(v)
		default:
			d.Fatalf(t, "unknown argument %s", a.Key)
		}
	}
	c := r.client(t, uid)
	var ops []nfs4.NfsArgop4
	var labels []string // GETFH as= labels, by GETFH occurrence
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		op, label, err := r.parseOp(c, f)
		if err != nil {
			d.Fatalf(t, "%q: %v", line, err)
		}
		if op.Argop == nfs4.OP_GETFH {
			labels = append(labels, label)
		}
		ops = append(ops, op)
	}
	c.Minor = minor
	res, err := c.Compound(ops...)
	c.Minor = 2
	if err != nil {
		return "error: " + err.Error()
	}
	var out strings.Builder
	out.WriteString(statName(res.Status) + "\n")
	getfh := 0
	for i := 1; i < len(res.Resarray); i++ {
		rr := &res.Resarray[i]
		st := opStatus(rr)
		fmt.Fprintf(&out, "%s %s", opName(rr.Resop), statName(st))
		if st == nfs4.NFS4_OK {
			out.WriteString(r.details(t, rr, labels, &getfh))
		}
		out.WriteString("\n")
	}
	return out.String()
}

var ddAttrs = map[string]uint32{
	"type": nfs4.FATTR4_TYPE, "size": nfs4.FATTR4_SIZE, "mode": nfs4.FATTR4_MODE, "numlinks": nfs4.FATTR4_NUMLINKS,
	"owner": nfs4.FATTR4_OWNER, "group": nfs4.FATTR4_OWNER_GROUP, "rawdev": nfs4.FATTR4_RAWDEV, "fsid": nfs4.FATTR4_FSID,
	"acl": nfs4.FATTR4_ACL, "fileid": nfs4.FATTR4_FILEID,
}

var ddTypes = map[string]nfs4.NfsFtype4{"dir": nfs4.NF4DIR, "lnk": nfs4.NF4LNK, "fifo": nfs4.NF4FIFO,
	"sock": nfs4.NF4SOCK, "chr": nfs4.NF4CHR, "blk": nfs4.NF4BLK, "reg": nfs4.NF4REG}

func (r *ddRunner) parseOp(c *wiretest.Client, f []string) (nfs4.NfsArgop4, string, error) {
	args := f[1:]
	need := func(n int) error {
		if len(args) < n {
			return fmt.Errorf("%s needs %d arguments", f[0], n)
		}
		return nil
	}
	kv := map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			kv[k] = v
		}
	}
	switch f[0] {
	case "PUTROOTFH":
		return opPutRoot(), "", nil
	case "GETFH":
		return opGetFH(), kv["as"], nil
	case "PUTFH":
		if err := need(1); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		fh, ok := r.handles[args[0]]
		if !ok && args[0] != "empty" {
			return nfs4.NfsArgop4{}, "", fmt.Errorf("no handle %q", args[0])
		}
		return opPutFH(fh), "", nil
	case "SAVEFH":
		return opSaveFH(), "", nil
	case "RESTOREFH":
		return opRestFH(), "", nil
	case "LOOKUPP":
		return opLookupP(), "", nil
	case "READLINK":
		return opReadlink(), "", nil
	case "COMMIT":
		return opCommit(), "", nil
	case "CLOSE":
		return opClose(currentSid), "", nil
	case "LOOKUP", "REMOVE", "LINK":
		if err := need(1); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		name := unquote(args[0])
		switch f[0] {
		case "LOOKUP":
			return opLookup(name), "", nil
		case "REMOVE":
			return opRemove(name), "", nil
		}
		return opLink(name), "", nil
	case "RENAME":
		if err := need(2); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		return opRename(unquote(args[0]), unquote(args[1])), "", nil
	case "CREATE":
		if err := need(2); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		typ, ok := ddTypes[args[0]]
		if !ok {
			return nfs4.NfsArgop4{}, "", fmt.Errorf("bad type %q", args[0])
		}
		ct := nfs4.Createtype4{Type: typ}
		switch typ {
		case nfs4.NF4LNK:
			var target nfs4.Linktext4
			if len(args) > 2 {
				target = nfs4.Linktext4(unquote(args[2]))
			}
			ct.Linkdata = &target
		case nfs4.NF4CHR, nfs4.NF4BLK:
			ct.Devdata = &nfs4.Specdata4{Specdata1: 1, Specdata2: 2}
		}
		return opCreate(unquote(args[1]), ct, nfs4.Fattr4{}), "", nil
	case "OPEN":
		if err := need(1); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		a := openArgs{name: unquote(args[0]), owner: kv["owner"]}
		switch kv["access"] {
		case "", "r":
			a.access = nfs4.OPEN4_SHARE_ACCESS_READ
		case "w":
			a.access = nfs4.OPEN4_SHARE_ACCESS_WRITE
		case "rw":
			a.access = nfs4.OPEN4_SHARE_ACCESS_BOTH
		}
		switch kv["deny"] {
		case "r":
			a.deny = nfs4.OPEN4_SHARE_DENY_READ
		case "w":
			a.deny = nfs4.OPEN4_SHARE_DENY_WRITE
		case "rw":
			a.deny = nfs4.OPEN4_SHARE_DENY_BOTH
		}
		if m, ok := kv["create"]; ok {
			a.create = true
			switch m {
			case "unchecked":
				a.mode = nfs4.UNCHECKED4
			case "guarded":
				a.mode = nfs4.GUARDED4
			case "exclusive":
				a.mode, a.verf = nfs4.EXCLUSIVE4_1, nfs4.Verifier4{7}
			default:
				return nfs4.NfsArgop4{}, "", fmt.Errorf("bad create mode %q", m)
			}
		}
		return opOpen(c.ClientID, a), "", nil
	case "WRITE", "READ":
		if err := need(2); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		off, err := strconv.ParseUint(args[0], 10, 64)
		if err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		if f[0] == "WRITE" {
			return opWrite(currentSid, off, nfs4.UNSTABLE4, []byte(unquote(args[1]))), "", nil
		}
		n, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		return opRead(currentSid, off, uint32(n)), "", nil
	case "GETATTR":
		if err := need(1); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		var attrs []uint32
		for _, name := range strings.Split(args[0], ",") {
			n, ok := ddAttrs[name]
			if !ok {
				return nfs4.NfsArgop4{}, "", fmt.Errorf("unknown attribute %q", name)
			}
			attrs = append(attrs, n)
		}
		return opGetattr(attrs...), "", nil
	case "SETATTR", "VERIFY", "NVERIFY":
		if err := need(1); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		fa, err := parseAttrVals(args[0])
		if err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		switch f[0] {
		case "SETATTR":
			return opSetattr(currentSid, fa), "", nil
		case "VERIFY":
			return opVerify(fa), "", nil
		}
		return opNVerify(fa), "", nil
	case "READDIR":
		var cookie uint64
		if len(args) > 0 {
			v, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil {
				return nfs4.NfsArgop4{}, "", err
			}
			cookie = v
		}
		return opReaddir(cookie, nfs4.Verifier4{}, 8192, nfs4.FATTR4_TYPE), "", nil
	case "SECINFO_NO_NAME":
		s := nfs4.SECINFO_STYLE4_CURRENT_FH
		if len(args) > 0 && args[0] == "parent" {
			s = nfs4.SECINFO_STYLE4_PARENT
		}
		return nfs4.NfsArgop4{Argop: nfs4.OP_SECINFO_NO_NAME, OpsecinfoNoName: &s}, "", nil
	case "OP":
		if err := need(1); err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		n, err := strconv.ParseInt(args[0], 10, 32)
		if err != nil {
			return nfs4.NfsArgop4{}, "", err
		}
		return nfs4.NfsArgop4{Argop: nfs4.NfsOpnum4(n)}, "", nil
	}
	return nfs4.NfsArgop4{}, "", fmt.Errorf("unknown operation %q", f[0])
}

// unquote lets names be written in Go quoted form ("a b", "\x00"); the
// special name <256> stands for a 256-byte name.
func unquote(s string) string {
	if s == "<256>" {
		return strings.Repeat("n", 256)
	}
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}
	return s
}

func parseAttrVals(s string) (nfs4.Fattr4, error) {
	var vals []attrVal
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "size":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nfs4.Fattr4{}, err
			}
			vals = append(vals, aSize(n))
		case "mode":
			n, err := strconv.ParseUint(v, 8, 32)
			if err != nil {
				return nfs4.Fattr4{}, err
			}
			vals = append(vals, aMode(uint32(n)))
		case "owner":
			vals = append(vals, aOwner(v))
		case "group":
			vals = append(vals, aGroup(v))
		case "type":
			vals = append(vals, aType(uint32(ddTypes[v])))
		case "acl": // an empty ACL: Shoal does not support the attribute
			vals = append(vals, attrVal{nfs4.FATTR4_ACL, func(e *xdr.Encoder) { e.Uint32(0) }})
		default:
			return nfs4.Fattr4{}, fmt.Errorf("unknown attribute %q", k)
		}
	}
	return fattr(vals...), nil
}

func (r *ddRunner) details(t *testing.T, rr *nfs4.NfsResop4, labels []string, getfh *int) string {
	switch rr.Resop {
	case nfs4.OP_GETFH:
		if *getfh < len(labels) && labels[*getfh] != "" {
			r.handles[labels[*getfh]] = bytesClone(rr.Opgetfh.Resok4.Object)
		}
		*getfh++
	case nfs4.OP_GETATTR:
		m, err := decodeAttrs(&rr.Opgetattr.Resok4.ObjAttributes)
		if err != nil {
			t.Fatalf("GETATTR: %v", err)
		}
		names := make([]string, 0, len(m))
		for name, n := range ddAttrs {
			if v, ok := m[n]; ok {
				names = append(names, name+"="+formatAttr(n, v))
			}
		}
		sort.Strings(names)
		if len(names) == 0 {
			return ""
		}
		return " " + strings.Join(names, " ")
	case nfs4.OP_READ:
		ok := rr.Opread.Resok4
		return fmt.Sprintf(" %q eof=%v", ok.Data, ok.Eof)
	case nfs4.OP_READLINK:
		return fmt.Sprintf(" %q", rr.Opreadlink.Resok4.Link)
	case nfs4.OP_READDIR:
		ok := rr.Opreaddir.Resok4
		var b strings.Builder
		for e := ok.Reply.Entries; e != nil; e = e.Nextentry {
			b.WriteString(" " + string(e.Name))
		}
		fmt.Fprintf(&b, " eof=%v", ok.Reply.Eof)
		return b.String()
	}
	return ""
}

func formatAttr(n uint32, v any) string {
	switch n {
	case nfs4.FATTR4_TYPE:
		for name, typ := range ddTypes {
			if v == uint32(typ) {
				return name
			}
		}
	case nfs4.FATTR4_MODE:
		return fmt.Sprintf("%04o", v)
	case nfs4.FATTR4_RAWDEV:
		rd := v.([2]uint64)
		return fmt.Sprintf("%d:%d", rd[0], rd[1])
	}
	return fmt.Sprint(v)
}
