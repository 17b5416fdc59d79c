package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// DataServerConfig configures a pNFS data server (NewDataServer): it
// serves READ, WRITE and COMMIT on data filehandles handed out by a
// metadata server, and keeps each file's stripe units in a local file
// (sparse packing: a unit at file offset X is stored at offset X). It has
// no namespace, exports or metadata engine: those are the MDS's (Config).
type DataServerConfig struct {
	// Dir holds the data server's identity (ds-id) and, unless Store is
	// set, the data.
	Dir string
	// Lease is the lease time of the clients' sessions with this data
	// server (default 90 s).
	Lease time.Duration
	// MaxRead and MaxWrite bound READ and WRITE sizes (default 1 MiB).
	MaxRead, MaxWrite uint32
	Logger            *slog.Logger
	// Metrics, if set, receives the server's Prometheus collector, with
	// MetricLabels (for example role and instance) on every series.
	Metrics      prometheus.Registerer
	MetricLabels prometheus.Labels

	// Secret returns the data filehandle key, or nil while the data
	// server is not registered with its metadata server. It must be the
	// MDS's Server.DataFHKey: data handles are not MAC'd with the MDS's
	// master secret (Server.ClusterSecret), and this key verifies and mints
	// data handles only, never the MDS's own filehandles.
	Secret func() []byte
	// CheckStateid asks the metadata server whether an open or lock
	// stateid allows I/O on a file (cluster.Agent.CheckStateid). Errors
	// wrap package pnfs's verdicts (pnfs.ErrBadStateid, ErrOldStateid,
	// ErrStaleStateid, ErrExpired, ErrOpenMode, ErrFenced); any other
	// error means the metadata server could not be asked and the client is
	// told to retry.
	CheckStateid func(ctx context.Context, ino uint64, stateid [16]byte, write bool) error
	// FileSize asks the metadata server for a file's size; a READ that
	// reaches past the end of this data server's object needs it to tell
	// a hole from the end of the file.
	FileSize func(ctx context.Context, ino uint64) (uint64, error)
	// Store keeps the data; default a store.Local under Dir.
	Store store.Backend

	// programs serves other ONC RPC programs on the same listener (the
	// data servers' replication protocol); see Config.programs.
	programs map[uint32]rpc.Handler
}

// NewDataServer builds a pNFS data server. It shares the COMPOUND and
// session core with the metadata server, and answers the operations of
// dsOps (optable.go) with the handlers of this file.
func NewDataServer(ds DataServerConfig) (*Server, error) {
	if ds.Dir == "" {
		return nil, errors.New("server: no data directory")
	}
	if ds.Secret == nil || ds.CheckStateid == nil || ds.FileSize == nil {
		return nil, errors.New("server: data server needs Secret, CheckStateid and FileSize")
	}
	// The core's settings; the rest of Config is the MDS's.
	cfg := Config{Dir: ds.Dir, Lease: ds.Lease, MaxRead: ds.MaxRead, MaxWrite: ds.MaxWrite, Logger: ds.Logger,
		programs: ds.programs, Metrics: ds.Metrics, MetricLabels: ds.MetricLabels}
	cfg.fillDefaults()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, bootTime: time.Now(), ds: &ds, ops: dsOps,
		exchangeFlags: nfs4.EXCHGID4_FLAG_USE_PNFS_DS}
	s.initLife()
	s.cctx = s.life // no metadata engine: nothing to sync
	var err error
	s.data = ds.Store
	if s.data == nil {
		if s.data, err = store.NewLocal(cfg.Dir, store.LocalOptions{}); err != nil {
			return nil, fmt.Errorf("server: data store: %w", err)
		}
		s.ownData = true
	}
	// Each data server is its own server instance to clients: distinct
	// owner and scope, or the client would take it for a trunk of the MDS.
	id, err := loadOrCreateID(filepath.Join(cfg.Dir, "ds-id"))
	if err != nil {
		return nil, err
	}
	s.owner = append([]byte("shoal-ds:"), id...)
	s.scope = append([]byte("shoal-ds:"), id...)
	fillWriteVerf(s)
	s.cache = newInodeCache(s)
	// A data server's client IDs live only as long as it runs: its
	// clients' opens and locks are the MDS's.
	if s.st, err = newStateGlue(s, 0, nil); err != nil {
		return nil, err
	}
	if err := s.registerMetrics(); err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	s.rpc = &rpc.Server{Handler: (*rpcHandler)(s), Logger: s.log, ConnState: s.connState}
	return s, nil
}

// loadOrCreateID returns a persistent random identity stored in path.
func loadOrCreateID(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil && len(b) == 16 {
		return []byte(fmt.Sprintf("%x", b)), nil
	}
	b = make([]byte, 16)
	if _, err := randRead(b); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return []byte(fmt.Sprintf("%x", b)), nil
}

