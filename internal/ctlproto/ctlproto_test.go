package ctlproto

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	"github.com/shoalfs/shoal/internal/xdr"
)

// TestGeneratedUpToDate fails when ctlproto_xdr.go no longer matches
// spec/control.x.
func TestGeneratedUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	out, err := exec.Command("go", "run", "../../tools/xdrgen", "-pkg", "ctlproto", "../../spec/control.x").Output()
	if err != nil {
		t.Fatalf("xdrgen: %v", err)
	}
	want, err := os.ReadFile("ctlproto_xdr.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, want) {
		t.Fatal("ctlproto_xdr.go is stale; run go generate ./internal/ctlproto")
	}
}

func TestRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   xdr.Marshaler
		out  interface {
			xdr.Unmarshaler
			xdr.Marshaler
		}
	}{
		{"register", &CtlRegisterArgs{Revision: CTL_VERSION, Token: []byte("t"), ClusterId: bytes.Repeat([]byte{7}, CTL_CLUSTER_ID_SIZE),
			DsId: "ds0", Addrs: []string{"a:1", "b:2"}, Capacity: 1 << 40, Free: 7, BootVerifier: CtlVerifier{1, 2, 3}}, &CtlRegisterArgs{}},
		{"register new directory", &CtlRegisterArgs{Revision: CTL_VERSION, Token: []byte("t"), DsId: "ds1"}, &CtlRegisterArgs{}},
		{"register ok", &CtlRegisterRes{Status: CTL_OK, Ok: &CtlRegisterOk{DataKey: []byte("k"), ClusterId: bytes.Repeat([]byte{7}, CTL_CLUSTER_ID_SIZE),
			HeartbeatMs: 1000, MissedBeats: 3, Registration: 9, Fenced: []uint64{1, 2}, Term: 1 << 40, LeaseMs: 90000}}, &CtlRegisterRes{}},
		{"register not leader", &CtlRegisterRes{Status: CTL_ERR_NOT_LEADER}, &CtlRegisterRes{}},
		{"heartbeat", &CtlHeartbeatArgs{Registration: 9, Capacity: 1 << 40, Free: 7, ReadBytes: 1 << 33, WrittenBytes: 5}, &CtlHeartbeatArgs{}},
		{"register wrong cluster", &CtlRegisterRes{Status: CTL_ERR_WRONG_CLUSTER}, &CtlRegisterRes{}},
		{"register removed", &CtlRegisterRes{Status: CTL_ERR_REMOVED}, &CtlRegisterRes{}},
		{"register version", &CtlRegisterRes{Status: CTL_ERR_VERSION, Versions: &CtlVersionRange{Low: CTL_VERSION, High: CTL_VERSION}}, &CtlRegisterRes{}},
		{"read ok", &CtlReadRes{Status: CTL_OK, Ok: &CtlReadOk{Eof: true, Size: 10, Data: []byte("0123456789")}}, &CtlReadRes{}},
		{"read err", &CtlReadRes{Status: CTL_ERR_IO}, &CtlReadRes{}},
		{"write", &CtlWriteArgs{Ino: 1, Offset: 2, Stable: true, Data: []byte("abc")}, &CtlWriteArgs{}},
		{"check", &CtlCheckStateidArgs{Ino: 5, Stateid: CtlStateid{15: 1}, Write: true}, &CtlCheckStateidArgs{}},
		{"file size args", &CtlInoArgs{Ino: 42}, &CtlInoArgs{}},
		{"file size ok", &CtlGetsizeRes{Status: CTL_OK, Size: ptr(uint64(1 << 33))}, &CtlGetsizeRes{}},
		{"file size err", &CtlGetsizeRes{Status: CTL_ERR_NOENT}, &CtlGetsizeRes{}},
		{"admin", &CtlAdminArgs{Token: []byte("t"), Command: "drain", Request: []byte(`{"id":"ds-1"}`)}, &CtlAdminArgs{}},
		{"admin ok", &CtlAdminRes{Status: CTL_OK, Body: []byte(`{}`)}, &CtlAdminRes{}},
		{"admin busy", &CtlAdminRes{Status: CTL_ERR_BUSY, Message: "a drain is running"}, &CtlAdminRes{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := xdr.Marshal(tt.in)
			if err := xdr.Unmarshal(b, tt.out); err != nil {
				t.Fatal(err)
			}
			if again := xdr.Marshal(tt.out); !bytes.Equal(again, b) {
				t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestBounds(t *testing.T) {
	addrs := make([]string, CTL_MAX_ADDRS+1)
	b := xdr.Marshal(&CtlRegisterArgs{DsId: "x", Addrs: addrs})
	if err := xdr.Unmarshal(b, &CtlRegisterArgs{}); err == nil {
		t.Error("REGISTER with too many addresses decoded")
	}
	b = xdr.Marshal(&CtlRegisterArgs{DsId: "x", ClusterId: make([]byte, CTL_CLUSTER_ID_SIZE+1)})
	if err := xdr.Unmarshal(b, &CtlRegisterArgs{}); err == nil {
		t.Error("REGISTER with an overlong cluster id decoded")
	}
	b = xdr.Marshal(&CtlAdminArgs{Command: string(make([]byte, CTL_MAX_COMMAND+1))})
	if err := xdr.Unmarshal(b, &CtlAdminArgs{}); err == nil {
		t.Error("ADMIN with an overlong command decoded")
	}
	// A huge data length in a short OBJ_WRITE is refused without allocating.
	b = xdr.Marshal(&CtlWriteArgs{Ino: 1})
	b[len(b)-4], b[len(b)-3] = 0xff, 0xff
	if err := xdr.Unmarshal(b, &CtlWriteArgs{}); err == nil {
		t.Error("OBJ_WRITE with a 4 GiB length decoded")
	}
	// OBJ_WRITE data aliases the record (zero copy).
	b = xdr.Marshal(&CtlWriteArgs{Ino: 1, Data: []byte("payload")})
	var w CtlWriteArgs
	if err := xdr.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	b[len(b)-8] = 'P'
	if string(w.Data) != "Payload" {
		t.Errorf("decoded data %q does not alias the input", w.Data)
	}
}
