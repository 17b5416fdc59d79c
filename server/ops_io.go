package server

import (
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// openData opens an inode's data file, treating a missing one as empty.
func (s *Server) openData(ino meta.Ino, create bool) (store.File, error) {
	f, err := s.data.Open(uint64(ino), create)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return f, err
}

func (c *compound) read(a *nfs4.READ4args) opReply {
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.checkIO(&a.Stateid, o, false); st != nfs4.NFS4_OK {
		return fail(st)
	}
	return c.readData(o.fh.ino, a, o.attr.Size)
}

// readData answers a READ of file ino in both roles: size is where the
// file ends as far as the role knows (the MDS from its attributes, a data
// server from dsReadEnd), and the data comes from the server's store.
func (c *compound) readData(ino meta.Ino, a *nfs4.READ4args, size uint64) opReply {
	if a.Offset >= size || a.Count == 0 {
		return ok(&nfs4.READ4resok{Eof: a.Offset >= size, Data: nil})
	}
	n := uint64(min(a.Count, c.s.cfg.MaxRead))
	if a.Offset+n > size {
		n = size - a.Offset
	}
	buf := c.s.readBuf(int(n))
	// The buffer is spliced into the reply without a copy; it goes back to
	// the pool once the reply has been written.
	c.call.AfterReply(func() { c.s.putReadBuf(buf) })
	f, err := c.s.openData(ino, false)
	if err != nil {
		return failErr(err)
	}
	got := 0
	if f != nil {
		got, err = f.ReadAt(buf, int64(a.Offset))
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			return failErr(err)
		}
	}
	// Bytes past the data file's end but inside the file size read as zeros
	// (sparse tail after a size extension). Only they are cleared: the
	// buffer comes from the pool as it was left, and clearing all of it
	// before every READ was a second pass over each byte read.
	clear(buf[got:])
	got = int(n)
	c.s.counters.readBytes.Add(uint64(got))
	return ok(&nfs4.READ4resok{Eof: a.Offset+uint64(got) >= size, Data: buf[:got]})
}

func (c *compound) write(a *nfs4.WRITE4args) opReply {
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.writable(o); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.checkIO(&a.Stateid, o, true); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.checkWriteRange(a); st != nfs4.NFS4_OK {
		return fail(st)
	}
	end := a.Offset + uint64(len(a.Data))
	f, err := c.s.data.Open(uint64(o.fh.ino), true)
	if err != nil {
		return failErr(err)
	}
	defer f.Close()
	inline := false
	if inf, isInline := f.(*inlineFile); isInline {
		inline, err = inf.writeAt(c.ctx, a.Data, int64(a.Offset))
	} else {
		_, err = f.WriteAt(a.Data, int64(a.Offset))
	}
	if err != nil {
		return failErr(err)
	}
	c.s.counters.writeBytes.Add(uint64(len(a.Data)))
	if inline {
		// Data, size and mtime were committed together, and are
		// durable when the reply goes (durability.go).
		c.needStable()
		return ok(&nfs4.WRITE4resok{Count: uint32(len(a.Data)), Committed: nfs4.FILE_SYNC4, Writeverf: c.s.verifier()})
	}
	c.s.cache.wrote(o.fh.ino, o.attr, end, time.Now())
	committed := nfs4.UNSTABLE4
	if a.Stable != nfs4.UNSTABLE4 {
		if err := c.s.dataLost(f.Sync()); err != nil {
			return failErr(err)
		}
		if err := c.s.cache.flush(c.ctx, o.fh.ino); err != nil {
			return failErr(err)
		}
		c.needStable()
		committed = nfs4.FILE_SYNC4
	}
	return ok(&nfs4.WRITE4resok{Count: uint32(len(a.Data)), Committed: committed, Writeverf: c.s.verifier()})
}

// checkWriteRange checks a WRITE's size and range, in both roles.
func (c *compound) checkWriteRange(a *nfs4.WRITE4args) nfs4.Nfsstat4 {
	if uint64(len(a.Data)) > uint64(c.s.cfg.MaxWrite) {
		return nfs4.NFS4ERR_INVAL
	}
	end := a.Offset + uint64(len(a.Data))
	if end < a.Offset || end > 1<<63-1 {
		return nfs4.NFS4ERR_FBIG
	}
	return nfs4.NFS4_OK
}

func (c *compound) commit(a *nfs4.COMMIT4args) opReply {
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if err := c.s.dataLost(c.s.data.Sync(uint64(o.fh.ino))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return failErr(err)
	}
	if err := c.s.cache.flush(c.ctx, o.fh.ino); err != nil {
		return failErr(err)
	}
	c.needStable()
	return ok(&nfs4.COMMIT4resok{Writeverf: c.s.verifier()})
}

// readPool recycles READ buffers of the maximum read size: a fresh 1 MiB
// buffer per READ is most of the server's garbage on the read path.
var readPool sync.Pool

// readBuf returns a buffer of n bytes for a READ reply. Its bytes are
// whatever the pool's last user left: the caller overwrites or clears
// every byte it sends (holes read as zeros from the data file; the tail
// past the file's end is cleared by the caller).
func (s *Server) readBuf(n int) []byte {
	if b, ok := readPool.Get().(*[]byte); ok && cap(*b) >= n {
		return (*b)[:n]
	}
	return make([]byte, n, max(n, int(s.cfg.MaxRead)))
}

func (s *Server) putReadBuf(b []byte) {
	if cap(b) >= int(s.cfg.MaxRead) {
		readPool.Put(&b)
	}
}

// verifier is the write verifier WRITE and COMMIT report. It is the
// verifier of this start, changed each time a data server lost writes it
// had not committed (dataLost), so that clients resend what they wrote
// UNSTABLE through this server before then.
func (s *Server) verifier() [8]byte {
	v := s.writeVerf
	g := binary.BigEndian.Uint32(v[4:]) ^ s.verfGen.Load()
	binary.BigEndian.PutUint32(v[4:], g)
	return v
}

// dataLost filters the error of a sync of data written through this server.
// pnfs.ErrDataLost says a data server restarted while holding uncommitted
// writes: what this sync covers is stable now, but earlier UNSTABLE writes
// may be gone. Changing the verifier (RFC 8881 §18.3.3) makes every client
// that wrote them resend; the sync itself succeeded.
func (s *Server) dataLost(err error) error {
	if errors.Is(err, pnfs.ErrDataLost) {
		s.verfGen.Add(1)
		s.log.Warn("a data server lost uncommitted writes; write verifier changed so clients resend", "err", err)
		return nil
	}
	return err
}
