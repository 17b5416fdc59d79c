package server

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// Server-side copy: COPY (RFC 7862 §15.2) and CLONE (§15.13) within this
// server. The saved filehandle is the source, the current one the
// destination.
//
// The bytes are copied by the store (store.Copier) where it can: the local
// store in the kernel (copy_file_range(2), a clone on file systems that
// share blocks), the pNFS metadata server's cluster.Striped on each data
// server for its own stripe units, when the two files' stripe maps line
// up. Otherwise copyData copies through a buffer here; on a metadata
// server those bytes pass through it (OBJ_READ and OBJ_WRITE).
//
// A synchronous copy replies when the bytes are copied and stable
// (FILE_SYNC4); a long one that the client asks to be asynchronous runs
// in the background (copy_async.go).

// copyFiles resolves and checks the source (saved filehandle, read under
// srcSid) and destination (current filehandle, written under dstSid) of a
// COPY or CLONE.
func (c *compound) copyFiles(srcSid, dstSid *nfs4.Stateid4) (src, dst *object, st nfs4.Nfsstat4) {
	if !c.hasSFH {
		return nil, nil, nfs4.NFS4ERR_NOFILEHANDLE
	}
	if dst, st = c.currentFile(); st != nfs4.NFS4_OK {
		return nil, nil, st
	}
	if src, st = c.load(c.sfh); st != nfs4.NFS4_OK {
		return nil, nil, st
	}
	if src.export != nil && !src.export.allows(c.addr) {
		return nil, nil, nfs4.NFS4ERR_ACCESS
	}
	switch src.attr.Type {
	case meta.TypeRegular:
	case meta.TypeDirectory:
		return nil, nil, nfs4.NFS4ERR_ISDIR
	case meta.TypeSymlink:
		return nil, nil, nfs4.NFS4ERR_SYMLINK
	default:
		return nil, nil, nfs4.NFS4ERR_WRONG_TYPE
	}
	if st := c.writable(dst); st != nfs4.NFS4_OK {
		return nil, nil, st
	}
	if st := c.checkIO(srcSid, src, false); st != nfs4.NFS4_OK {
		return nil, nil, st
	}
	if st := c.checkIO(dstSid, dst, true); st != nfs4.NFS4_OK {
		return nil, nil, st
	}
	return src, dst, nfs4.NFS4_OK
}

// copyRange checks the ranges of a COPY or CLONE (RFC 7862 §15.2.3,
// §15.13.3) and returns the number of bytes to copy: count, or what is
// left of the source from srcOff if count is 0.
func copyRange(src, dst *object, srcOff, dstOff, count uint64) (uint64, nfs4.Nfsstat4) {
	size := src.attr.Size
	if srcOff > size {
		return 0, nfs4.NFS4ERR_INVAL
	}
	if count == 0 {
		count = size - srcOff
	}
	if srcOff+count < srcOff || srcOff+count > size {
		return 0, nfs4.NFS4ERR_INVAL
	}
	if end := dstOff + count; end < dstOff || end > 1<<63-1 {
		return 0, nfs4.NFS4ERR_FBIG
	}
	if src.fh.ino == dst.fh.ino && srcOff < dstOff+count && dstOff < srcOff+count {
		return 0, nfs4.NFS4ERR_INVAL
	}
	return count, nfs4.NFS4_OK
}

