package flexv3

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/nfs3"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// Synthetic ids (RFC 8435 §2.2). They live in [IDBase, IDBase+2^30) so
// that they meet no real user of the data servers:
//
//	group of file ino:         IDBase +         ino mod 2^28
//	read-only uid of file ino: IDBase + 2^28 +  ino mod 2^28
//	owner (read/write) uid:    IDBase + 2^29 +  random below 2^29, new at
//	                           creation and at every fence
const (
	DefaultIDBase = 0x40000000
	idSpan        = 1 << 28
)

// DataFileMode is the mode of a data file: the owner (the read/write
// layout's uid) writes, the group (the read layout's) reads.
const DataFileMode = 0o640

// Config configures a Store.
type Config struct {
	Servers []Server
	// Mirrors is the number of copies of each file, each on a different
	// server; default 2 (1 with one server), at most len(Servers).
	Mirrors int
	// Dial opens the MDS's connections to the servers (tests dial inside
	// a network namespace); nil: net.Dialer.
	Dial nfs3.DialFunc
	// IDBase is the first synthetic id; default DefaultIDBase.
	IDBase uint32
	// IOSize is the largest READ or WRITE the store sends; default 1 MiB.
	IOSize uint32
	// Timeout bounds each call to a data server; default 30 s.
	Timeout time.Duration
	// Logger logs stale marks and heals; nil: slog.Default().
	Logger *slog.Logger
}

// Store keeps files' data on loosely coupled NFSv3 data servers. It is a
// store.Backend (I/O through the MDS) and hands out the layouts' data
// server entries (Layout, DeviceAddr) and fences (Fence). Safe for
// concurrent use.
//
// Locks: a file's heal lock (heals, heal.go) is taken before mu, never
// while mu is held; mu is never held across a call to a data server.
type Store struct {
	cfg     Config
	servers []*server

	maps    Maps                    // stale marks (stale.go); nil: none
	recall  func(ino uint64)        // recalls a file's layouts; nil: none
	heals   [healLocks]sync.RWMutex // heal.go
	kicks   chan struct{}           // RunHealer's
	metrics healMetrics

	mu        sync.Mutex
	files     map[uint64]*dataFiles // handles and owner of files seen, a cache
	healing   map[uint64]bool       // files being healed: no write layouts
	marks     uint64                // stale marks made: lookupOnce's check
	healAfter meta.Ino              // where the next HealPass reads maps from
}

var _ store.Backend = (*Store)(nil)

// New returns a Store on cfg.Servers; it connects on first use.
func New(cfg Config) (*Store, error) {
	if len(cfg.Servers) == 0 {
		return nil, errors.New("flexv3: no data servers")
	}
	if cfg.Mirrors == 0 {
		cfg.Mirrors = min(2, len(cfg.Servers))
	}
	if cfg.Mirrors < 1 || cfg.Mirrors > len(cfg.Servers) {
		return nil, fmt.Errorf("flexv3: %d mirrors on %d data servers", cfg.Mirrors, len(cfg.Servers))
	}
	if cfg.IDBase == 0 {
		cfg.IDBase = DefaultIDBase
	}
	if uint64(cfg.IDBase)+4*idSpan > 1<<32-2 {
		return nil, fmt.Errorf("flexv3: id base %d leaves no room for synthetic ids", cfg.IDBase)
	}
	if cfg.IOSize == 0 {
		cfg.IOSize = 1 << 20
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	s := &Store{cfg: cfg, files: map[uint64]*dataFiles{}, healing: map[uint64]bool{},
		kicks: make(chan struct{}, 1), metrics: newHealMetrics()}
	for _, sc := range cfg.Servers {
		s.servers = append(s.servers, &server{cfg: sc, opts: nfs3.Options{Dial: cfg.Dial}})
	}
	return s, nil
}

// Mirrors is the number of copies of every file.
func (s *Store) Mirrors() int { return s.cfg.Mirrors }

// GID is the synthetic group of file ino's data files.
func (s *Store) GID(ino uint64) uint32 { return s.cfg.IDBase + uint32(ino%idSpan) }

// ReadOnlyUID is the uid of file ino's read layouts: not the owner, so
// the data server grants it the group's read access only.
func (s *Store) ReadOnlyUID(ino uint64) uint32 { return s.cfg.IDBase + idSpan + uint32(ino%idSpan) }

func (s *Store) freshOwner(not uint32) uint32 {
	for {
		u := s.cfg.IDBase + 2*idSpan + rand.Uint32N(2*idSpan)
		if u != not {
			return u
		}
	}
}

// name is the data file's name in a server's export.
func name(ino uint64) string { return "shoal-" + strconv.FormatUint(ino, 10) }

// placement returns the servers (indexes) of file ino's mirrors: a
// rotation, so that files spread over the servers and a file's mirrors
// are on different ones.
func (s *Store) placement(ino uint64) []int {
	n := uint64(len(s.servers))
	out := make([]int, s.cfg.Mirrors)
	for j := range out {
		out[j] = int((ino + uint64(j)) % n)
	}
	return out
}

// server is one data server and the MDS's connection to it.
type server struct {
	cfg  Server
	opts nfs3.Options

	mu   sync.Mutex
	c    *nfs3.Client
	root []byte
}

// client returns a live connection and the export's root handle,
// connecting (MOUNT, then NFS) when there is none.
func (sv *server) client(ctx context.Context) (*nfs3.Client, []byte, error) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.c != nil {
		select {
		case <-sv.c.Done():
			sv.c = nil
		default:
			return sv.c, sv.root, nil
		}
	}
	root, err := nfs3.Mount(ctx, sv.cfg.MountAddr, sv.cfg.Path, sv.opts)
	if err != nil {
		return nil, nil, err
	}
	c, err := nfs3.Dial(ctx, sv.cfg.Addr, sv.opts)
	if err != nil {
		return nil, nil, err
	}
	sv.c, sv.root = c, root
	return c, root, nil
}

