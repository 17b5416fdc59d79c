package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shoalfs/shoal/cluster"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// DataServerConfig makes a Server a pNFS data server: it serves READ, WRITE
// and COMMIT on data filehandles handed out by a metadata server, and keeps
// each file's stripe units in a local file (sparse packing: a unit at file
// offset X is stored at offset X).
type DataServerConfig struct {
	// Secret returns the data filehandle key, or nil while the data
	// server is not registered with its metadata server. It must be the
	// MDS's Server.DataFHKey: data handles are not MAC'd with the MDS's
	// master secret (Server.ClusterSecret), and this key verifies and mints
	// data handles only, never the MDS's own filehandles.
	Secret func() []byte
	// CheckStateid asks the metadata server whether an open or lock
	// stateid allows I/O on a file (cluster.Agent.CheckStateid). Errors
	// wrap the cluster's verdicts (cluster.ErrBadStateid, ErrOldStateid,
	// ErrStaleStateid, ErrExpired, ErrOpenMode, ErrFenced); any other
	// error means the metadata server could not be asked and the client is
	// told to retry.
	CheckStateid func(ctx context.Context, ino uint64, stateid [16]byte, write bool) error
	// FileSize asks the metadata server for a file's size; a READ that
	// reaches past the end of this data server's object needs it to tell
	// a hole from the end of the file.
	FileSize func(ctx context.Context, ino uint64) (uint64, error)
	// Store keeps the data; default a store.Local under Config.Dir.
	Store store.Backend
}

// NewDataServer builds a pNFS data server.
func NewDataServer(cfg Config, ds DataServerConfig) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("server: no data directory")
	}
	if ds.Secret == nil || ds.CheckStateid == nil || ds.FileSize == nil {
		return nil, errors.New("server: data server needs Secret, CheckStateid and FileSize")
	}
	cfg.fillDefaults()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, bootTime: time.Now(), ds: &ds}
	s.life, s.endLife = context.WithCancel(context.Background())
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
	if s.st, err = newStateGlue(s); err != nil {
		return nil, err
	}
	if err := s.registerMetrics(); err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	s.rpc = &rpc.Server{Handler: s, Logger: s.log, ConnState: s.connState}
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

// dsLoad resolves a data filehandle on a data server.
func (c *compound) dsLoad(h fhandle) (*object, nfs4.Nfsstat4) {
	if h.kind != fhData {
		return nil, nfs4.NFS4ERR_BADHANDLE
	}
	a := meta.Attr{Type: meta.TypeRegular, Mode: 0o644, Nlink: 1}
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
	a.Change = a.Size
	return &object{fh: h, attr: a}, nfs4.NFS4_OK
}

// dsPutFH decodes a data filehandle with the data filehandle key.
func (c *compound) dsPutFH(a *nfs4.PUTFH4args) opReply {
	key := c.s.ds.Secret()
	if len(key) == 0 {
		return fail(nfs4.NFS4ERR_DELAY) // not registered with the MDS yet
	}
	codec := newDataFHCodec(key)
	h, err := codec.decode(a.Object)
	if err != nil || h.kind != fhData {
		return fail(nfs4.NFS4ERR_BADHANDLE)
	}
	c.setFH(h)
	return ok(nil)
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
	case errors.Is(err, cluster.ErrFenced):
		// The client's layout was revoked: RFC 8881 §12.5.5 — it must get
		// a new layout (or go through the MDS) before doing I/O here.
		return nfs4.NFS4ERR_PNFS_NO_LAYOUT
	case errors.Is(err, cluster.ErrMDSUnreachable):
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
	for _, v := range []error{cluster.ErrBadStateid, cluster.ErrOldStateid, cluster.ErrStaleStateid,
		cluster.ErrExpired, cluster.ErrOpenMode} {
		if errors.Is(err, v) {
			return statusOf(err)
		}
	}
	// The metadata server could not be asked.
	return nfs4.NFS4ERR_DELAY
}