// dsLoad resolves a data filehandle on a data server: a regular file
// whose size is that of this data server's object (the only attribute
// its handlers use; the file's attributes are the MDS's).
func (c *compound) dsLoad(h fhandle) (*object, nfs4.Nfsstat4) {
	if h.kind != fhData && h.kind != fhFlex {
		return nil, nfs4.NFS4ERR_BADHANDLE
	}
	a := meta.Attr{Type: meta.TypeRegular}
	f, err := c.s.openData(h.ino, false)
	if err != nil {
		return nil, statusOf(err)
	}
	if f != nil {
		if n, err := f.Size(); err == nil {
			a.Size = uint64(n)
		}
		f.Close()
	}
	return &object{fh: h, attr: a}, nfs4.NFS4_OK
}

// dsCurrent returns the object of the current filehandle on a data
// server (dsLoad).
func (c *compound) dsCurrent() (*object, nfs4.Nfsstat4) {
	if !c.hasCFH {
		return nil, nfs4.NFS4ERR_NOFILEHANDLE
	}
	return c.dsLoad(c.cfh)
}

// dsPutFH decodes a data filehandle with the data filehandle key.
func (c *compound) dsPutFH(a *nfs4.PUTFH4args) opReply {
	key := c.s.ds.Secret()
	if len(key) == 0 {
		return fail(nfs4.NFS4ERR_DELAY) // not registered with the MDS yet
	}
	codec := newDataFHCodec(key)
	h, err := codec.decode(a.Object)
	if err != nil || h.kind != fhData && h.kind != fhFlex {
		return fail(nfs4.NFS4ERR_BADHANDLE)
	}
	c.setFH(h)
	return ok(nil)
}

// dsSecinfoNoName is SECINFO_NO_NAME on a data server (RFC 8881 §13.6
// counts it among the housekeeping operations): the flavors are the
// MDS's, and a data file has no parent to ask about.
func (c *compound) dsSecinfoNoName(*nfs4.SECINFONONAME4args) opReply {
	if _, st := c.dsCurrent(); st != nfs4.NFS4_OK {
		return fail(st)
	}
	c.hasCFH = false
	return ok(secinfoList)
}

// dsRead is READ on a data server: the stateid is the MDS's to check,
// and the file ends where dsReadEnd says.
func (c *compound) dsRead(a *nfs4.READ4args) opReply {
	o, st := c.dsCurrent()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.dsCheckIO(&a.Stateid, o, false); st != nfs4.NFS4_OK {
		return fail(st)
	}
	size, st := c.dsReadEnd(a, o)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	return c.readData(o.fh.ino, a, size)
}

// dsReadPlus is READ_PLUS on a data server, bounded like dsRead.
func (c *compound) dsReadPlus(a *nfs4.READPLUS4args) opReply {
	o, st := c.dsCurrent()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.dsCheckIO(&a.RpaStateid, o, false); st != nfs4.NFS4_OK {
		return fail(st)
	}
	size, st := c.dsReadEnd(&nfs4.READ4args{Offset: a.RpaOffset, Count: a.RpaCount}, o)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	return c.readPlusData(o.fh.ino, a, size)
}

// dsReadEnd returns where a data server's READ must stop: the end of the
// file for this read. A data server holds only its stripe units (sparse
// packing), so the end of its object is not the end of the file: within
// the object every byte is the file's (holes read as zeros), and past it
// the data server asks the MDS for the file's size (FILE_SIZE), so that a
// hole in the file still reads as zeros while a read past the file's end
// gets a short reply with eof (RFC 8881 §13.4; an O_DIRECT reader has
// nothing else that tells it where the file ends). The result never
// claims a byte the file does not have.
func (c *compound) dsReadEnd(a *nfs4.READ4args, o *object) (uint64, nfs4.Nfsstat4) {
	obj := o.attr.Size
	want := a.Offset + uint64(min(a.Count, c.s.cfg.MaxRead))
	if want <= obj {
		// Entirely inside the object. Whether the file goes on past it
		// is for the next READ to find out; eof stays false.
		return want + 1, nfs4.NFS4_OK
	}
	size, err := c.s.ds.FileSize(c.ctx, uint64(o.fh.ino))
	if err != nil {
		c.log.Debug("data server READ: file size from the MDS", "ino", o.fh.ino, "err", err)
		if errors.Is(err, pnfs.ErrMDSUnreachable) {
			// No MDS to ask (a failover): the client reads through
			// the MDS at once instead of backing off (dsCheckIO).
			return 0, nfs4.NFS4ERR_PNFS_NO_LAYOUT
		}
		return 0, nfs4.NFS4ERR_DELAY
	}
	return max(obj, size), nfs4.NFS4_OK
}