func (sv *server) close() {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.c != nil {
		sv.c.Close()
		sv.c = nil
	}
}

// dataFiles are file ino's data files: handle by mirror, and the owner
// uid they were last seen or set with. stale says which mirrors are
// stale (stale.go); a stale mirror's handle may be nil (its server did
// not answer). owner, stale and fhs are guarded by Store.mu.
type dataFiles struct {
	ino     uint64
	servers []int
	fhs     [][]byte
	owner   uint32
	stale   []bool
}

// good returns the mirrors of df that are not stale, as indexes, under
// s.mu.
func (s *Store) good(df *dataFiles) (idx []int, fhs [][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for j := range df.servers {
		if !df.stale[j] {
			idx = append(idx, j)
			fhs = append(fhs, df.fhs[j])
		}
	}
	return idx, fhs
}

const maxCached = 1 << 16

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.cfg.Timeout)
}

// lookup returns file ino's data files, creating the missing ones when
// create is set. Without create, a file with no data file on its first
// mirror is fs.ErrNotExist.
func (s *Store) lookup(ctx context.Context, ino uint64, create bool) (*dataFiles, error) {
	for try := 1; ; try++ {
		df, retry, err := s.lookupOnce(ctx, ino, create, try < 3)
		if !retry {
			return df, err
		}
	}
}

