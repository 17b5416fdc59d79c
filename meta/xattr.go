package meta

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Extended attribute limits. The name and value limits are Linux's
// (XATTR_NAME_MAX, XATTR_SIZE_MAX), so whatever a Linux application can
// set on a local file system it can set here. MaxXattrBytes bounds all of
// one inode's attributes together, which keeps every transaction that
// reads or writes them small (see the package documentation).
const (
	MaxXattrNameLen  = 255
	MaxXattrValueLen = 64 << 10
	MaxXattrBytes    = 256 << 10
)

// XattrMode says what SetXattr does about an attribute that exists, or
// not (RFC 8276 setxattr_option4, Linux's XATTR_CREATE/XATTR_REPLACE).
type XattrMode uint8

const (
	XattrEither  XattrMode = iota // create or replace
	XattrCreate                   // only create: ErrExist if it exists
	XattrReplace                  // only replace: ErrNoXattr if it does not
)

// XattrName is one name returned by ListXattrs.
type XattrName struct {
	Name string
	// Cookie is passed back to ListXattrs to continue after this name.
	Cookie uint64
}

// xattr records:
//
//	'X' ino(8) -> version(1)=1 { nameLen(1) name valueLen(4) value }...
//
// All attributes of an inode live in one record, sorted by name, so that
// deleting the inode deletes one key whatever the number of attributes,
// and a listing reads one key. The record is at most MaxXattrBytes, and
// an inode without attributes has none.
const pXattr = 'X'

const xattrV1 = 1

func xattrKey(ino Ino) []byte { return be.AppendUint64([]byte{pXattr}, uint64(ino)) }

// xattr is one decoded attribute. Values decoded from a record alias it.
type xattr struct {
	name  string
	value []byte
}

func encodeXattrs(xs []xattr) []byte {
	n := 1
	for _, x := range xs {
		n += xattrEntryLen(x.name, x.value)
	}
	b := make([]byte, 0, n)
	b = append(b, xattrV1)
	for _, x := range xs {
		b = append(b, byte(len(x.name)))
		b = append(b, x.name...)
		b = be.AppendUint32(b, uint32(len(x.value)))
		b = append(b, x.value...)
	}
	return b
}

func xattrEntryLen(name string, value []byte) int { return 1 + len(name) + 4 + len(value) }

// decodeXattrs decodes a record (nil: no attributes). It accepts only what
// encodeXattrs writes from valid attributes: names valid and strictly
// increasing, values within the limits, nothing left over.
func decodeXattrs(b []byte) ([]xattr, error) {
	if b == nil {
		return nil, nil
	}
	bad := func(why string) ([]xattr, error) {
		return nil, fmt.Errorf("meta: corrupt xattr record (%d bytes): %s", len(b), why)
	}
	if len(b) < 1 || b[0] != xattrV1 {
		return bad("version")
	}
	if len(b) > MaxXattrBytes {
		return bad("too long")
	}
	var xs []xattr
	for p := b[1:]; len(p) > 0; {
		nl := int(p[0])
		if len(p) < 1+nl+4 {
			return bad("truncated name")
		}
		name := string(p[1 : 1+nl])
		vl := int(be.Uint32(p[1+nl:]))
		p = p[1+nl+4:]
		if vl > len(p) {
			return bad("truncated value")
		}
		if validXattrName(name) != nil || vl > MaxXattrValueLen {
			return bad("invalid attribute")
		}
		if len(xs) > 0 && name <= xs[len(xs)-1].name {
			return bad("names out of order")
		}
		xs = append(xs, xattr{name: name, value: p[:vl:vl]})
		p = p[vl:]
	}
	if len(xs) == 0 {
		return bad("empty")
	}
	return xs, nil
}

func validXattrName(name string) error {
	switch {
	case name == "" || strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("xattr name %q: %w", name, ErrInval)
	case len(name) > MaxXattrNameLen:
		return fmt.Errorf("xattr name of %d bytes (at most %d): %w", len(name), MaxXattrNameLen, ErrXattrTooBig)
	}
	return nil
}

// xattrs reads the attributes of ino, which must exist.
func (x *tx) xattrs(ino Ino) (*inode, []xattr, error) {
	n, err := x.inode(ino)
	if err != nil {
		return nil, nil, err
	}
	v, err := x.t.Get(xattrKey(ino))
	if err != nil {
		return nil, nil, err
	}
	xs, err := decodeXattrs(v)
	if err != nil {
		return nil, nil, fmt.Errorf("xattrs of inode %d: %w", ino, err)
	}
	return n, xs, nil
}

