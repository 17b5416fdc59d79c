package nfs3

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// DialFunc opens a TCP connection. Tests pass one that dials inside a
// network namespace; the default is a plain net.Dialer.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Options configures Dial and Mount. The zero value dials with net.Dialer
// and calls as uid 0, gid 0.
type Options struct {
	Dial DialFunc
	// UID and GID are the AUTH_SYS ids of calls made through the Client
	// (see Client.As for others).
	UID, GID uint32
	// Machine is the AUTH_SYS machine name; default "shoal".
	Machine string
}

func (o Options) dial(ctx context.Context, addr string) (net.Conn, error) {
	if o.Dial != nil {
		return o.Dial(ctx, "tcp", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (o Options) cred(uid, gid uint32) rpc.OpaqueAuth {
	m := o.Machine
	if m == "" {
		m = "shoal"
	}
	return rpc.AuthSysCred(rpc.AuthSysParams{Machine: m, UID: uid, GID: gid, GIDs: []uint32{gid}})
}

// StatusError is a procedure's result other than NFS3_OK (or MNT3_OK).
type StatusError struct {
	Proc   string
	Status Nfsstat3 // for MOUNT: the mountstat3 value, which shares the numbers
}

func (e *StatusError) Error() string {
	return "nfs3: " + e.Proc + ": " + e.Status.String()
}

// Status returns the nfsstat3 of err: NFS3_OK for nil, the server's status
// for a *StatusError anywhere in err's chain, and NFS3ERR_IO otherwise
// (transport and decoding failures).
func Status(err error) Nfsstat3 {
	if err == nil {
		return NFS3_OK
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status
	}
	return NFS3ERR_IO
}

// Mount calls MOUNT v3 MNT for path at addr (host:port of the MOUNT
// service) and returns the export's root filehandle. It checks that the
// server offers AUTH_SYS.
func Mount(ctx context.Context, addr, path string, opts Options) ([]byte, error) {
	nc, err := opts.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("nfs3: mount %s:%s: %w", addr, path, err)
	}
	conn := rpc.NewConn(nc, nil, rpc.ConnConfig{})
	defer conn.Close()
	var res Mountres3
	if err := call(ctx, conn, opts.cred(opts.UID, opts.GID), MOUNT_PROGRAM, MOUNT_V3, MOUNTPROC3_MNT, &Mntargs3{Dirpath: path}, &res); err != nil {
		return nil, fmt.Errorf("nfs3: mount %s:%s: %w", addr, path, err)
	}
	if res.FhsStatus != MNT3_OK {
		return nil, fmt.Errorf("nfs3: mount %s:%s: %w", addr, path, &StatusError{Proc: "MNT", Status: Nfsstat3(res.FhsStatus)})
	}
	ok := res.Mountinfo
	sys := len(ok.AuthFlavors) == 0 // RFC 1813: an empty list means AUTH_UNIX is fine
	for _, f := range ok.AuthFlavors {
		sys = sys || f == rpc.AuthSys
	}
	if !sys {
		return nil, fmt.Errorf("nfs3: mount %s:%s: AUTH_SYS not offered (flavors %v)", addr, path, ok.AuthFlavors)
	}
	return append([]byte(nil), ok.Fhandle...), nil
}

// Client calls one NFSv3 server over one TCP connection.
type Client struct {
	conn     *rpc.Conn
	opts     Options
	cred     rpc.OpaqueAuth
	uid, gid uint32
}

// Dial connects to the NFS service at addr (host:port).
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	nc, err := opts.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("nfs3: dial %s: %w", addr, err)
	}
	c := &Client{conn: rpc.NewConn(nc, nil, rpc.ConnConfig{}), opts: opts}
	return c.As(opts.UID, opts.GID), nil
}