// dsWrite is WRITE on a data server: the data goes into this data
// server's object; the file's size and times are the MDS's business.
func (c *compound) dsWrite(a *nfs4.WRITE4args) opReply {
	o, st := c.dsCurrent()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.dsCheckIO(&a.Stateid, o, true); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.checkWriteRange(a); st != nfs4.NFS4_OK {
		return fail(st)
	}
	f, err := c.dsData(o.fh).Open(uint64(o.fh.ino), true)
	if err != nil {
		return failErr(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(a.Data, int64(a.Offset)); err != nil {
		return failErr(err)
	}
	c.s.counters.writeBytes.Add(uint64(len(a.Data)))
	committed := nfs4.UNSTABLE4
	if a.Stable != nfs4.UNSTABLE4 {
		if err := c.s.dataLost(f.Sync()); err != nil {
			return failErr(err)
		}
		// Only the data is stable here; the file's size and mtime live
		// on the MDS until the client's LAYOUTCOMMIT. FILE_SYNC4 would
		// tell the client no LAYOUTCOMMIT is needed.
		committed = nfs4.DATA_SYNC4
	}
	return ok(&nfs4.WRITE4resok{Count: uint32(len(a.Data)), Committed: committed, Writeverf: c.s.verifier()})
}

// dsCommit is COMMIT on a data server: this data server's object is
// synced; the file's attributes are the MDS's (LAYOUTCOMMIT).
func (c *compound) dsCommit(*nfs4.COMMIT4args) opReply {
	o, st := c.dsCurrent()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if err := c.s.dataLost(c.dsData(o.fh).Sync(uint64(o.fh.ino))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return failErr(err)
	}
	return ok(&nfs4.COMMIT4resok{Writeverf: c.s.verifier()})
}

// dsCheckIO validates the stateid of I/O on a data server with the
// metadata server.
func (c *compound) dsCheckIO(s *nfs4.Stateid4, o *object, write bool) nfs4.Nfsstat4 {
	sid, st := c.stateid(*s)
	if st != nfs4.NFS4_OK {
		return st
	}
	var b [16]byte
	b[0], b[1], b[2], b[3] = byte(sid.Seqid>>24), byte(sid.Seqid>>16), byte(sid.Seqid>>8), byte(sid.Seqid)
	copy(b[4:], sid.Other[:])
	err := c.s.ds.CheckStateid(c.ctx, uint64(o.fh.ino), b, write)
	switch {
	case err == nil:
		return nfs4.NFS4_OK
	case errors.Is(err, pnfs.ErrFenced):
		// The client's layout was revoked: RFC 8881 §12.5.5 — it must get
		// a new layout (or go through the MDS) before doing I/O here.
		return nfs4.NFS4ERR_PNFS_NO_LAYOUT
	case errors.Is(err, pnfs.ErrMDSUnreachable):
		// No MDS to vouch for the stateid (it is restarting or failing
		// over) and no recent answer about it: send the client to the
		// MDS, never DELAY. The Linux files layout driver
		// (fs/nfs/filelayout/filelayout.c, filelayout_async_handle_error)
		// answers NFS4ERR_DELAY from a data server with
		// rpc_delay(task, FILELAYOUT_POLL_RETRY_MAX), 15 s, while
		// NFS4ERR_PNFS_NO_LAYOUT is among its "Invalidate Layout errors":
		// pnfs_destroy_layout, then NFS4ERR_RESET_TO_MDS, which resends
		// the I/O through the MDS at once and makes the next I/O ask for
		// a new layout. Shoal's client (client/pnfs.go, doPiece and
		// failover) likewise redoes the piece through the MDS.
		return nfs4.NFS4ERR_PNFS_NO_LAYOUT
	}
	for _, v := range []error{pnfs.ErrBadStateid, pnfs.ErrOldStateid, pnfs.ErrStaleStateid,
		pnfs.ErrExpired, pnfs.ErrOpenMode} {
		if errors.Is(err, v) {
			return statusOf(err)
		}
	}
	// The metadata server could not be asked.
	return nfs4.NFS4ERR_DELAY
}

// LocalCopier is an optional capability of a data server's store
// (DataServerConfig.Store, cluster.ReplicaStore): the backend for I/O
// addressed to this data server's copy alone, which writes and commits
// that copy only and forwards nothing to the other copies.
type LocalCopier interface {
	LocalCopy() store.Backend
}

// dsData returns the store a data server's WRITE and COMMIT on handle h
// use: for a flexfiles handle (fhFlex) the client writes every copy
// itself, so only this copy is written (LocalCopier); for a files-layout
// handle the store replicates to the other copies.
func (c *compound) dsData(h fhandle) store.Backend {
	if h.kind == fhFlex {
		if lc, ok := c.s.data.(LocalCopier); ok {
			return lc.LocalCopy()
		}
	}
	return c.s.data
}