// putXattrs stores xs as the attributes of ino, deleting the record when
// xs is empty.
func (x *tx) putXattrs(ino Ino, xs []xattr) error {
	if len(xs) == 0 {
		return x.t.Delete(xattrKey(ino))
	}
	return x.t.Put(xattrKey(ino), encodeXattrs(xs))
}

func findXattr(xs []xattr, name string) (int, bool) {
	return slices.BinarySearchFunc(xs, name, func(x xattr, name string) int { return strings.Compare(x.name, name) })
}

func (e *kvEngine) GetXattr(ctx context.Context, ino Ino, name string) ([]byte, error) {
	if err := validXattrName(name); err != nil {
		return nil, err
	}
	var val []byte
	err := e.view(ctx, func(x *tx) error {
		_, xs, err := x.xattrs(ino)
		if err != nil {
			return err
		}
		i, ok := findXattr(xs, name)
		if !ok {
			return fmt.Errorf("xattr %q of inode %d: %w", name, ino, ErrNoXattr)
		}
		val = bytes.Clone(xs[i].value)
		if val == nil {
			val = []byte{}
		}
		return nil
	})
	return val, err
}

func (e *kvEngine) SetXattr(ctx context.Context, ino Ino, name string, value []byte, mode XattrMode, now time.Time) (ChangeInfo, error) {
	if err := validXattrName(name); err != nil {
		return ChangeInfo{}, err
	}
	if len(value) > MaxXattrValueLen {
		return ChangeInfo{}, fmt.Errorf("xattr value of %d bytes (at most %d): %w", len(value), MaxXattrValueLen, ErrXattrTooBig)
	}
	if mode > XattrReplace {
		return ChangeInfo{}, fmt.Errorf("xattr mode %d: %w", mode, ErrInval)
	}
	now = nowOr(now)
	var ci ChangeInfo
	err := e.update(ctx, func(x *tx) error {
		n, xs, err := x.xattrs(ino)
		if err != nil {
			return err
		}
		i, found := findXattr(xs, name)
		switch {
		case found && mode == XattrCreate:
			return fmt.Errorf("xattr %q of inode %d: %w", name, ino, ErrExist)
		case !found && mode == XattrReplace:
			return fmt.Errorf("xattr %q of inode %d: %w", name, ino, ErrNoXattr)
		}
		size := 1
		for _, a := range xs {
			size += xattrEntryLen(a.name, a.value)
		}
		if found {
			size -= len(xs[i].value)
			size += len(value)
			xs[i].value = value
		} else {
			size += xattrEntryLen(name, value)
			xs = slices.Insert(xs, i, xattr{name: name, value: value})
		}
		if size > MaxXattrBytes {
			return fmt.Errorf("xattrs of inode %d would take %d bytes (at most %d): %w", ino, size, MaxXattrBytes, ErrNoSpace)
		}
		if err := x.putXattrs(ino, xs); err != nil {
			return err
		}
		ci.Before = n.Change
		x.touch(ino, n, now, false)
		ci.After = n.Change
		return nil
	})
	return ci, err
}

func (e *kvEngine) RemoveXattr(ctx context.Context, ino Ino, name string, now time.Time) (ChangeInfo, error) {
	if err := validXattrName(name); err != nil {
		return ChangeInfo{}, err
	}
	now = nowOr(now)
	var ci ChangeInfo
	err := e.update(ctx, func(x *tx) error {
		n, xs, err := x.xattrs(ino)
		if err != nil {
			return err
		}
		i, found := findXattr(xs, name)
		if !found {
			return fmt.Errorf("xattr %q of inode %d: %w", name, ino, ErrNoXattr)
		}
		if err := x.putXattrs(ino, slices.Delete(xs, i, i+1)); err != nil {
			return err
		}
		ci.Before = n.Change
		x.touch(ino, n, now, false)
		ci.After = n.Change
		return nil
	})
	return ci, err
}

func (e *kvEngine) ListXattrs(ctx context.Context, ino Ino, cookie uint64, max int) ([]XattrName, bool, error) {
	if max <= 0 {
		return nil, false, fmt.Errorf("list xattrs max %d: %w", max, ErrInval)
	}
	var out []XattrName
	eof := true
	err := e.view(ctx, func(x *tx) error {
		out, eof = out[:0], true
		_, xs, err := x.xattrs(ino)
		if err != nil {
			return err
		}
		if cookie >= uint64(len(xs)) {
			return nil
		}
		for i := int(cookie); i < len(xs); i++ {
			if len(out) == max {
				eof = false
				break
			}
			out = append(out, XattrName{Name: xs[i].name, Cookie: uint64(i) + 1})
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, eof, nil
}
