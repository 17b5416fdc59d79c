package server

import (
	"errors"
	"io"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/store"
)

// NFSv4.2 operations for sparse files (RFC 7862 §15).

func (c *compound) seek(a *nfs4.SEEK4args) opReply {
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.checkIO(&a.SaStateid, o, false); st != nfs4.NFS4_OK {
		return fail(st)
	}
	size := o.attr.Size
	if a.SaOffset >= size {
		return fail(nfs4.NFS4ERR_NXIO)
	}
	whence := store.SeekData
	if a.SaWhat == nfs4.NFS4_CONTENT_HOLE {
		whence = store.SeekHole
	} else if a.SaWhat != nfs4.NFS4_CONTENT_DATA {
		return fail(nfs4.NFS4ERR_UNION_NOTSUPP)
	}
	f, err := c.s.openData(o.fh.ino, false)
	if err != nil {
		return failErr(err)
	}
	var pos uint64
	switch {
	case f == nil:
		// No data file: all hole.
		if whence == store.SeekData {
			return ok(&nfs4.SeekRes4{SrEof: true, SrOffset: size})
		}
		pos = a.SaOffset
	default:
		p, err := f.Seek(int64(a.SaOffset), whence)
		f.Close()
		switch {
		case errors.Is(err, io.EOF):
			// No data after the offset in the data file; the rest up to
			// the file size is a hole.
			if whence == store.SeekData {
				return ok(&nfs4.SeekRes4{SrEof: true, SrOffset: size})
			}
			pos = a.SaOffset
		case err != nil:
			return failErr(err)
		default:
			pos = uint64(p)
		}
	}
	if pos > size {
		pos = size
	}
	return ok(&nfs4.SeekRes4{SrEof: pos >= size, SrOffset: pos})
}

func (c *compound) allocate(a *nfs4.ALLOCATE4args) opReply {
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.writable(o); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.checkIO(&a.AaStateid, o, true); st != nfs4.NFS4_OK {
		return fail(st)
	}
	end := a.AaOffset + a.AaLength
	if end < a.AaOffset || a.AaLength == 0 {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	f, err := c.s.data.Open(uint64(o.fh.ino), true)
	if err != nil {
		return failErr(err)
	}
	defer f.Close()
	if err := f.Allocate(int64(a.AaOffset), int64(a.AaLength)); err != nil {
		if errors.Is(err, store.ErrNotSupported) {
			return fail(nfs4.NFS4ERR_NOTSUPP)
		}
		return failErr(err)
	}
	if end > o.attr.Size {
		c.s.cache.wrote(o.fh.ino, o.attr, end, time.Now())
	}
	return ok(nil)
}

func (c *compound) deallocate(a *nfs4.DEALLOCATE4args) opReply {
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.writable(o); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.checkIO(&a.DaStateid, o, true); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if a.DaOffset+a.DaLength < a.DaOffset {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	f, err := c.s.openData(o.fh.ino, false)
	if err != nil || f == nil {
		return failErr(err)
	}
	defer f.Close()
	if err := f.PunchHole(int64(a.DaOffset), int64(a.DaLength)); err != nil {
		if errors.Is(err, store.ErrNotSupported) {
			return fail(nfs4.NFS4ERR_NOTSUPP)
		}
		return failErr(err)
	}
	// Deallocation changes contents (zeros) but not the size.
	c.s.cache.wrote(o.fh.ino, o.attr, 0, time.Now())
	return ok(nil)
}
