package nfs3

import (
	"bytes"
	"os"
	"os/exec"
	"reflect"
	"testing"

	"github.com/shoalfs/shoal/internal/xdr"
)

// TestGeneratedUpToDate fails when nfs3_xdr.go no longer matches
// spec/nfs3.x.
func TestGeneratedUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	out, err := exec.Command("go", "run", "../../tools/xdrgen", "-pkg", "nfs3", "../../spec/nfs3.x").Output()
	if err != nil {
		t.Fatalf("xdrgen: %v", err)
	}
	want, err := os.ReadFile("nfs3_xdr.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, want) {
		t.Fatal("nfs3_xdr.go is stale; run go generate ./internal/nfs3")
	}
}

type codec interface {
	xdr.Marshaler
	xdr.Unmarshaler
}

// replies are the results the client decodes from the network, each with
// a constructor for a fresh value.
var replies = []struct {
	name string
	new  func() codec
}{
	{"mountres3", func() codec { return new(Mountres3) }},
	{"GETATTR3res", func() codec { return new(GETATTR3res) }},
	{"SETATTR3res", func() codec { return new(SETATTR3res) }},
	{"LOOKUP3res", func() codec { return new(LOOKUP3res) }},
	{"READ3res", func() codec { return new(READ3res) }},
	{"WRITE3res", func() codec { return new(WRITE3res) }},
	{"CREATE3res", func() codec { return new(CREATE3res) }},
	{"REMOVE3res", func() codec { return new(REMOVE3res) }},
	{"COMMIT3res", func() codec { return new(COMMIT3res) }},
}

func sampleAttr() *Fattr3 {
	return &Fattr3{Type: NF3REG, Mode: 0o640, Nlink: 1, Uid: 1000, Gid: 2000, Size: 5, Fileid: 9}
}

func samples() []codec {
	post := PostOpAttr{AttributesFollow: true, Attributes: sampleAttr()}
	wcc := WccData{Before: PreOpAttr{AttributesFollow: true, Attributes: &WccAttr{Size: 3}}, After: post}
	fh := NfsFh3{Data: []byte("handle")}
	return []codec{
		&Mountres3{FhsStatus: MNT3_OK, Mountinfo: &Mountres3Ok{Fhandle: []byte("root"), AuthFlavors: []int32{1}}},
		&Mountres3{FhsStatus: MNT3ERR_NOENT},
		&GETATTR3res{Status: NFS3_OK, ObjAttributes: sampleAttr()},
		&GETATTR3res{Status: NFS3ERR_STALE},
		&SETATTR3res{Status: NFS3ERR_PERM, ObjWcc: wcc},
		&LOOKUP3res{Status: NFS3_OK, Resok: &LOOKUP3resok{Object: fh, ObjAttributes: post}},
		&LOOKUP3res{Status: NFS3ERR_NOENT, Resfail: &post},
		&READ3res{Status: NFS3_OK, Resok: &READ3resok{FileAttributes: post, Count: 5, Eof: true, Data: []byte("hello")}},
		&WRITE3res{Status: NFS3_OK, Resok: &WRITE3resok{FileWcc: wcc, Count: 5, Committed: FILE_SYNC, Verf: Writeverf3{1, 2}}},
		&WRITE3res{Status: NFS3ERR_ACCES, Resfail: &wcc},
		&CREATE3res{Status: NFS3_OK, Resok: &CREATE3resok{Obj: PostOpFh3{HandleFollows: true, Handle: &fh}, ObjAttributes: post, DirWcc: wcc}},
		&REMOVE3res{Status: NFS3_OK, DirWcc: wcc},
		&COMMIT3res{Status: NFS3_OK, Resok: &COMMIT3resok{FileWcc: wcc, Verf: Writeverf3{7}}},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, in := range samples() {
		b := xdr.Marshal(in)
		out := reflect.New(reflect.TypeOf(in).Elem()).Interface().(codec)
		if err := xdr.Unmarshal(b, out); err != nil {
			t.Errorf("%T: %v", in, err)
			continue
		}
		if again := xdr.Marshal(out); !bytes.Equal(again, b) {
			t.Errorf("%T re-encodes differently:\n%x\n%x", in, again, b)
		}
	}
}

func TestBounds(t *testing.T) {
	big := &LOOKUP3res{Status: NFS3_OK, Resok: &LOOKUP3resok{Object: NfsFh3{Data: make([]byte, NFS3_FHSIZE+1)}}}
	if err := xdr.Unmarshal(xdr.Marshal(big), new(LOOKUP3res)); err == nil {
		t.Error("a 65-byte filehandle decoded")
	}
	mnt := &Mountres3{FhsStatus: MNT3_OK, Mountinfo: &Mountres3Ok{AuthFlavors: make([]int32, MNT3_MAXFLAVORS+1)}}
	if err := xdr.Unmarshal(xdr.Marshal(mnt), new(Mountres3)); err == nil {
		t.Error("a MNT reply with too many flavors decoded")
	}
}

// FuzzReplies feeds arbitrary bytes to the decoder of every reply the
// client reads from a server: a decoder must not panic, and what it
// accepts must re-encode into bytes it accepts again.
func FuzzReplies(f *testing.F) {
	for _, s := range samples() {
		f.Add(xdr.Marshal(s))
	}
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, r := range replies {
			v := r.new()
			if xdr.Unmarshal(b, v) != nil {
				continue
			}
			w := r.new()
			if err := xdr.Unmarshal(xdr.Marshal(v), w); err != nil {
				t.Fatalf("%s: re-decoding own encoding: %v", r.name, err)
			}
		}
	})
}
