package server

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/meta"
)

// forgeFH builds a filehandle MAC'd with key the way an attacker holding
// key would, independently of fhCodec.
func forgeFH(key []byte, kind byte, export uint16, ino meta.Ino) []byte {
	b := make([]byte, fhLen)
	b[0] = fhVersion
	b[1] = kind
	binary.BigEndian.PutUint16(b[2:4], export)
	binary.BigEndian.PutUint64(b[4:12], uint64(ino))
	m := hmac.New(sha256.New, key)
	m.Write(b[:12])
	copy(b[12:], m.Sum(nil)[:fhMACLen])
	return b
}

var testMaster = bytes.Repeat([]byte{0x5a}, 32)

func TestDataFHKeyDerivation(t *testing.T) {
	m := hmac.New(sha256.New, testMaster)
	m.Write([]byte("shoal data filehandle key v1"))
	want := m.Sum(nil)
	mds := newFHCodec(testMaster)
	if !bytes.Equal(mds.dataKey, want) || len(mds.dataKey) != 32 {
		t.Fatalf("data key = %x, want %x", mds.dataKey, want)
	}
	if bytes.Equal(mds.dataKey, testMaster) {
		t.Fatal("data key equals the master secret")
	}
	s := &Server{fh: mds}
	k := s.DataFHKey()
	k[0] ^= 0xff // callers cannot change the codec's key
	if !bytes.Equal(s.DataFHKey(), want) {
		t.Fatal("DataFHKey returned the codec's own slice")
	}
	if (&Server{}).DataFHKey() != nil {
		t.Fatal("DataFHKey of a server without a master secret is not nil")
	}
}

func TestFHKeySeparation(t *testing.T) {
	mds := newFHCodec(testMaster)
	dataKey := dataFHKey(testMaster)
	ds := newDataFHCodec(dataKey)
	const ino = meta.Ino(4242)

	tests := []struct {
		name    string
		codec   fhCodec
		fh      []byte
		wantErr bool
	}{
		// (a) the data key cannot mint MDS handles.
		{"mds rejects object forged with data key", mds, forgeFH(dataKey, fhObject, 1, ino), true},
		{"mds rejects pseudo forged with data key", mds, forgeFH(dataKey, fhPseudo, 0, 0), true},
		// (b) a data server's codec refuses MDS handles, genuine or not.
		{"ds refuses mds object", ds, mds.encode(fhandle{kind: fhObject, export: 1, ino: ino}), true},
		{"ds refuses mds pseudo", ds, mds.encode(fhandle{kind: fhPseudo}), true},
		{"ds refuses object forged with data key", ds, forgeFH(dataKey, fhObject, 1, ino), true},
		// The master secret does not make data handles any more (a data
		// server still given ClusterSecret rejects every layout handle).
		{"ds rejects data handle made with master", ds, forgeFH(testMaster, fhData, 0, ino), true},
		{"mds rejects data handle made with master", mds, forgeFH(testMaster, fhData, 0, ino), true},
		// Control: the forger is right when it has the right key.
		{"mds accepts object made with master", mds, forgeFH(testMaster, fhObject, 1, ino), false},
		{"ds accepts data made with data key", ds, forgeFH(dataKey, fhData, 0, ino), false},
		{"mds accepts data made with data key", mds, forgeFH(dataKey, fhData, 0, ino), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.codec.decode(tc.fh)
			if tc.wantErr && !errors.Is(err, errBadHandle) {
				t.Fatalf("decode: err = %v, want errBadHandle", err)
			}
			if !tc.wantErr && err != nil {
				t.Fatalf("decode: %v", err)
			}
		})
	}
}

// (c) every kind round-trips through the codec that has its key, MDS and
// data server agree on data handles, and a data server cannot encode
// other kinds.
func TestFHRoundTrip(t *testing.T) {
	mds := newFHCodec(testMaster)
	ds := newDataFHCodec(dataFHKey(testMaster))
	tests := []struct {
		name string
		h    fhandle
		dsOK bool
	}{
		{"object", fhandle{kind: fhObject, export: 7, ino: 12345}, false},
		{"object max", fhandle{kind: fhObject, export: 0xffff, ino: ^meta.Ino(0)}, false},
		{"pseudo root", fhandle{kind: fhPseudo}, false},
		{"pseudo node", fhandle{kind: fhPseudo, export: 3}, false},
		{"data", fhandle{kind: fhData, ino: 99}, true},
		{"data max", fhandle{kind: fhData, ino: ^meta.Ino(0)}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := mds.encode(tc.h)
			if len(b) != fhLen {
				t.Fatalf("mds encode: %d bytes", len(b))
			}
			got, err := mds.decode(b)
			if err != nil || got != tc.h {
				t.Fatalf("mds decode = %+v, %v; want %+v", got, err, tc.h)
			}
			db := ds.encode(tc.h)
			if !tc.dsOK {
				if db != nil {
					t.Fatalf("ds encoded a kind-%d handle", tc.h.kind)
				}
				if _, err := ds.decode(b); !errors.Is(err, errBadHandle) {
					t.Fatalf("ds decode of mds handle: err = %v", err)
				}
				return
			}
			if !bytes.Equal(db, b) {
				t.Fatalf("ds encode = %x, mds encode = %x", db, b)
			}
			got, err = ds.decode(b)
			if err != nil || got != tc.h {
				t.Fatalf("ds decode = %+v, %v; want %+v", got, err, tc.h)
			}
		})
	}
}

