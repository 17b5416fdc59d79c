package cluster

import (
	"bytes"
	"context"
	"net"
	"syscall"
	"testing"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/store"
)

// FuzzControlCall feeds arbitrary argument bytes to every procedure of both
// ends of the control protocol (the registry's and the agent's handler):
// they must never panic, and malformed arguments must be GARBAGE_ARGS.
func FuzzControlCall(f *testing.F) {
	var sidBytes [16]byte
	seeds := []struct {
		proc uint32
		args xdr.Marshaler
	}{
		{ctlproto.CTLPROC_REGISTER, &ctlproto.CtlRegisterArgs{Revision: ctlproto.CTL_VERSION, Token: testSecret, DsId: "ds", Addrs: []string{"a:1"}}},
		{ctlproto.CTLPROC_REGISTER, &ctlproto.CtlRegisterArgs{Revision: ctlproto.CTL_VERSION, Token: testSecret,
			ClusterId: bytes.Repeat([]byte{1}, ctlproto.CTL_CLUSTER_ID_SIZE), DsId: "other-cluster", Addrs: []string{"a:1"}}},
		{ctlproto.CTLPROC_HEARTBEAT, &ctlproto.CtlHeartbeatArgs{Registration: 1}},
		{ctlproto.CTLPROC_CHECK_STATEID, &ctlproto.CtlCheckStateidArgs{Ino: 1, Stateid: sidBytes, Write: true}},
		{ctlproto.CTLPROC_OBJ_READ, &ctlproto.CtlReadArgs{Ino: 1, Offset: 10, Count: 100}},
		{ctlproto.CTLPROC_OBJ_WRITE, &ctlproto.CtlWriteArgs{Ino: 1, Offset: 5, Data: []byte("hello")}},
		{ctlproto.CTLPROC_OBJ_COMMIT, &ctlproto.CtlInoArgs{Ino: 1}},
		{ctlproto.CTLPROC_OBJ_TRUNCATE, &ctlproto.CtlTruncateArgs{Ino: 1, Size: 3}},
		{ctlproto.CTLPROC_OBJ_REMOVE, &ctlproto.CtlInoArgs{Ino: 1}},
		{ctlproto.CTLPROC_FENCE, &ctlproto.CtlClientArgs{Clientid: 4}},
		{ctlproto.CTLPROC_UNFENCE, &ctlproto.CtlClientArgs{Clientid: 4}},
		{ctlproto.CTLPROC_OBJ_GETSIZE, &ctlproto.CtlInoArgs{Ino: 1}},
		{ctlproto.CTLPROC_OBJ_PUNCH, &ctlproto.CtlPunchArgs{Ino: 1, Offset: 2, Length: 3}},
		{ctlproto.CTLPROC_OBJ_ALLOCATE, &ctlproto.CtlAllocateArgs{Ino: 1, Offset: 4096, Length: 8192,
			Extents: ctlproto.CtlExtents{Unit: 4096, Stride: 12288, Phase: 4096}}},
		{ctlproto.CTLPROC_OBJ_SEEK, &ctlproto.CtlSeekArgs{Ino: 1, Offset: 1, What: ctlproto.CTL_SEEK_HOLE,
			Extents: ctlproto.CtlExtents{Unit: 4096, Stride: 8192}}},
		{ctlproto.CTLPROC_OBJ_SEEK, &ctlproto.CtlSeekArgs{Ino: 1, What: ctlproto.CTL_SEEK_DATA}},
		{ctlproto.CTLPROC_OBJ_COPY, &ctlproto.CtlCopyArgs{SrcIno: 1, DstIno: 2, SrcOffset: 4096, DstOffset: 8192, Length: 12288,
			Stable: true, Extents: ctlproto.CtlExtents{Unit: 4096, Stride: 8192}}},
		{ctlproto.CTLPROC_OBJ_COPY, &ctlproto.CtlCopyArgs{SrcIno: 1, DstIno: 1, Length: 10, DstOffset: 5}},
		{ctlproto.CTLPROC_OBJ_LIST, &ctlproto.CtlListArgs{After: 0, Count: 100}},
		{ctlproto.CTLPROC_OBJ_LIST, &ctlproto.CtlListArgs{After: 1<<40 + 3, Count: 1 << 31}},
		{ctlproto.CTLPROC_FILE_SIZE, &ctlproto.CtlInoArgs{Ino: 1}},
		{ctlproto.CTLPROC_ADMIN, &ctlproto.CtlAdminArgs{Token: testSecret, Command: "status", Request: []byte("{}")}},
		{ctlproto.CTLPROC_ADMIN, &ctlproto.CtlAdminArgs{Token: []byte("wrong"), Command: "drain", Request: []byte(`{"id":"ds"}`)}},
	}
	for _, s := range seeds {
		f.Add(s.proc, xdr.Marshal(s.args))
	}
	f.Add(uint32(ctlproto.CTLPROC_RETIRE), []byte{})
	f.Add(uint32(ctlproto.CTLPROC_OBJ_WRITE), []byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})

	checker := newFakeChecker()
	reg := newTestRegistry(f, RegistryConfig{DataKey: testDataKey, JoinSecret: testSecret, CheckStateid: checker.check,
		FileSize: func(context.Context, uint64) (uint64, error) { return 10, nil }})
	st, err := store.NewLocal(f.TempDir(), store.LocalOptions{})
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	a := newBareAgent(AgentConfig{ID: "fuzz", Store: boundedStore{st}})
	defer a.cancel()
	p1, p2 := net.Pipe()
	defer p2.Close()
	conn := rpc.NewConn(p1, nil, rpc.ConnConfig{})
	defer conn.Close()

	f.Fuzz(func(t *testing.T, proc uint32, args []byte) {
		for _, h := range []rpc.Handler{reg.Handler(), rpc.HandlerFunc(a.serveRPC)} {
			c := &rpc.Call{Prog: ctlproto.SHOAL_CONTROL, Vers: ctlproto.SHOAL_CONTROL_V1, Proc: proc % 32, Args: args, Conn: conn}
			res := xdr.NewEncoder(64)
			switch st := h.ServeRPC(context.Background(), c, res); st {
			case rpc.Success, rpc.GarbageArgs, rpc.ProcUnavail:
			default:
				t.Fatalf("proc %d: accept stat %v", proc%32, st)
			}
			_ = res.Bytes()
		}
	})
}

