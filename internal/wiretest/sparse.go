package wiretest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// Sparse runs the NFSv4.2 sparse-file operations (RFC 7862 §15: SEEK,
// READ_PLUS, DEALLOCATE, ALLOCATE) against an empty regular file fh opened
// for reading and writing under sid, one step after the other, and checks
// every answer against a model of the file's bytes. The same steps run on
// `shoal serve` and on a pNFS metadata server (over 1 MiB stripe units),
// where every step must answer the same.
//
// The file the steps build: A at [0, 128K), B at [3M, 3M+128K), size 6M;
// then [64K, 3M+64K) deallocated; then [6M, 8M) allocated. Every hole is
// 64 KiB aligned, so file systems that track holes in blocks of up to
// 64 KiB report them exactly.
func Sparse(t *testing.T, c *Client, fh []byte, sid nfs4.Stateid4) {
	t.Helper()
	const (
		k64  = 64 << 10
		k128 = 128 << 10
		mib  = 1 << 20
	)
	model := make([]byte, 6*mib)
	a, b := bytes.Repeat([]byte{'A'}, k128), bytes.Repeat([]byte{'B'}, k128)
	copy(model, a)
	copy(model[3*mib:], b)

	putFH := NfsArgop(nfs4.NfsArgop4{Argop: nfs4.OP_PUTFH, Opputfh: &nfs4.PUTFH4args{Object: fh}})
	write := func(off uint64, data []byte) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{Stateid: sid, Offset: off, Stable: nfs4.FILE_SYNC4, Data: data}}
	}
	seek := func(off uint64, what nfs4.DataContent4) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_SEEK, Opseek: &nfs4.SEEK4args{SaStateid: sid, SaOffset: off, SaWhat: what}}
	}
	readPlus := func(off uint64, n uint32) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_READ_PLUS, OpreadPlus: &nfs4.READPLUS4args{RpaStateid: sid, RpaOffset: off, RpaCount: n}}
	}
	read := func(off uint64, n uint32) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{Stateid: sid, Offset: off, Count: n}}
	}
	dealloc := func(off, n uint64) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_DEALLOCATE, Opdeallocate: &nfs4.DEALLOCATE4args{DaStateid: sid, DaOffset: off, DaLength: n}}
	}
	alloc := func(off, n uint64) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_ALLOCATE, Opallocate: &nfs4.ALLOCATE4args{AaStateid: sid, AaOffset: off, AaLength: n}}
	}
	setSize := func(size uint64) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_SETATTR, Opsetattr: &nfs4.SETATTR4args{Stateid: sid, ObjAttributes: SizeAttr(size)}}
	}
	getSize := nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: nfs4.Bitmap4{1 << nfs4.FATTR4_SIZE}}}

	// Checks of the last operation's result.
	type check func(r *nfs4.NfsResop4) error
	seekAt := func(off uint64, eof bool) check {
		return func(r *nfs4.NfsResop4) error {
			if got := r.Opseek.Resok4; got == nil || got.SrOffset != off || got.SrEof != eof {
				return fmt.Errorf("got %+v, want offset %d eof %v", got, off, eof)
			}
			return nil
		}
	}
	// readsModel checks a READ or READ_PLUS of [off, off+n) against the
	// model; holes says READ_PLUS must report at least one hole.
	readsModel := func(off uint64, n int, holes bool) check {
		return func(r *nfs4.NfsResop4) error {
			var got []byte
			var eof bool
			nholes := 0
			switch {
			case r.Opread != nil:
				got, eof = r.Opread.Resok4.Data, r.Opread.Resok4.Eof
			case r.OpreadPlus != nil:
				rp := r.OpreadPlus.RpResok4
				eof = rp.RprEof
				next := off
				for i, s := range rp.RprContents {
					var at, length uint64
					switch {
					case s.RpcContent == nfs4.NFS4_CONTENT_DATA && s.RpcData != nil:
						at, length = s.RpcData.DOffset, uint64(len(s.RpcData.DData))
						got = append(got, s.RpcData.DData...)
					case s.RpcContent == nfs4.NFS4_CONTENT_HOLE && s.RpcHole != nil:
						at, length = s.RpcHole.DiOffset, s.RpcHole.DiLength
						got = append(got, make([]byte, length)...)
						nholes++
					default:
						return fmt.Errorf("segment %d: bad content %v", i, s.RpcContent)
					}
					if at != next || length == 0 {
						return fmt.Errorf("segment %d at %d+%d, want one at %d", i, at, length, next)
					}
					next += length
				}
			}
			end := min(off+uint64(n), uint64(len(model)))
			want := model[min(off, end):end]
			if !bytes.Equal(got, want) {
				return fmt.Errorf("%d bytes differ from the %d expected (first byte %v)", len(got), len(want), firstDiff(got, want))
			}
			if wantEOF := end == uint64(len(model)); eof != wantEOF {
				return fmt.Errorf("eof %v, want %v", eof, wantEOF)
			}
			if holes && nholes == 0 {
				return fmt.Errorf("no hole segment in %d segments", len(r.OpreadPlus.RpResok4.RprContents))
			}
			return nil
		}
	}
	sizeIs := func(size uint64) check {
		return func(r *nfs4.NfsResop4) error {
			got, err := DecodeSize(r)
			if err != nil || got != size {
				return fmt.Errorf("size %d (%v), want %d", got, err, size)
			}
			return nil
		}
	}
	step := func(fn func()) check { return func(*nfs4.NfsResop4) error { fn(); return nil } }

	steps := []struct {
		name  string
		ops   []nfs4.NfsArgop4
		want  nfs4.Nfsstat4
		check check
	}{
		{"write A and B, size 6M", []nfs4.NfsArgop4{write(0, a), write(3*mib, b), setSize(6 * mib)}, nfs4.NFS4_OK, nil},
		{"SEEK data from 0", []nfs4.NfsArgop4{seek(0, nfs4.NFS4_CONTENT_DATA)}, nfs4.NFS4_OK, seekAt(0, false)},
		{"SEEK hole from 0", []nfs4.NfsArgop4{seek(0, nfs4.NFS4_CONTENT_HOLE)}, nfs4.NFS4_OK, seekAt(k128, false)},
		{"SEEK data from a hole", []nfs4.NfsArgop4{seek(k128, nfs4.NFS4_CONTENT_DATA)}, nfs4.NFS4_OK, seekAt(3*mib, false)},
		{"SEEK hole after B", []nfs4.NfsArgop4{seek(3*mib+k64, nfs4.NFS4_CONTENT_HOLE)}, nfs4.NFS4_OK, seekAt(3*mib+k128, false)},
		{"SEEK data in the sparse tail", []nfs4.NfsArgop4{seek(4*mib, nfs4.NFS4_CONTENT_DATA)}, nfs4.NFS4_OK, seekAt(6*mib, true)},
		{"SEEK hole in the sparse tail", []nfs4.NfsArgop4{seek(5*mib, nfs4.NFS4_CONTENT_HOLE)}, nfs4.NFS4_OK, seekAt(5*mib, false)},
		{"SEEK at the end", []nfs4.NfsArgop4{seek(6*mib, nfs4.NFS4_CONTENT_DATA)}, nfs4.NFS4ERR_NXIO, nil},
		{"READ_PLUS data then hole", []nfs4.NfsArgop4{readPlus(0, mib)}, nfs4.NFS4_OK, readsModel(0, mib, true)},
		{"READ_PLUS across a stripe unit", []nfs4.NfsArgop4{readPlus(3*mib-k64, mib)}, nfs4.NFS4_OK, readsModel(3*mib-k64, mib, true)},
		{"READ_PLUS of the sparse tail to EOF", []nfs4.NfsArgop4{readPlus(5*mib+k64, mib)}, nfs4.NFS4_OK, readsModel(5*mib+k64, mib, true)},
		{"READ_PLUS past EOF", []nfs4.NfsArgop4{readPlus(7*mib, 4096)}, nfs4.NFS4_OK, readsModel(7*mib, 4096, false)},
		{"DEALLOCATE across stripe units", []nfs4.NfsArgop4{dealloc(k64, 3*mib), getSize}, nfs4.NFS4_OK, step(func() {
			clear(model[k64 : 3*mib+k64])
		})},
		{"size unchanged by DEALLOCATE", []nfs4.NfsArgop4{getSize}, nfs4.NFS4_OK, sizeIs(6 * mib)},
		{"READ of the deallocated range", []nfs4.NfsArgop4{read(0, mib)}, nfs4.NFS4_OK, readsModel(0, mib, false)},
		{"READ of B's deallocated half", []nfs4.NfsArgop4{read(3*mib, k128)}, nfs4.NFS4_OK, readsModel(3*mib, k128, false)},
		{"SEEK hole after DEALLOCATE", []nfs4.NfsArgop4{seek(0, nfs4.NFS4_CONTENT_HOLE)}, nfs4.NFS4_OK, seekAt(k64, false)},
		{"SEEK data after DEALLOCATE", []nfs4.NfsArgop4{seek(k64, nfs4.NFS4_CONTENT_DATA)}, nfs4.NFS4_OK, seekAt(3*mib+k64, false)},
		{"DEALLOCATE inside a block", []nfs4.NfsArgop4{dealloc(3*mib+k64+100, 1000)}, nfs4.NFS4_OK, step(func() {
			clear(model[3*mib+k64+100 : 3*mib+k64+1100])
		})},
		{"READ around the partial DEALLOCATE", []nfs4.NfsArgop4{read(3*mib, k128)}, nfs4.NFS4_OK, readsModel(3*mib, k128, false)},
		{"DEALLOCATE past EOF", []nfs4.NfsArgop4{dealloc(7*mib, mib), getSize}, nfs4.NFS4_OK, sizeIs(6 * mib)},
		{"ALLOCATE past EOF", []nfs4.NfsArgop4{alloc(6*mib, 2*mib), getSize}, nfs4.NFS4_OK, step(func() {
			model = append(model, make([]byte, 2*mib)...)
		})},
		{"size after ALLOCATE", []nfs4.NfsArgop4{getSize}, nfs4.NFS4_OK, sizeIs(8 * mib)},
		{"READ of the allocated range", []nfs4.NfsArgop4{read(7*mib, mib)}, nfs4.NFS4_OK, readsModel(7*mib, mib, false)},
		{"ALLOCATE inside the file", []nfs4.NfsArgop4{alloc(k64, mib), getSize}, nfs4.NFS4_OK, sizeIs(8 * mib)},
		{"data intact after ALLOCATE", []nfs4.NfsArgop4{read(3*mib, mib)}, nfs4.NFS4_OK, readsModel(3*mib, mib, false)},
		{"ALLOCATE of nothing", []nfs4.NfsArgop4{alloc(0, 0)}, nfs4.NFS4ERR_INVAL, nil},
		{"DEALLOCATE overflowing", []nfs4.NfsArgop4{dealloc(1, ^uint64(0))}, nfs4.NFS4ERR_INVAL, nil},
	}
	for _, s := range steps {
		res, err := c.Compound(append([]nfs4.NfsArgop4{putFH}, s.ops...)...)
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
	}
}