// (d) the kind byte is under the MAC: relabelling a valid data handle is
// a forgery for both codecs.
func TestFHKindRelabel(t *testing.T) {
	mds := newFHCodec(testMaster)
	ds := newDataFHCodec(dataFHKey(testMaster))
	valid := mds.encode(fhandle{kind: fhData, ino: 77})
	for _, kind := range []byte{fhObject, fhPseudo, 0, fhData + 1, 0xff} {
		for _, c := range []struct {
			name  string
			codec fhCodec
		}{{"mds", mds}, {"ds", ds}} {
			b := bytesClone(valid)
			b[1] = kind
			if _, err := c.codec.decode(b); !errors.Is(err, errBadHandle) {
				t.Errorf("%s: data handle relabelled kind %d: err = %v, want errBadHandle", c.name, kind, err)
			}
		}
	}
	// And the other way: an MDS object handle relabelled as data.
	obj := mds.encode(fhandle{kind: fhObject, export: 1, ino: 77})
	obj[1] = fhData
	if _, err := ds.decode(obj); !errors.Is(err, errBadHandle) {
		t.Errorf("ds: object handle relabelled as data: err = %v", err)
	}
}

// Over the wire: the MDS answers NFS4ERR_BADHANDLE to PUTFH of a handle
// for its root forged with the data key, and accepts the same handle MAC'd
// with the master secret.
func TestPutFHForgedWithDataKey(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	root := fhOf(t, must(t)(c.Compound(opPutRoot(), opGetFH())))
	h, err := ts.srv.fh.decode(root)
	if err != nil {
		t.Fatal(err)
	}
	dataKey := ts.srv.DataFHKey()
	master := ts.srv.ClusterSecret()

	tests := []struct {
		name string
		fh   []byte
		want nfs4.Nfsstat4
	}{
		{"genuine", root, nfs4.NFS4_OK},
		{"forged with master (control)", forgeFH(master, h.kind, h.export, h.ino), nfs4.NFS4_OK},
		{"root forged with data key", forgeFH(dataKey, h.kind, h.export, h.ino), nfs4.NFS4ERR_BADHANDLE},
		{"pseudo root forged with data key", forgeFH(dataKey, fhPseudo, 0, 0), nfs4.NFS4ERR_BADHANDLE},
		{"data handle on the MDS", forgeFH(dataKey, fhData, 0, h.ino), nfs4.NFS4ERR_BADHANDLE},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want(t, tc.want)(c.Compound(opPutFH(tc.fh), opGetattr(nfs4.FATTR4_TYPE)))
		})
	}
}

// Over the wire, on a data server given the data key: data handles work
// (a READ of one is answered); MDS handles and data handles MAC'd with the
// master secret are bad.
func TestDataServerPutFHKey(t *testing.T) {
	mds := startServer(t, Config{})
	root := fhOf(t, must(t)(mds.client().Compound(opPutRoot(), opGetFH())))
	dataKey := mds.srv.DataFHKey()
	master := mds.srv.ClusterSecret()
	c := startDataServer(t, mds, "fhkey-ds")

	mdsCodec := mds.srv.fh
	layoutFH := mdsCodec.encode(fhandle{kind: fhData, ino: 1234}) // what LAYOUTGET hands out
	res := must(t)(c.Compound(opPutFH(layoutFH), opRead(nfs4.Stateid4{}, 0, 10)))
	if r := find(t, res, nfs4.OP_READ).Opread.Resok4; !r.Eof || len(r.Data) != 0 {
		t.Errorf("READ of an empty data file: eof %v, %d bytes", r.Eof, len(r.Data))
	}

	tests := []struct {
		name string
		fh   []byte
	}{
		{"mds root handle", root},
		{"object forged with data key", forgeFH(dataKey, fhObject, 1, 1234)},
		{"data handle made with master", forgeFH(master, fhData, 0, 1234)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want(t, nfs4.NFS4ERR_BADHANDLE)(c.Compound(opPutFH(tc.fh), opRead(nfs4.Stateid4{}, 0, 10)))
		})
	}
}

// startDataServer starts a data server beside the test MDS mds, holding
// mds's data-filehandle key and accepting every stateid, and returns a
// client set up on it (owner names the client).
func startDataServer(t *testing.T, mds *testServer, owner string) *wiretest.Client {
	t.Helper()
	dataKey := mds.srv.DataFHKey()
	dsrv, err := NewDataServer(DataServerConfig{
		Dir: t.TempDir(), Logger: mds.cfg.Logger,
		Secret:       func() []byte { return dataKey },
		CheckStateid: func(context.Context, uint64, [16]byte, bool) error { return nil },
		FileSize:     func(context.Context, uint64) (uint64, error) { return 0, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- dsrv.Serve(ln) }()
	t.Cleanup(func() {
		if err := dsrv.Close(); err != nil {
			t.Errorf("data server Close: %v", err)
		}
		<-done
	})
	c, err := wiretest.Setup(testCtx(t), ln.Addr().String(), []byte(owner))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