// lookupOnce is one try of lookup. A stale mark made while it read the
// metadata (Store.marks moved) may be missing from what it read: with
// retry it then reports retry instead of caching it, without it returns
// it uncached.
func (s *Store) lookupOnce(ctx context.Context, ino uint64, create, retry bool) (_ *dataFiles, again bool, _ error) {
	s.mu.Lock()
	df := s.files[ino]
	marks := s.marks
	s.mu.Unlock()
	if df != nil {
		return df, false, nil
	}
	df = &dataFiles{ino: ino, servers: s.placement(ino)}
	stale, err := s.staleOf(ctx, ino, df.servers)
	if err != nil {
		return nil, false, err
	}
	df.stale = stale
	owner := s.freshOwner(0)
	first := true
	for j, si := range df.servers {
		fh, uid, err := s.open(ctx, si, ino, create && !stale[j], owner)
		if err != nil && stale[j] {
			// A stale copy's server may be the one that failed: the
			// heal makes the data file again.
			fh, err = nil, nil
		} else if err != nil {
			return nil, false, err
		}
		if first && fh != nil {
			// Mirrors created by an earlier MDS share one owner; the
			// first good mirror's is the one layouts name.
			owner = uid
			df.owner = uid
			first = false
		}
		df.fhs = append(df.fhs, fh)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.files[ino]; old != nil {
		return old, false, nil
	}
	if s.marks != marks {
		return df, retry, nil
	}
	if len(s.files) >= maxCached {
		clear(s.files)
	}
	s.files[ino] = df
	return df, false, nil
}

// open finds (or with create, creates, GUARDED so that an existing file
// keeps its owner) file ino's data file on server si.
func (s *Store) open(ctx context.Context, si int, ino uint64, create bool, owner uint32) (fh []byte, uid uint32, err error) {
	sv := s.servers[si]
	c, root, err := sv.client(ctx)
	if err != nil {
		return nil, 0, err
	}
	for range 3 {
		fh, err = c.Lookup(ctx, root, name(ino))
		if err == nil {
			a, err := c.Getattr(ctx, fh)
			if err != nil {
				return nil, 0, fmt.Errorf("flexv3: %s on %s: %w", name(ino), sv.cfg.Addr, err)
			}
			return fh, a.Uid, nil
		}
		if nfs3.Status(err) != nfs3.NFS3ERR_NOENT {
			return nil, 0, fmt.Errorf("flexv3: %s on %s: %w", name(ino), sv.cfg.Addr, err)
		}
		if !create {
			return nil, 0, fmt.Errorf("flexv3: %s on %s: %w", name(ino), sv.cfg.Addr, fs.ErrNotExist)
		}
		mode, gid := uint32(DataFileMode), s.GID(ino)
		fh, err = c.Create(ctx, root, name(ino), true, nfs3.Attrs{Mode: &mode, UID: &owner, GID: &gid})
		if err == nil {
			return fh, owner, nil
		}
		if nfs3.Status(err) != nfs3.NFS3ERR_EXIST {
			return nil, 0, fmt.Errorf("flexv3: create %s on %s: %w", name(ino), sv.cfg.Addr, err)
		}
		// Created meanwhile by another call: look it up again.
	}
	return nil, 0, fmt.Errorf("flexv3: %s on %s: created and removed under us", name(ino), sv.cfg.Addr)
}

// each runs f on every good mirror of df and returns the first error.
func (s *Store) each(ctx context.Context, df *dataFiles, f func(c *nfs3.Client, fh []byte) error) error {
	var first error
	idx, fhs := s.good(df)
	for k, j := range idx {
		si := df.servers[j]
		c, _, err := s.servers[si].client(ctx)
		if err == nil {
			err = f(c, fhs[k])
		}
		if err != nil && first == nil {
			first = fmt.Errorf("flexv3: %s on %s: %w", name(df.ino), s.servers[si].cfg.Addr, err)
		}
	}
	return first
}

// Open implements store.Backend.
func (s *Store) Open(ino uint64, create bool) (store.File, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	df, err := s.lookup(ctx, ino, create)
	if err != nil {
		return nil, err
	}
	return &file{s: s, df: df}, nil
}

// Remove implements store.Backend: REMOVE on every mirror.
func (s *Store) Remove(ino uint64) error {
	ctx, cancel := s.ctx()
	defer cancel()
	s.mu.Lock()
	delete(s.files, ino)
	s.mu.Unlock()
	var first error
	for _, si := range s.placement(ino) {
		sv := s.servers[si]
		c, root, err := sv.client(ctx)
		if err == nil {
			err = c.Remove(ctx, root, name(ino))
		}
		if err != nil && nfs3.Status(err) != nfs3.NFS3ERR_NOENT && first == nil {
			first = fmt.Errorf("flexv3: remove %s on %s: %w", name(ino), sv.cfg.Addr, err)
		}
	}
	return first
}

// Truncate implements store.Backend: SETATTR size on every mirror
// (creating the data files if needed). The servers' SETATTR is
// synchronous, as NFSv3 requires.
func (s *Store) Truncate(ino uint64, size uint64) error {
	ctx, cancel := s.ctx()
	defer cancel()
	df, err := s.lookup(ctx, ino, true)
	if err != nil {
		return err
	}
	l := s.healLock(ino)
	l.RLock()
	defer l.RUnlock()
	return s.each(ctx, df, func(c *nfs3.Client, fh []byte) error {
		return c.Setattr(ctx, fh, nfs3.Attrs{Size: &size})
	})
}

// Sync implements store.Backend: COMMIT on every mirror.
func (s *Store) Sync(ino uint64) error {
	ctx, cancel := s.ctx()
	defer cancel()
	df, err := s.lookup(ctx, ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.each(ctx, df, func(c *nfs3.Client, fh []byte) error {
		_, err := c.Commit(ctx, fh, 0, 0)
		return err
	})
}

// StatFS implements store.Backend. The space of NFSv3 data servers is not
// asked (FSSTAT is not implemented): it reports nothing.
func (s *Store) StatFS() (total, free, avail uint64, err error) { return 0, 0, 0, nil }

// Close closes the connections.
func (s *Store) Close() error {
	for _, sv := range s.servers {
		sv.close()
	}
	return nil
}

// Fence gives file ino's data files a fresh owner uid, so that clients
// holding layouts with the old one get NFS3ERR_ACCES/PERM from the data
// servers (RFC 8435 §2.2), and returns it. Layouts handed out afterwards
// name the new owner. It fails if a mirror could not be changed: the
// caller must then not count the client as fenced.
func (s *Store) Fence(ctx context.Context, ino uint64) (uint32, error) {
	df, err := s.lookup(ctx, ino, false)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	owner := s.freshOwner(df.owner)
	s.mu.Unlock()
	err = s.each(ctx, df, func(c *nfs3.Client, fh []byte) error {
		return c.Setattr(ctx, fh, nfs3.Attrs{UID: &owner})
	})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	df.owner = owner
	s.mu.Unlock()
	return owner, nil
}

// Owner returns the current owner uid of file ino's data files.
func (s *Store) Owner(ctx context.Context, ino uint64) (uint32, error) {
	df, err := s.lookup(ctx, ino, false)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return df.owner, nil
}

// file is an open data file: reads from the first mirror that answers,
// writes to every mirror.
type file struct {
	s  *Store
	df *dataFiles
}

var _ store.File = (*file)(nil)

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	ctx, cancel := f.s.ctx()
	defer cancel()
	last := errors.New("flexv3: no good copy")
	idx, fhs := f.s.good(f.df)
	for k, j := range idx {
		si := f.df.servers[j]
		c, _, err := f.s.servers[si].client(ctx)
		if err != nil {
			last = err
			continue
		}
		n, err := readFull(ctx, c, fhs[k], p, off, f.s.cfg.IOSize)
		if err == nil || err == io.EOF {
			return n, err
		}
		last = fmt.Errorf("flexv3: read %s on %s: %w", name(f.df.ino), f.s.servers[si].cfg.Addr, err)
	}
	return 0, last
}

func readFull(ctx context.Context, c *nfs3.Client, fh []byte, p []byte, off int64, max uint32) (int, error) {
	n := 0
	for n < len(p) {
		want := uint32(min(len(p)-n, int(max)))
		b, eof, err := c.Read(ctx, fh, uint64(off)+uint64(n), want)
		if err != nil {
			return n, err
		}
		n += copy(p[n:], b)
		if eof || len(b) == 0 {
			if n < len(p) {
				return n, io.EOF
			}
			break
		}
	}
	return n, nil
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	ctx, cancel := f.s.ctx()
	defer cancel()
	l := f.s.healLock(f.df.ino)
	l.RLock()
	defer l.RUnlock()
	err := f.s.each(ctx, f.df, func(c *nfs3.Client, fh []byte) error {
		for n := 0; n < len(p); {
			chunk := p[n:min(len(p), n+int(f.s.cfg.IOSize))]
			res, err := c.Write(ctx, fh, uint64(off)+uint64(n), chunk, nfs3.UNSTABLE)
			if err != nil {
				return err
			}
			if res.Count == 0 {
				return io.ErrShortWrite
			}
			n += int(res.Count)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (f *file) Sync() error {
	ctx, cancel := f.s.ctx()
	defer cancel()
	return f.s.each(ctx, f.df, func(c *nfs3.Client, fh []byte) error {
		_, err := c.Commit(ctx, fh, 0, 0)
		return err
	})
}

func (f *file) Size() (int64, error) {
	ctx, cancel := f.s.ctx()
	defer cancel()
	idx, fhs := f.s.good(f.df)
	if len(idx) == 0 {
		return 0, fmt.Errorf("flexv3: size of %s: no good copy", name(f.df.ino))
	}
	c, _, err := f.s.servers[f.df.servers[idx[0]]].client(ctx)
	if err != nil {
		return 0, err
	}
	a, err := c.Getattr(ctx, fhs[0])
	if err != nil {
		return 0, fmt.Errorf("flexv3: size of %s: %w", name(f.df.ino), err)
	}
	return int64(a.Size), nil
}

// Allocate extends the data files to off+length (NFSv3 has no
// preallocation).
func (f *file) Allocate(off, length int64) error {
	size, err := f.Size()
	if err != nil {
		return err
	}
	if end := off + length; end > size {
		return f.s.Truncate(f.df.ino, uint64(end))
	}
	return nil
}

// PunchHole is not possible over NFSv3.
func (f *file) PunchHole(off, length int64) error { return errors.ErrUnsupported }

// Seek knows no holes: all data up to the size.
func (f *file) Seek(off int64, whence int) (int64, error) {
	size, err := f.Size()
	if err != nil {
		return 0, err
	}
	switch whence {
	case store.SeekData:
		if off >= size {
			return 0, io.EOF
		}
		return off, nil
	case store.SeekHole:
		return max(off, size), nil
	}
	return 0, fmt.Errorf("flexv3: seek whence %d", whence)
}

func (f *file) Close() error { return nil }

// Device ids of the data servers: "SV3" and the server's index.
func deviceID(i int) [16]byte {
	var id [16]byte
	copy(id[:], "SHOALNFS3")
	binary.BigEndian.PutUint32(id[12:], uint32(i))
	return id
}

func deviceIndex(id [16]byte, n int) (int, bool) {
	if string(id[:9]) != "SHOALNFS3" {
		return 0, false
	}
	i := binary.BigEndian.Uint32(id[12:])
	if int(i) >= n {
		return 0, false
	}
	return int(i), true
}