// As returns a Client on the same connection that calls with AUTH_SYS
// uid and gid (and gid as its only supplementary group). Closing either
// closes the connection.
func (c *Client) As(uid, gid uint32) *Client {
	return &Client{conn: c.conn, opts: c.opts, cred: c.opts.cred(uid, gid), uid: uid, gid: gid}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Done is closed when the connection has failed or been closed.
func (c *Client) Done() <-chan struct{} { return c.conn.Done() }

func call(ctx context.Context, conn *rpc.Conn, cred rpc.OpaqueAuth, prog, vers, proc uint32, args xdr.Marshaler, res xdr.Unmarshaler) error {
	b, err := conn.Call(ctx, prog, vers, proc, cred, args)
	if err != nil {
		return err
	}
	if res == nil {
		return nil
	}
	if err := xdr.Unmarshal(b, res); err != nil {
		return fmt.Errorf("decode reply of procedure %d: %w", proc, err)
	}
	return nil
}

func (c *Client) call(ctx context.Context, name string, proc uint32, args xdr.Marshaler, res xdr.Unmarshaler) error {
	if err := call(ctx, c.conn, c.cred, NFS_PROGRAM, NFS_V3, proc, args, res); err != nil {
		return fmt.Errorf("nfs3: %s: %w", name, err)
	}
	return nil
}

func status(name string, s Nfsstat3) error {
	if s == NFS3_OK {
		return nil
	}
	return &StatusError{Proc: name, Status: s}
}

// Null calls the NULL procedure: a round trip that checks the server
// speaks NFSv3 on this connection.
func (c *Client) Null(ctx context.Context) error {
	return c.call(ctx, "NULL", NFSPROC3_NULL, nil, nil)
}

// Getattr returns fh's attributes.
func (c *Client) Getattr(ctx context.Context, fh []byte) (Fattr3, error) {
	var res GETATTR3res
	if err := c.call(ctx, "GETATTR", NFSPROC3_GETATTR, &GETATTR3args{Object: NfsFh3{Data: fh}}, &res); err != nil {
		return Fattr3{}, err
	}
	if err := status("GETATTR", res.Status); err != nil {
		return Fattr3{}, err
	}
	return *res.ObjAttributes, nil
}

// Attrs are the attributes SETATTR and CREATE set; nil fields are left
// alone.
type Attrs struct {
	Mode     *uint32
	UID, GID *uint32
	Size     *uint64
}

func (a Attrs) sattr3() Sattr3 {
	var s Sattr3
	if a.Mode != nil {
		s.Mode = SetMode3{SetIt: true, Mode: a.Mode}
	}
	if a.UID != nil {
		s.Uid = SetUid3{SetIt: true, Uid: a.UID}
	}
	if a.GID != nil {
		s.Gid = SetGid3{SetIt: true, Gid: a.GID}
	}
	if a.Size != nil {
		s.Size = SetSize3{SetIt: true, Size: a.Size}
	}
	return s
}

// Setattr sets the attributes a names on fh, unguarded.
func (c *Client) Setattr(ctx context.Context, fh []byte, a Attrs) error {
	var res SETATTR3res
	if err := c.call(ctx, "SETATTR", NFSPROC3_SETATTR, &SETATTR3args{Object: NfsFh3{Data: fh}, NewAttributes: a.sattr3()}, &res); err != nil {
		return err
	}
	return status("SETATTR", res.Status)
}

// Lookup returns the filehandle of name in directory dir.
func (c *Client) Lookup(ctx context.Context, dir []byte, name string) ([]byte, error) {
	var res LOOKUP3res
	if err := c.call(ctx, "LOOKUP", NFSPROC3_LOOKUP, &LOOKUP3args{What: Diropargs3{Dir: NfsFh3{Data: dir}, Name: name}}, &res); err != nil {
		return nil, err
	}
	if err := status("LOOKUP", res.Status); err != nil {
		return nil, err
	}
	return append([]byte(nil), res.Resok.Object.Data...), nil
}

// Create creates the regular file name in dir with attributes a, GUARDED
// (NFS3ERR_EXIST if it exists) or UNCHECKED (an existing file is kept, and
// a's size, if set, applied), and returns its filehandle.
func (c *Client) Create(ctx context.Context, dir []byte, name string, guarded bool, a Attrs) ([]byte, error) {
	how := Createhow3{Mode: UNCHECKED}
	if guarded {
		how.Mode = GUARDED
	}
	sa := a.sattr3()
	how.ObjAttributes = &sa
	var res CREATE3res
	if err := c.call(ctx, "CREATE", NFSPROC3_CREATE, &CREATE3args{Where: Diropargs3{Dir: NfsFh3{Data: dir}, Name: name}, How: how}, &res); err != nil {
		return nil, err
	}
	if err := status("CREATE", res.Status); err != nil {
		return nil, err
	}
	if res.Resok.Obj.HandleFollows && res.Resok.Obj.Handle != nil {
		return append([]byte(nil), res.Resok.Obj.Handle.Data...), nil
	}
	// RFC 1813 lets a server leave the handle out; LOOKUP finds it.
	return c.Lookup(ctx, dir, name)
}

// Remove removes name from dir.
func (c *Client) Remove(ctx context.Context, dir []byte, name string) error {
	var res REMOVE3res
	if err := c.call(ctx, "REMOVE", NFSPROC3_REMOVE, &REMOVE3args{Object: Diropargs3{Dir: NfsFh3{Data: dir}, Name: name}}, &res); err != nil {
		return err
	}
	return status("REMOVE", res.Status)
}

// Read reads up to count bytes of fh at off. The data aliases the reply
// and may be kept.
func (c *Client) Read(ctx context.Context, fh []byte, off uint64, count uint32) (data []byte, eof bool, err error) {
	var res READ3res
	if err := c.call(ctx, "READ", NFSPROC3_READ, &READ3args{File: NfsFh3{Data: fh}, Offset: off, Count: count}, &res); err != nil {
		return nil, false, err
	}
	if err := status("READ", res.Status); err != nil {
		return nil, false, err
	}
	if n := len(res.Resok.Data); uint32(n) > count || uint32(n) != res.Resok.Count {
		return nil, false, fmt.Errorf("nfs3: READ: %d bytes of data, count %d, asked %d", n, res.Resok.Count, count)
	}
	return res.Resok.Data, res.Resok.Eof, nil
}

// WriteResult is what a WRITE reports.
type WriteResult struct {
	Count     uint32
	Committed StableHow
	Verf      Writeverf3
}

// Write writes data to fh at off with the given stability. A short write
// is returned as it is (Count < len(data)), not as an error.
func (c *Client) Write(ctx context.Context, fh []byte, off uint64, data []byte, stable StableHow) (WriteResult, error) {
	var res WRITE3res
	args := &WRITE3args{File: NfsFh3{Data: fh}, Offset: off, Count: uint32(len(data)), Stable: stable, Data: data}
	if err := c.call(ctx, "WRITE", NFSPROC3_WRITE, args, &res); err != nil {
		return WriteResult{}, err
	}
	if err := status("WRITE", res.Status); err != nil {
		return WriteResult{}, err
	}
	ok := res.Resok
	if ok.Count > uint32(len(data)) {
		return WriteResult{}, fmt.Errorf("nfs3: WRITE: server wrote %d of %d bytes", ok.Count, len(data))
	}
	return WriteResult{Count: ok.Count, Committed: ok.Committed, Verf: ok.Verf}, nil
}

// Commit commits count bytes of fh from off (0, 0: the whole file) and
// returns the server's write verifier.
func (c *Client) Commit(ctx context.Context, fh []byte, off uint64, count uint32) (Writeverf3, error) {
	var res COMMIT3res
	if err := c.call(ctx, "COMMIT", NFSPROC3_COMMIT, &COMMIT3args{File: NfsFh3{Data: fh}, Offset: off, Count: count}, &res); err != nil {
		return Writeverf3{}, err
	}
	if err := status("COMMIT", res.Status); err != nil {
		return Writeverf3{}, err
	}
	return res.Resok.Verf, nil
}