// NfsArgop returns o; it names a pre-built operation in a table.
func NfsArgop(o nfs4.NfsArgop4) nfs4.NfsArgop4 { return o }

func describe(res *nfs4.COMPOUND4res, want nfs4.Nfsstat4) string {
	op := nfs4.NfsOpnum4(0)
	if n := len(res.Resarray); n > 0 {
		op = res.Resarray[n-1].Resop
	}
	return fmt.Sprintf("status %v (last op %v), want %v", res.Status, op, want)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// SizeAttr is a fattr4 setting the size.
func SizeAttr(size uint64) nfs4.Fattr4 {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], size)
	return nfs4.Fattr4{Attrmask: nfs4.Bitmap4{1 << nfs4.FATTR4_SIZE}, AttrVals: v[:]}
}

// DecodeSize returns the size from the result of a GETATTR that asked for
// the size alone.
func DecodeSize(r *nfs4.NfsResop4) (uint64, error) {
	if r.Opgetattr == nil || r.Opgetattr.Resok4 == nil {
		return 0, fmt.Errorf("not a GETATTR result: %v", r.Resop)
	}
	f := r.Opgetattr.Resok4.ObjAttributes
	if len(f.Attrmask) < 1 || f.Attrmask[0] != 1<<nfs4.FATTR4_SIZE || len(f.AttrVals) != 8 {
		return 0, fmt.Errorf("GETATTR returned %v / %d bytes, want the size alone", f.Attrmask, len(f.AttrVals))
	}
	return binary.BigEndian.Uint64(f.AttrVals), nil
}
