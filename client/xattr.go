package client

import (
	"context"
	"strings"
	"syscall"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// Extended attributes (RFC 8276, NFSv4.2). The protocol carries only
// Linux's user namespace, without its "user." prefix; these methods take
// and return full names, as the system calls do, and refuse names of
// other namespaces with ENOTSUP. A missing attribute is ENODATA, a name or
// value over the server's limits E2BIG; on an NFSv4.1 session every call
// fails with ENOTSUP.

// XattrUserPrefix is the namespace prefix of the attributes NFS carries.
const XattrUserPrefix = "user."

// Setxattr flags, with Linux's values (XATTR_CREATE, XATTR_REPLACE).
const (
	XattrCreate  = 1 // fail with EEXIST if the attribute exists
	XattrReplace = 2 // fail with ENODATA if it does not
)

// xattrKey strips the user namespace prefix from name.
func (c *Client) xattrKey(name string) ([]byte, error) {
	if c.minor.Load() < 2 {
		return nil, syscall.ENOTSUP
	}
	key, ok := strings.CutPrefix(name, XattrUserPrefix)
	if !ok {
		return nil, syscall.ENOTSUP
	}
	return []byte(key), nil
}

// Getxattr returns the value of the extended attribute name of path.
func (c *Client) Getxattr(ctx context.Context, path, name string) ([]byte, error) {
	key, err := c.xattrKey(name)
	if err != nil {
		return nil, pathErr("getxattr", path, err)
	}
	ops := append(c.walk(splitPath(path)), nfs4.NfsArgop4{Argop: nfs4.OP_GETXATTR, Opgetxattr: &nfs4.GETXATTR4args{GxaName: key}})
	res, err := c.call(ctx, fixed(ops))
	if err != nil {
		return nil, pathErr("getxattr", path, err)
	}
	return append([]byte{}, *res[len(res)-1].Opgetxattr.GxrValue...), nil
}

// Setxattr sets the extended attribute name of path to value. flags is 0
// (create or replace), XattrCreate or XattrReplace.
func (c *Client) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	key, err := c.xattrKey(name)
	if err != nil {
		return pathErr("setxattr", path, err)
	}
	how := nfs4.SETXATTR4_EITHER
	switch flags {
	case 0:
	case XattrCreate:
		how = nfs4.SETXATTR4_CREATE
	case XattrReplace:
		how = nfs4.SETXATTR4_REPLACE
	default:
		return pathErr("setxattr", path, syscall.EINVAL)
	}
	ops := append(c.walk(splitPath(path)), nfs4.NfsArgop4{Argop: nfs4.OP_SETXATTR,
		Opsetxattr: &nfs4.SETXATTR4args{SxaOption: how, SxaKey: key, SxaValue: value}})
	_, err = c.call(ctx, fixed(ops))
	return pathErr("setxattr", path, err)
}

// Removexattr removes the extended attribute name of path.
func (c *Client) Removexattr(ctx context.Context, path, name string) error {
	key, err := c.xattrKey(name)
	if err != nil {
		return pathErr("removexattr", path, err)
	}
	ops := append(c.walk(splitPath(path)), nfs4.NfsArgop4{Argop: nfs4.OP_REMOVEXATTR, Opremovexattr: &nfs4.REMOVEXATTR4args{RxaName: key}})
	_, err = c.call(ctx, fixed(ops))
	return pathErr("removexattr", path, err)
}

// listxattrsMax is the maxcount of one LISTXATTRS: Linux's limit on a
// whole list of names (XATTR_LIST_MAX).
const listxattrsMax = 64 << 10

// Listxattr returns the names of path's extended attributes, with their
// "user." prefix, in the server's order.
func (c *Client) Listxattr(ctx context.Context, path string) ([]string, error) {
	if c.minor.Load() < 2 {
		return nil, pathErr("listxattr", path, syscall.ENOTSUP)
	}
	var names []string
	cookie := uint64(0)
	for {
		ops := append(c.walk(splitPath(path)), nfs4.NfsArgop4{Argop: nfs4.OP_LISTXATTRS,
			Oplistxattrs: &nfs4.LISTXATTRS4args{LxaCookie: cookie, LxaMaxcount: listxattrsMax}})
		res, err := c.call(ctx, fixed(ops))
		if err != nil {
			return nil, pathErr("listxattr", path, err)
		}
		ok := res[len(res)-1].Oplistxattrs.LxrValue
		for _, n := range ok.LxrNames {
			names = append(names, XattrUserPrefix+string(n))
		}
		if ok.LxrEof || len(ok.LxrNames) == 0 {
			return names, nil
		}
		cookie = ok.LxrCookie
	}
}
