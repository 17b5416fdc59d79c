package server

import (
	"errors"
	"io"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
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
		// The new size is recorded at once: data servers ask for it
		// (FILE_SIZE) to tell the allocated zeros from the file's end.
		if err := c.s.cache.flush(c.ctx, o.fh.ino); err != nil {
			return failErr(err)
		}
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

// maxReadPlusSegments bounds the segments of one READ_PLUS reply; a range
// broken into more ends early (a short read, which the client continues).
const maxReadPlusSegments = 64

// readPlus is READ_PLUS (RFC 7862 §15.10): the range as data and hole
// segments. Holes are found through the store's Seek, so on a metadata
// server they are the holes of the data servers' objects, and on a data
// server those of its own; bytes past the data's end but inside the file
// are a hole. Only the data segments are read. The reply is bounded like
// READ's (Config.MaxRead, and the session's ca_maxresponsesize).
func (c *compound) readPlus(a *nfs4.READPLUS4args) opReply {
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.checkIO(&a.RpaStateid, o, false); st != nfs4.NFS4_OK {
		return fail(st)
	}
	return c.readPlusData(o.fh.ino, a, o.attr.Size)
}

// readPlusData answers a READ_PLUS of file ino, whose end is at size as
// far as the server's role knows (readData), in both roles.
func (c *compound) readPlusData(ino meta.Ino, a *nfs4.READPLUS4args, size uint64) opReply {
	if a.RpaOffset >= size || a.RpaCount == 0 {
		return ok(&nfs4.ReadPlusRes4{RprEof: a.RpaOffset >= size})
	}
	n := min(uint64(min(a.RpaCount, c.s.cfg.MaxRead)), size-a.RpaOffset)
	end := a.RpaOffset + n
	f, err := c.s.openData(ino, false)
	if err != nil {
		return failErr(err)
	}
	if f != nil {
		defer f.Close()
	}
	// next returns where the run of data or hole that starts at pos ends.
	next := func(pos uint64, whence int) (uint64, error) {
		if f == nil {
			return end, nil // no data file: all hole
		}
		p, err := f.Seek(int64(pos), whence)
		switch {
		case errors.Is(err, io.EOF):
			// No data from pos on: the rest is a hole.
			if whence == store.SeekData {
				return end, nil
			}
			return pos, nil
		case errors.Is(err, store.ErrNotSupported):
			// No hole detection: everything is data.
			if whence == store.SeekData {
				return pos, nil
			}
			return end, nil
		case err != nil:
			return 0, err
		}
		return min(max(uint64(p), pos), end), nil
	}
	var buf []byte
	res := &nfs4.ReadPlusRes4{}
	pos := a.RpaOffset
	for pos < end && len(res.RprContents) < maxReadPlusSegments {
		d, err := next(pos, store.SeekData)
		if err != nil {
			return failErr(err)
		}
		if d > pos {
			res.RprContents = append(res.RprContents, nfs4.ReadPlusContent{RpcContent: nfs4.NFS4_CONTENT_HOLE,
				RpcHole: &nfs4.DataInfo4{DiOffset: pos, DiLength: d - pos}})
			pos = d
			continue
		}
		h, err := next(pos, store.SeekHole)
		if err != nil {
			return failErr(err)
		}
		if h <= pos {
			h = end
		}
		if buf == nil {
			buf = c.s.readBuf(int(n))
			// Spliced into the reply without a copy, as for READ.
			c.call.AfterReply(func() { c.s.putReadBuf(buf) })
		}
		seg := buf[pos-a.RpaOffset : h-a.RpaOffset]
		m, err := f.ReadAt(seg, int64(pos))
		if err != nil && !errors.Is(err, io.EOF) {
			return failErr(err)
		}
		clear(seg[m:]) // readBuf's bytes are not cleared
		c.s.counters.readBytes.Add(uint64(len(seg)))
		res.RprContents = append(res.RprContents, nfs4.ReadPlusContent{RpcContent: nfs4.NFS4_CONTENT_DATA,
			RpcData: &nfs4.Data4{DOffset: pos, DData: seg}})
		pos = h
	}
	res.RprEof = pos >= size
	return ok(res)
}
