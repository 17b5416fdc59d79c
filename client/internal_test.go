package client

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

func TestStatusErrorIs(t *testing.T) {
	tests := []struct {
		status nfs4.Nfsstat4
		target error
		want   bool
	}{
		{nfs4.NFS4ERR_NOENT, fs.ErrNotExist, true},
		{nfs4.NFS4ERR_NOENT, syscall.ENOENT, true},
		{nfs4.NFS4ERR_EXIST, fs.ErrExist, true},
		{nfs4.NFS4ERR_ACCESS, fs.ErrPermission, true},
		{nfs4.NFS4ERR_PERM, fs.ErrPermission, true},
		{nfs4.NFS4ERR_NOTEMPTY, syscall.ENOTEMPTY, true},
		{nfs4.NFS4ERR_DENIED, syscall.EAGAIN, true},
		{nfs4.NFS4ERR_NOENT, fs.ErrExist, false},
		{nfs4.NFS4ERR_BADSESSION, fs.ErrNotExist, false},
		{nfs4.NFS4ERR_NOENT, &StatusError{NFSStatus: uint32(nfs4.NFS4ERR_NOENT)}, true},
	}
	for _, tc := range tests {
		err := pathErr("op", "/p", statusErr(nfs4.OP_LOOKUP, tc.status))
		if got := errors.Is(err, tc.target); got != tc.want {
			t.Errorf("errors.Is(%v, %v) = %v, want %v", err, tc.target, got, tc.want)
		}
	}
	var se *StatusError
	err := pathErr("stat", "/x", statusErr(nfs4.OP_LOOKUP, nfs4.NFS4ERR_NOENT))
	if !errors.As(err, &se) || se.NFSStatus != 2 || se.Status() != 2 || se.Op != "LOOKUP" {
		t.Fatalf("errors.As: %#v", se)
	}
	if want := "stat /x: LOOKUP: no such file or directory (NFS4ERR_NOENT)"; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

func TestSetAttrRoundTrip(t *testing.T) {
	mode, uid, gid, size := uint32(0o4755), uint32(1000), uint32(100), uint64(1<<40)
	mt := time.Unix(1_700_000_000, 123456789)
	sa := SetAttr{Mode: &mode, UID: &uid, GID: &gid, Size: &size, Mtime: &mt}
	f := sa.encode()
	if want := attrBits(nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE, nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP, nfs4.FATTR4_TIME_MODIFY_SET); !slices.Equal(f.Attrmask, want) {
		t.Fatalf("mask %v, want %v", f.Attrmask, want)
	}
	// Decode the same values as GETATTR would return them (TIME_MODIFY
	// instead of TIME_MODIFY_SET, without the set_it discriminant).
	e := xdr.NewEncoder(64)
	e.Uint32(uint32(nfs4.NF4REG))
	e.Uint64(size)
	e.Uint32(mode)
	e.String("1000")
	e.String("100@example.com")
	e.Int64(mt.Unix())
	e.Uint32(uint32(mt.Nanosecond()))
	var a Attr
	err := decodeFattr(&nfs4.Fattr4{
		Attrmask: attrBits(nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE, nfs4.FATTR4_MODE, nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP, nfs4.FATTR4_TIME_MODIFY),
		AttrVals: e.Bytes(),
	}, &a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Type != TypeRegular || a.Size != size || a.Mode != mode || a.UID != uid || a.GID != gid || !a.Mtime.Equal(mt) {
		t.Fatalf("decoded %+v", a)
	}
	if a.FileMode()&fs.ModeSetuid == 0 || a.FileMode().Perm() != 0o755 {
		t.Fatalf("FileMode %v", a.FileMode())
	}
	// Truncated values and unknown attributes are errors, not panics.
	if err := decodeFattr(&nfs4.Fattr4{Attrmask: attrBits(nfs4.FATTR4_SIZE), AttrVals: []byte{1, 2}}, &a, nil); err == nil {
		t.Fatal("truncated fattr4 decoded")
	}
	if err := decodeFattr(&nfs4.Fattr4{Attrmask: attrBits(nfs4.FATTR4_ACL)}, &a, nil); err == nil {
		t.Fatal("undecodable attribute accepted")
	}
}

func TestParseOwner(t *testing.T) {
	for in, want := range map[string]uint32{"0": 0, "1000": 1000, "42@dom": 42, "root": 0, "alice@dom": nobody, "": nobody} {
		if got := parseOwner(in); got != want {
			t.Errorf("parseOwner(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestSplitPath(t *testing.T) {
	tests := map[string][]string{
		"":            nil,
		"/":           nil,
		"/a/b":        {"a", "b"},
		"a//b/./c/":   {"a", "b", "c"},
		"/a/../../b":  {"b"},
		"/x/y/../z/.": {"x", "z"},
	}
	for in, want := range tests {
		if got := splitPath(in); !slices.Equal(got, want) {
			t.Errorf("splitPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSlotTable(t *testing.T) {
	ctx := context.Background()
	st := newSlotTable(2)
	s0, q0, hi, err := st.acquire(ctx)
	if err != nil || s0 != 0 || q0 != 1 || hi != 1 {
		t.Fatalf("first acquire: slot %d seq %d highest %d %v", s0, q0, hi, err)
	}
	s1, _, _, _ := st.acquire(ctx)
	// The table is full: a third caller waits until a slot frees up.
	got := make(chan int, 1)
	go func() {
		s, seq, _, err := st.acquire(ctx)
		if err != nil || seq != 2 {
			t.Errorf("waiting acquire: seq %d, %v", seq, err)
		}
		got <- s
	}()
	st.release(s0, true, -1)
	if s := <-got; s != s0 {
		t.Fatalf("waiter got slot %d, want %d", s, s0)
	}
	// A failed request does not advance the sequence id.
	st.release(s1, false, -1)
	if _, seq, _, _ := st.acquire(ctx); seq != 1 {
		t.Fatalf("seq after unprocessed request: %d, want 1", seq)
	}
	// The server's target shrinks the usable table.
	st.release(s0, true, 0)
	st.release(s1, true, 0)
	cctx, cancel := context.WithCancel(ctx)
	if s, _, hi, _ := st.acquire(cctx); s != 0 || hi != 0 {
		t.Fatalf("after target 0: slot %d highest %d", s, hi)
	}
	cancel()
	if _, _, _, err := st.acquire(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire on a full table with a cancelled context: %v", err)
	}
	st.kill()
	if _, _, _, err := st.acquire(ctx); !errors.Is(err, errSessionGone) {
		t.Fatalf("acquire after kill: %v", err)
	}
}

func TestCallbackHandler(t *testing.T) {
	c := &Client{}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer c.cancel()
	var sid nfs4.Sessionid4
	copy(sid[:], "session-id-12345")
	args := nfs4.CBCOMPOUND4args{Minorversion: 1, Argarray: []nfs4.NfsCbArgop4{
		{Argop: nfs4.OP_CB_SEQUENCE, Opcbsequence: &nfs4.CBSEQUENCE4args{CsaSessionid: sid, CsaSequenceid: 7, CsaSlotid: 0}},
		{Argop: nfs4.OP_CB_LAYOUTRECALL, Opcblayoutrecall: &nfs4.CBLAYOUTRECALL4args{
			CloraRecall: nfs4.Layoutrecall4{LorRecalltype: nfs4.LAYOUTRECALL4_ALL},
		}},
	}}
	e := xdr.NewEncoder(128)
	stat := c.serveCallback(context.Background(), &rpc.Call{Prog: nfs4.NFS4_CALLBACK, Proc: nfs4.CB_COMPOUND, Args: xdr.Marshal(&args)}, e)
	if stat != rpc.Success {
		t.Fatalf("accept stat %v", stat)
	}
	var res nfs4.CBCOMPOUND4res
	if err := xdr.Unmarshal(e.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != nfs4.NFS4ERR_NOMATCHING_LAYOUT || len(res.Resarray) != 2 {
		t.Fatalf("CB_COMPOUND result %v with %d results", res.Status, len(res.Resarray))
	}
	seq := res.Resarray[0].Opcbsequence
	if seq == nil || seq.CsrStatus != nfs4.NFS4_OK || seq.CsrResok4.CsrSequenceid != 7 || seq.CsrResok4.CsrSessionid != sid {
		t.Fatalf("CB_SEQUENCE result %+v", seq)
	}
	if stat := c.serveCallback(context.Background(), &rpc.Call{Prog: nfs4.NFS4_CALLBACK, Proc: nfs4.CB_COMPOUND, Args: []byte{1}}, xdr.NewEncoder(8)); stat != rpc.GarbageArgs {
		t.Fatalf("garbage CB_COMPOUND: %v", stat)
	}
	if stat := c.serveCallback(context.Background(), &rpc.Call{Prog: nfs4.NFS4_CALLBACK, Proc: nfs4.CB_NULL}, xdr.NewEncoder(8)); stat != rpc.Success {
		t.Fatalf("CB_NULL: %v", stat)
	}
}

func TestDialRefused(t *testing.T) {
	_, err := Dial(context.Background(), "127.0.0.1:1", Options{DialTimeout: 5 * time.Second})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial of a closed port: %v", err)
	}
}

func TestUnlockForgetsCoveredRanges(t *testing.T) {
	tests := []struct {
		held         []lockRange
		off, length  uint64
		wantKeptOffs []uint64
	}{
		{[]lockRange{{0, 10, true}, {20, 10, true}}, 0, 10, []uint64{20}},
		{[]lockRange{{0, 10, true}, {20, 10, true}}, 0, lockLen(0), nil},
		{[]lockRange{{5, lockLen(0), true}}, 0, 100, []uint64{5}}, // to-EOF lock only partly covered
		{[]lockRange{{5, lockLen(0), true}}, 5, lockLen(0), nil},
		{[]lockRange{{0, 10, false}}, 2, 4, []uint64{0}},
	}
	for i, tc := range tests {
		var kept []uint64
		for _, l := range forgetCovered(tc.held, tc.off, tc.length) {
			kept = append(kept, l.off)
		}
		if !slices.Equal(kept, tc.wantKeptOffs) {
			t.Errorf("case %d: kept %v, want %v", i, kept, tc.wantKeptOffs)
		}
	}
}

// TestStatSizeAfterWriteBack: a GETATTR answered while a write-back was in
// flight may carry the size from before it, and once the write-back has
// ended nothing is pending any more. statSize must still report the
// cache's size for a GETATTR sent before the write-back ended (the race
// behind a Stat that saw a file shorter than what was written to it).
func TestStatSizeAfterWriteBack(t *testing.T) {
	dc := newDataCache(&Client{}, Policy{BlockSize: 64 << 10, CacheSize: 1 << 20})
	ino := &inode{key: "fh", pages: map[int64]*page{}, writers: map[*File]struct{}{}, size: 1000}
	const server = 600 // what the server had before the write-back
	tests := []struct {
		name    string
		pending bool // a write-back still in flight at statSize
		ended   bool // one ended between the GETATTR and statSize
		want    uint64
	}{
		{"idle", false, false, server},
		{"in-flight", true, false, 1000},
		{"ended-meanwhile", false, true, 1000},
		{"ended-and-another-in-flight", true, true, 1000},
	}
	for _, tc := range tests {
		ino.wb = 0
		if tc.pending {
			ino.wb = 1
		}
		var runs []run
		if tc.ended {
			// A write-back of one page, in flight when the GETATTR goes
			// out; writeRuns ends it (with no File to carry it, it fails
			// at once, which ends it all the same).
			pg := &page{ino: ino, wb: 1}
			runs = []run{{pages: []*page{pg}}}
			ino.wb++
		}
		gen := dc.flushGen()
		if err := dc.writeRuns(context.Background(), ino, nil, runs); tc.ended != (err != nil) {
			t.Fatalf("%s: writeRuns: %v", tc.name, err)
		}
		if got := dc.statSize(ino, server, gen); got != tc.want {
			t.Errorf("%s: statSize = %d, want %d", tc.name, got, tc.want)
		}
	}
}