// fuzzSpan bounds the object bytes a fuzzed call may make a data server
// reserve or copy: fuzzed offsets and lengths are up to 2^63, and a real
// store would fill the disk.
const fuzzSpan = 16 << 20

// fuzzObjects bounds how many objects the fuzzed calls reach: inode
// numbers are folded onto this many, so the store holds at most
// fuzzObjects × fuzzSpan bytes however many inputs run.
const fuzzObjects = 8

// boundedStore is the fuzz target's store: a store.Local whose objects
// stay within fuzzSpan (beyond it, EFBIG) and number at most fuzzObjects,
// so that every procedure can be fuzzed without filling the disk.
type boundedStore struct{ *store.Local }

func (b boundedStore) Open(ino uint64, create bool) (store.File, error) {
	f, err := b.Local.Open(ino%fuzzObjects, create)
	if err != nil {
		return nil, err
	}
	return boundedFile{f}, nil
}

func (b boundedStore) Truncate(ino, size uint64) error {
	if size > fuzzSpan {
		return syscall.EFBIG
	}
	return b.Local.Truncate(ino%fuzzObjects, size)
}

func (b boundedStore) CopyRange(src, dst uint64, srcOff, dstOff, n int64) error {
	if uint64(dstOff)+uint64(n) > fuzzSpan || uint64(srcOff)+uint64(n) > fuzzSpan {
		return syscall.EFBIG
	}
	return b.Local.CopyRange(src%fuzzObjects, dst%fuzzObjects, srcOff, dstOff, n)
}

type boundedFile struct{ store.File }

func (f boundedFile) WriteAt(p []byte, off int64) (int, error) {
	if uint64(off)+uint64(len(p)) > fuzzSpan {
		return 0, syscall.EFBIG
	}
	return f.File.WriteAt(p, off)
}

func (f boundedFile) Allocate(off, length int64) error {
	if uint64(off)+uint64(length) > fuzzSpan {
		return syscall.EFBIG
	}
	return f.File.Allocate(off, length)
}
