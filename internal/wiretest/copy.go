package wiretest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// Opener creates (or truncates) and opens a regular file for reading and
// writing, and returns its open stateid and filehandle.
type Opener func(name string) (nfs4.Stateid4, []byte)

// CopySize is the size of the source file Copy builds: three 1 MiB stripe
// units and a partial fourth, so that copies on a pNFS metadata server
// span several data servers and end inside a unit.
const CopySize = 3<<20 + 5000

// Copy runs the steps of server-side copy (RFC 7862 §15.2 COPY, §15.13
// CLONE, §15.8 OFFLOAD_CANCEL and §15.9 OFFLOAD_STATUS) within one
// server, on files made by open, and checks every answer and every copy's
// bytes against a model. The same steps run on `shoal serve` and on a pNFS
// metadata server, which must answer alike.
func Copy(t *testing.T, c *Client, open Opener) {
	t.Helper()
	const mib = 1 << 20
	pattern := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = seed + byte(i*7+i/4093)
		}
		return b
	}
	srcSid, src := open("copy-src")
	model := map[string][]byte{"copy-src": pattern(CopySize, 1)}
	files := map[string]struct {
		sid nfs4.Stateid4
		fh  []byte
	}{"copy-src": {srcSid, src}}
	for _, name := range []string{"copy-dst", "copy-over", "copy-clone", "copy-self"} {
		sid, fh := open(name)
		files[name] = struct {
			sid nfs4.Stateid4
			fh  []byte
		}{sid, fh}
		model[name] = nil
	}
	put := func(name string, data []byte) {
		t.Helper()
		f := files[name]
		for off := 0; off < len(data); off += mib {
			res, err := c.Compound(putFH(f.fh), nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: f.sid, Offset: uint64(off), Stable: nfs4.FILE_SYNC4, Data: data[off:min(off+mib, len(data))]}})
			if err != nil || res.Status != nfs4.NFS4_OK {
				t.Fatalf("WRITE %s at %d: %v %v", name, off, res, err)
			}
		}
		model[name] = bytes.Clone(data)
	}
	put("copy-src", model["copy-src"])
	put("copy-over", pattern(4*mib, 100))
	put("copy-self", pattern(mib+300, 50))

	copyOp := func(from, to string, srcOff, dstOff, count uint64, sync bool) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_COPY, Opcopy: &nfs4.COPY4args{
			CaSrcStateid: files[from].sid, CaDstStateid: files[to].sid,
			CaSrcOffset: srcOff, CaDstOffset: dstOff, CaCount: count, CaConsecutive: true, CaSynchronous: sync}}
	}
	cloneOp := func(from, to string, srcOff, dstOff, count uint64) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_CLONE, Opclone: &nfs4.CLONE4args{
			ClSrcStateid: files[from].sid, ClDstStateid: files[to].sid,
			ClSrcOffset: srcOff, ClDstOffset: dstOff, ClCount: count}}
	}
	between := func(from, to string, op nfs4.NfsArgop4) []nfs4.NfsArgop4 {
		return []nfs4.NfsArgop4{putFH(files[from].fh), {Argop: nfs4.OP_SAVEFH}, putFH(files[to].fh), op}
	}
	// apply records a copy in the model (the source's bytes past its end
	// are zeros; the destination grows to the end of the copy).
	apply := func(from, to string, srcOff, dstOff, n uint64) {
		part := make([]byte, n)
		if s := model[from]; srcOff < uint64(len(s)) {
			copy(part, s[srcOff:])
		}
		d := model[to]
		if end := dstOff + n; uint64(len(d)) < end {
			d = append(d, make([]byte, end-uint64(len(d)))...)
		}
		copy(d[dstOff:], part)
		model[to] = d
	}
	copied := func(count uint64) func(*nfs4.NfsResop4) error {
		return func(r *nfs4.NfsResop4) error {
			ok := r.Opcopy.CrResok4
			if ok == nil {
				return fmt.Errorf("no COPY result")
			}
			if ok.CrResponse.WrCount != count || len(ok.CrResponse.WrCallbackId) != 0 ||
				!ok.CrRequirements.CrSynchronous || !ok.CrRequirements.CrConsecutive {
				return fmt.Errorf("COPY answered %+v, want a synchronous consecutive copy of %d bytes", ok, count)
			}
			if ok.CrResponse.WrCommitted != nfs4.FILE_SYNC4 {
				return fmt.Errorf("COPY committed %v, want FILE_SYNC4", ok.CrResponse.WrCommitted)
			}
			return nil
		}
	}
	bogus := nfs4.Stateid4{Seqid: 1, Other: [12]byte{0xde, 0xad, 0xbe, 0xef}}

	steps := []struct {
		name  string
		ops   []nfs4.NfsArgop4
		want  nfs4.Nfsstat4
		check func(*nfs4.NfsResop4) error
		model func() // the copy's effect, applied when it succeeds
	}{
		{"COPY of the whole source (count 0: to its end)", between("copy-src", "copy-dst", copyOp("copy-src", "copy-dst", 0, 0, 0, true)),
			nfs4.NFS4_OK, copied(CopySize), func() { apply("copy-src", "copy-dst", 0, 0, CopySize) }},
		{"COPY asked asynchronous, over data, unaligned", between("copy-src", "copy-over", copyOp("copy-src", "copy-over", 12345, mib+7, 2*mib, false)),
			nfs4.NFS4_OK, copied(2 * mib), func() { apply("copy-src", "copy-over", 12345, mib+7, 2*mib) }},
		{"COPY to past the destination's end", between("copy-src", "copy-over", copyOp("copy-src", "copy-over", 0, 6*mib, mib, true)),
			nfs4.NFS4_OK, copied(mib), func() { apply("copy-src", "copy-over", 0, 6*mib, mib) }},
		{"COPY within one file, apart", between("copy-self", "copy-self", copyOp("copy-self", "copy-self", 0, 2*mib, mib+300, true)),
			nfs4.NFS4_OK, copied(mib + 300), func() { apply("copy-self", "copy-self", 0, 2*mib, mib+300) }},
		{"COPY of nothing at the source's end", between("copy-src", "copy-dst", copyOp("copy-src", "copy-dst", CopySize, 0, 0, true)),
			nfs4.NFS4_OK, copied(0), nil},
		{"COPY from past the source's end", between("copy-src", "copy-dst", copyOp("copy-src", "copy-dst", CopySize+1, 0, 1, true)),
			nfs4.NFS4ERR_INVAL, nil, nil},
		{"COPY of a range ending past the source's end", between("copy-src", "copy-dst", copyOp("copy-src", "copy-dst", mib, 0, CopySize, true)),
			nfs4.NFS4ERR_INVAL, nil, nil},
		{"COPY within one file, overlapping", between("copy-self", "copy-self", copyOp("copy-self", "copy-self", 0, 100, 1000, true)),
			nfs4.NFS4ERR_INVAL, nil, nil},
		{"COPY from another server", func() []nfs4.NfsArgop4 {
			op := copyOp("copy-src", "copy-dst", 0, 0, 10, true)
			name := nfs4.Utf8strCis("elsewhere.example")
			op.Opcopy.CaSourceServer = []nfs4.Netloc4{{NlType: nfs4.NL4_NAME, NlName: &name}}
			return between("copy-src", "copy-dst", op)
		}(), nfs4.NFS4ERR_NOTSUPP, nil, nil},
		{"COPY without a saved filehandle", []nfs4.NfsArgop4{putFH(files["copy-dst"].fh), copyOp("copy-src", "copy-dst", 0, 0, 10, true)},
			nfs4.NFS4ERR_NOFILEHANDLE, nil, nil},
		{"COPY from a directory", []nfs4.NfsArgop4{{Argop: nfs4.OP_PUTROOTFH}, {Argop: nfs4.OP_SAVEFH}, putFH(files["copy-dst"].fh),
			copyOp("copy-src", "copy-dst", 0, 0, 10, true)}, nfs4.NFS4ERR_ISDIR, nil, nil},
		{"COPY under an unknown source stateid", func() []nfs4.NfsArgop4 {
			op := copyOp("copy-src", "copy-dst", 0, 0, 10, true)
			op.Opcopy.CaSrcStateid = bogus
			return between("copy-src", "copy-dst", op)
		}(), nfs4.NFS4ERR_BAD_STATEID, nil, nil},
		{"COPY under an unknown destination stateid", func() []nfs4.NfsArgop4 {
			op := copyOp("copy-src", "copy-dst", 0, 0, 10, true)
			op.Opcopy.CaDstStateid = bogus
			return between("copy-src", "copy-dst", op)
		}(), nfs4.NFS4ERR_BAD_STATEID, nil, nil},
		{"clone_blksize", []nfs4.NfsArgop4{putFH(src), {Argop: nfs4.OP_GETATTR,
			Opgetattr: &nfs4.GETATTR4args{AttrRequest: nfs4.Bitmap4{0, 0, 1 << (nfs4.FATTR4_CLONE_BLKSIZE - 64)}}}},
			nfs4.NFS4_OK, func(r *nfs4.NfsResop4) error {
				f := r.Opgetattr.Resok4.ObjAttributes
				if len(f.AttrVals) != 4 || binary.BigEndian.Uint32(f.AttrVals) < 2 || mib%binary.BigEndian.Uint32(f.AttrVals) != 0 {
					return fmt.Errorf("clone_blksize %v %x, want a divisor of 1 MiB above 1", f.Attrmask, f.AttrVals)
				}
				return nil
			}, nil},
		{"CLONE of the whole source", between("copy-src", "copy-clone", cloneOp("copy-src", "copy-clone", 0, 0, 0)),
			nfs4.NFS4_OK, nil, func() { apply("copy-src", "copy-clone", 0, 0, CopySize) }},
		{"CLONE of aligned blocks within a file", between("copy-clone", "copy-clone", cloneOp("copy-clone", "copy-clone", 0, 4*mib, mib)),
			nfs4.NFS4_OK, nil, func() { apply("copy-clone", "copy-clone", 0, 4*mib, mib) }},
		{"CLONE from an unaligned offset", between("copy-src", "copy-clone", cloneOp("copy-src", "copy-clone", 1, 0, mib)),
			nfs4.NFS4ERR_INVAL, nil, nil},
		{"CLONE of a partial block short of the source's end", between("copy-src", "copy-clone", cloneOp("copy-src", "copy-clone", 0, 0, 1000)),
			nfs4.NFS4ERR_INVAL, nil, nil},
		{"CLONE past the source's end", between("copy-src", "copy-clone", cloneOp("copy-src", "copy-clone", 0, 0, 8*mib)),
			nfs4.NFS4ERR_INVAL, nil, nil},
		{"CLONE within one file, overlapping", between("copy-clone", "copy-clone", cloneOp("copy-clone", "copy-clone", 0, 0, mib)),
			nfs4.NFS4ERR_INVAL, nil, nil},
		{"OFFLOAD_STATUS of no copy", []nfs4.NfsArgop4{putFH(files["copy-dst"].fh), {Argop: nfs4.OP_OFFLOAD_STATUS,
			OpoffloadStatus: &nfs4.OFFLOADSTATUS4args{OsaStateid: bogus}}}, nfs4.NFS4ERR_BAD_STATEID, nil, nil},
		{"OFFLOAD_CANCEL of no copy", []nfs4.NfsArgop4{putFH(files["copy-dst"].fh), {Argop: nfs4.OP_OFFLOAD_CANCEL,
			OpoffloadCancel: &nfs4.OFFLOADCANCEL4args{OcaStateid: bogus}}}, nfs4.NFS4ERR_BAD_STATEID, nil, nil},
	}
	for _, s := range steps {
		res, err := c.Compound(s.ops...)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if res.Status != s.want {
			t.Errorf("%s: %v", s.name, describe(res, s.want))
			continue
		}
		if s.check != nil {
			if err := s.check(&res.Resarray[len(res.Resarray)-1]); err != nil {
				t.Errorf("%s: %v", s.name, err)
			}
		}
		if s.model != nil {
			s.model()
		}
	}
	// Every file reads back as the model says, and has its size.
	for name, want := range model {
		f := files[name]
		got, err := ReadFile(c, f.fh, f.sid)
		if err != nil {
			t.Errorf("read back %s: %v", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, want %d; first difference at %d", name, len(got), len(want), firstDiff(got, want))
		}
	}
}

// ReadFile reads a whole file with GETATTR and READs of 1 MiB.
func ReadFile(c *Client, fh []byte, sid nfs4.Stateid4) ([]byte, error) {
	res, err := c.Compound(putFH(fh), nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: nfs4.Bitmap4{1 << nfs4.FATTR4_SIZE}}})
	if err != nil || res.Status != nfs4.NFS4_OK {
		return nil, fmt.Errorf("GETATTR: %v %v", res, err)
	}
	size, err := DecodeSize(&res.Resarray[2])
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, size)
	for uint64(len(out)) < size {
		res, err := c.Compound(putFH(fh), nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
			Stateid: sid, Offset: uint64(len(out)), Count: uint32(min(size-uint64(len(out)), 1<<20))}})
		if err != nil || res.Status != nfs4.NFS4_OK {
			return nil, fmt.Errorf("READ at %d: %v %v", len(out), res, err)
		}
		d := res.Resarray[2].Opread.Resok4.Data
		if len(d) == 0 {
			return nil, fmt.Errorf("READ at %d of %d: nothing", len(out), size)
		}
		out = append(out, d...)
	}
	return out, nil
}

func putFH(fh []byte) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_PUTFH, Opputfh: &nfs4.PUTFH4args{Object: fh}}
}
