package wiretest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// RawConn is a plain TCP connection for sending arbitrary bytes. Reads are
// bounded by a deadline so a test can never hang on a silent server; the
// deadline only guards against hangs, it is not an assertion about speed.
type RawConn struct {
	nc net.Conn
	// Timeout bounds each read (default 10 s).
	Timeout time.Duration
}

// DialRaw opens a raw connection to addr.
func DialRaw(addr string) (*RawConn, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("wiretest: dial %s: %w", addr, err)
	}
	return &RawConn{nc: nc, Timeout: 10 * time.Second}, nil
}

// Close closes the connection.
func (r *RawConn) Close() error { return r.nc.Close() }

// CloseWrite half-closes the connection: the server sees end of stream.
func (r *RawConn) CloseWrite() error {
	if tc, ok := r.nc.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return errors.New("wiretest: not a TCP connection")
}

// Raw writes b as is: it must include record marks if it is to be parsed.
func (r *RawConn) Raw(b []byte) error {
	_, err := r.nc.Write(b)
	return err
}

// Record frames body as one last-fragment record.
func Record(body []byte) []byte {
	out := binary.BigEndian.AppendUint32(nil, 1<<31|uint32(len(body)))
	return append(out, body...)
}

// CallBody encodes an RPC CALL message (without record mark) for program
// NFS4, version 4, with args appended as is.
func CallBody(xid, proc uint32, cred rpc.OpaqueAuth, args []byte) []byte {
	e := xdr.NewEncoder(64 + len(args))
	e.Uint32(xid)
	e.Uint32(0) // CALL
	e.Uint32(2) // RPC version
	e.Uint32(nfs4.NFS4_PROGRAM)
	e.Uint32(nfs4.NFS_V4)
	e.Uint32(proc)
	e.Uint32(cred.Flavor)
	e.Opaque(cred.Body)
	e.Uint32(0) // verifier AUTH_NONE
	e.Uint32(0)
	e.Append(args)
	return e.Bytes()
}

// ReadRecord reads one whole record (all fragments).
func (r *RawConn) ReadRecord() ([]byte, error) {
	if err := r.nc.SetReadDeadline(time.Now().Add(r.Timeout)); err != nil {
		return nil, err
	}
	var rec []byte
	for range 1 << 10 {
		var hdr [4]byte
		if _, err := io.ReadFull(r.nc, hdr[:]); err != nil {
			return nil, err
		}
		h := binary.BigEndian.Uint32(hdr[:])
		n := h &^ (1 << 31)
		if n > 64<<20 {
			return nil, fmt.Errorf("wiretest: fragment of %d bytes", n)
		}
		frag := make([]byte, n)
		if _, err := io.ReadFull(r.nc, frag); err != nil {
			return nil, err
		}
		rec = append(rec, frag...)
		if h&(1<<31) != 0 {
			return rec, nil
		}
	}
	return nil, errors.New("wiretest: too many fragments")
}

// Reply is a parsed RPC reply.
type Reply struct {
	XID        uint32
	Accepted   bool
	AcceptStat rpc.AcceptStat
	Body       []byte // after accept_stat, for accepted replies
}

// ReadReply reads one record and parses it as a reply.
func (r *RawConn) ReadReply() (*Reply, error) {
	rec, err := r.ReadRecord()
	if err != nil {
		return nil, err
	}
	d := xdr.NewDecoder(rec)
	rp := &Reply{XID: d.Uint32()}
	if mt := d.Uint32(); mt != 1 {
		return nil, fmt.Errorf("wiretest: message type %d, want REPLY", mt)
	}
	rp.Accepted = d.Uint32() == 0
	if rp.Accepted {
		d.Uint32()    // verifier flavor
		d.Opaque(400) // verifier body
		rp.AcceptStat = rpc.AcceptStat(d.Uint32())
		rp.Body = d.Rest()
	}
	return rp, d.Err()
}

// WaitClosed reads until the server closes the connection, discarding any
// data. It returns nil on EOF or reset, and an error if the connection is
// still open when the read deadline passes.
func (r *RawConn) WaitClosed() error {
	if err := r.nc.SetReadDeadline(time.Now().Add(r.Timeout)); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for range 1 << 16 {
		_, err := r.nc.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return errors.New("wiretest: connection still open")
		}
		return nil // EOF, reset: closed
	}
	return errors.New("wiretest: connection keeps sending")
}