func (c *compound) copy(a *nfs4.COPY4args) opReply {
	src, dst, st := c.copyFiles(&a.CaSrcStateid, &a.CaDstStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if len(a.CaSourceServer) > 0 {
		// An inter-server copy (§4.2): this server would have to read the
		// source from another server. Only intra-server copies are
		// supported.
		return fail(nfs4.NFS4ERR_NOTSUPP)
	}
	n, st := copyRange(src, dst, a.CaSrcOffset, a.CaDstOffset, a.CaCount)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if !a.CaSynchronous && n >= c.s.copies.minAsync() {
		if sid, started := c.startCopy(src, dst, a.CaSrcOffset, a.CaDstOffset, n); started {
			return ok(&nfs4.COPY4resok{
				CrResponse:     nfs4.WriteResponse4{WrCallbackId: []nfs4.Stateid4{sid}, WrCommitted: nfs4.UNSTABLE4, WrWriteverf: c.s.verifier()},
				CrRequirements: nfs4.CopyRequirements4{CrConsecutive: true},
			})
		}
	}
	if err := c.s.copyFile(c.ctx, src.fh.ino, dst, a.CaSrcOffset, a.CaDstOffset, n, n); err != nil {
		return failErr(err)
	}
	c.needStable() // FILE_SYNC4
	return ok(&nfs4.COPY4resok{
		CrResponse: nfs4.WriteResponse4{WrCount: n, WrCommitted: nfs4.FILE_SYNC4, WrWriteverf: c.s.verifier()},
		// Always consecutive; synchronous even when asked otherwise.
		CrRequirements: nfs4.CopyRequirements4{CrConsecutive: true, CrSynchronous: true},
	})
}

// cloneBlksize is the clone_blksize attribute (RFC 7862 §12.2.1), to
// which CLONE's offsets and count are aligned: the checksum block of the
// local store, the stripe unit on a metadata server (so that a clone of
// files whose stripe maps line up runs on the data servers).
func (s *Server) cloneBlksize() uint64 {
	return s.pnfs.stripeUnit(store.ChecksumBlockSize)
}

func (c *compound) clone(a *nfs4.CLONE4args) opReply {
	src, dst, st := c.copyFiles(&a.ClSrcStateid, &a.ClDstStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	n, st := copyRange(src, dst, a.ClSrcOffset, a.ClDstOffset, a.ClCount)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	blk := c.s.cloneBlksize()
	if a.ClSrcOffset%blk != 0 || a.ClDstOffset%blk != 0 || n%blk != 0 && a.ClSrcOffset+n != src.attr.Size {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	// A count that ends at the source's end but not at a block boundary
	// clones the rest of that block as zeros (§15.13.3): the destination
	// is zeroed up to the boundary if it goes on past it.
	area := (n + blk - 1) / blk * blk
	if a.ClDstOffset+area < a.ClDstOffset || a.ClDstOffset+area > 1<<63-1 {
		area = n
	}
	if err := c.s.copyFile(c.ctx, src.fh.ino, dst, a.ClSrcOffset, a.ClDstOffset, area, n); err != nil {
		return failErr(err)
	}
	return ok(nil)
}

// copyFile copies area bytes of file src from srcOff to dst at dstOff,
// makes them stable, and records the destination's new size and change:
// it grows to dstOff+n if it was shorter.
func (s *Server) copyFile(ctx context.Context, src meta.Ino, dst *object, srcOff, dstOff, area, n uint64) error {
	if area == 0 {
		return nil
	}
	if err := s.copyData(ctx, uint64(src), uint64(dst.fh.ino), srcOff, dstOff, area); err != nil {
		return err
	}
	if err := s.dataLost(s.data.Sync(uint64(dst.fh.ino))); err != nil {
		return err
	}
	end := dstOff + n
	if end <= dst.attr.Size {
		end = 0
	}
	s.cache.wrote(dst.fh.ino, dst.attr, end, time.Now())
	return s.cache.flush(ctx, dst.fh.ino)
}

// copyBufSize is the buffer of a copy that goes through this server.
const copyBufSize = 1 << 20

// copyData copies [srcOff, srcOff+n) of file src's data to dst at dstOff:
// by the store if it can (store.Copier), through a buffer here otherwise
// (on a metadata server those bytes pass through it).
func (s *Server) copyData(ctx context.Context, src, dst, srcOff, dstOff, n uint64) error {
	if cp, ok := s.data.(store.Copier); ok {
		err := cp.CopyRange(src, dst, int64(srcOff), int64(dstOff), int64(n))
		if !errors.Is(err, store.ErrNotSupported) {
			return err
		}
		// Worth knowing: on a metadata server this copy moves every byte
		// through it, from and to the data servers.
		s.log.Info("copying through this server: the store cannot copy the range itself",
			"src", src, "dst", dst, "bytes", n, "why", err)
	}
	sf, err := s.openData(meta.Ino(src), false)
	if err != nil {
		return err
	}
	if sf != nil {
		defer sf.Close()
	}
	df, err := s.data.Open(dst, true)
	if err != nil {
		return err
	}
	defer df.Close()
	buf := make([]byte, min(n, copyBufSize))
	for done := uint64(0); done < n; {
		if err := ctx.Err(); err != nil {
			return err
		}
		b := buf[:min(uint64(len(buf)), n-done)]
		got := 0
		if sf != nil {
			got, err = sf.ReadAt(b, int64(srcOff+done))
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
		}
		clear(b[got:]) // past the source's data: zeros
		if _, err := df.WriteAt(b, int64(dstOff+done)); err != nil {
			return err
		}
		done += uint64(len(b))
	}
	return nil
}
