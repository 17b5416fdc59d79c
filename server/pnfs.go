package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/server/internal/state"
	"github.com/shoalfs/shoal/store"
)

// DataServers is what a metadata server needs from its cluster of data
// servers (package cluster implements it).
type DataServers interface {
	// Layout returns the files layout of file ino, placing the file's
	// data on the data servers first if it has none. An error wrapping
	// pnfs.ErrUnavailable or pnfs.ErrDataServerDown means the file
	// has no usable layout now (a data server of its stripe map is out of
	// service): clients do their I/O through the MDS.
	Layout(ctx context.Context, ino uint64) (pnfs.FileLayout, error)
	// Device returns the advertised addresses ("host:port", multipath) of
	// a layout's device by stripe index; ok is false for an unknown or
	// outdated device id.
	Device(id [16]byte) (addrs [][]string, ok bool)
	// Devices returns the ids of the devices currently handed out.
	Devices() [][16]byte
	// StripeUnit is the stripe unit of new files (layout_blksize).
	StripeUnit() uint64
	// Fence makes every data server refuse I/O under the state of an MDS
	// client; Unfence undoes it.
	Fence(ctx context.Context, clientID uint64) error
	Unfence(ctx context.Context, clientID uint64) error
	// OnChange registers fn to run after a data server joins or leaves
	// (left).
	OnChange(fn func(left bool)) (cancel func())
}

// PNFSConfig turns a Server into a pNFS metadata server.
type PNFSConfig struct {
	DataServers DataServers
	// Backend stores file data on the data servers, for I/O that clients
	// send to the MDS (clients without pNFS, or falling back).
	Backend store.Backend
}

// pnfsState is the pNFS machinery of a metadata server with data servers.
// A plain server (New without Config.PNFS) has none: its *pnfsState is
// nil, its operation table has no layout operations (plainOps), and the
// methods below that the MDS's shared code calls are the one place that
// answers for a server without layouts, each on a nil receiver.
type pnfsState struct {
	s  *Server
	ds DataServers

	mu       sync.Mutex
	held     map[state.FileID]int    // files whose layouts are held back (HoldLayouts)
	layoutFH map[state.FileID][]byte // filehandle of a file's last LAYOUTGET, for recalls
	fenced   map[state.ClientID]bool
	recalls  map[state.FileID]time.Time // last CB_LAYOUTRECALL sent, to pace resends
	impls    map[state.ClientID]impl    // what clients said they are in EXCHANGE_ID (flexfiles.go)
	granted  atomic.Uint32              // layout types handed out, by meta.Layout bit (layoutpolicy.go)
	cancelOn func()
}

func newPNFS(s *Server, cfg *PNFSConfig) *pnfsState {
	return &pnfsState{s: s, ds: cfg.DataServers, fenced: map[state.ClientID]bool{}, recalls: map[state.FileID]time.Time{},
		held: map[state.FileID]int{}, layoutFH: map[state.FileID][]byte{}, impls: map[state.ClientID]impl{}}
}

// start follows the data servers: those joining or leaving change the
// device, so every layout is recalled for clients to fetch the new one.
func (p *pnfsState) start() {
	if p == nil {
		return
	}
	p.cancelOn = p.ds.OnChange(func(left bool) { go p.s.recallAll(left) })
}

// layoutTypeOf is the layout type export e hands out to files that
// record none of their own (layoutpolicy.go).
func layoutTypeOf(e *Export) nfs4.Layouttype4 {
	if e.flex() {
		return nfs4.LAYOUT4_FLEX_FILES
	}
	return nfs4.LAYOUT4_NFSV4_1_FILES
}

// stripeUnit is the stripe unit of new files, or def without data servers.
func (p *pnfsState) stripeUnit(def uint64) uint64 {
	if p == nil {
		return def
	}
	return p.ds.StripeUnit()
}

// writeLayouts reports whether a client holds a read-write layout of file
// ino, and so may have written past the size the MDS knows.
func (p *pnfsState) writeLayouts(ino meta.Ino) bool {
	if p == nil {
		return false
	}
	return p.s.st.m.HasWriteLayouts(state.FileID(ino))
}

// fencedClients returns the clients the data servers refuse (a copy).
func (p *pnfsState) fencedClients() map[state.ClientID]bool {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.fenced)
}

// maxLayoutFHs bounds pnfsState.layoutFH.
const maxLayoutFHs = 1 << 16

// noteLayoutFH remembers the filehandle a client named file by in
// LAYOUTGET: a recall must name the file the way the client knows it.
func (p *pnfsState) noteLayoutFH(file state.FileID, fh []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.layoutFH) >= maxLayoutFHs {
		clear(p.layoutFH)
	}
	p.layoutFH[file] = fh
}

// layoutHeld reports whether file's layouts are held back.
func (p *pnfsState) layoutHeld(file state.FileID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held[file] > 0
}

// HoldLayouts recalls every layout of file ino and makes LAYOUTGET of it
// answer NFS4ERR_LAYOUTTRYLATER until release is called, so that the
// file's data can move between data servers while clients do their I/O
// through the MDS. It returns once no client holds a layout of the file
// (clients that do not return theirs within a lease are revoked and
// fenced, as for any recall), or with ctx's error after releasing.
func (s *Server) HoldLayouts(ctx context.Context, ino uint64) (release func(), err error) {
	return s.pnfs.hold(ctx, ino)
}

func (p *pnfsState) hold(ctx context.Context, ino uint64) (release func(), err error) {
	if p == nil {
		return func() {}, nil
	}
	s, file := p.s, state.FileID(ino)
	p.mu.Lock()
	p.held[file]++
	fh := p.layoutFH[file]
	p.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.held[file]--; p.held[file] <= 0 {
				delete(p.held, file)
			}
		})
	}
	if fh == nil {
		fh = s.fh.encode(fhandle{kind: fhObject, ino: meta.Ino(ino)})
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !p.recallFile(ino, fh) {
		select {
		case <-ctx.Done():
			release()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	return release, nil
}

// RecallLayouts recalls every layout of file ino without waiting for them
// to come back: the file's stripe map changed (a copy went stale, healing
// replaced a member), and clients must get layouts naming the current
// members. Holders that do not return theirs within a lease are revoked
// and fenced as for any recall.
func (s *Server) RecallLayouts(ino uint64) { s.pnfs.recall(ino) }

func (p *pnfsState) recall(ino uint64) {
	if p == nil {
		return
	}
	file := state.FileID(ino)
	p.mu.Lock()
	fh := p.layoutFH[file]
	p.mu.Unlock()
	if fh == nil {
		fh = p.s.fh.encode(fhandle{kind: fhObject, ino: meta.Ino(ino)})
	}
	p.recallFile(ino, fh)
}

// uaddr formats host:port as an RFC 5665 universal address.
func uaddr(hostport string) (netid, addr string, err error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", "", fmt.Errorf("bad port in %q", hostport)
	}
	ip := net.ParseIP(host)
	netid = "tcp"
	if ip != nil && ip.To4() == nil {
		netid = "tcp6"
	}
	return netid, fmt.Sprintf("%s.%d.%d", host, p>>8, p&0xff), nil
}

// fence makes the data servers refuse a client whose layouts were revoked.
func (p *pnfsState) fence(id state.ClientID) {
	if p == nil {
		return // no layouts to revoke
	}
	s := p.s
	p.mu.Lock()
	already := p.fenced[id]
	p.fenced[id] = true
	p.mu.Unlock()
	if already {
		return
	}
	s.counters.fences.Add(1)
	s.event(Event{Kind: EventFence, ClientID: uint64(id)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.ds.Fence(ctx, uint64(id)); err != nil {
		s.log.Warn("fence client at data servers", "clientid", fmt.Sprintf("%#x", uint64(id)), "err", err)
	}
}

// unfence lets a fenced client use the data servers again, once it asks for
// a new layout.
func (p *pnfsState) unfence(id state.ClientID) {
	s := p.s
	p.mu.Lock()
	was := p.fenced[id]
	delete(p.fenced, id)
	p.mu.Unlock()
	if !was {
		return
	}
	s.event(Event{Kind: EventUnfence, ClientID: uint64(id)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.ds.Unfence(ctx, uint64(id)); err != nil {
		s.log.Warn("unfence client at data servers", "clientid", fmt.Sprintf("%#x", uint64(id)), "err", err)
	}
}

// CheckDataIO answers a data server's question whether an open or lock
// stateid allows I/O on a file, and which MDS client owns it. Its errors
// are the stateid verdicts of package pnfs (pnfs.ErrBadStateid,
// ErrOldStateid, ErrStaleStateid, ErrExpired, ErrOpenMode, ErrFenced), the
// one vocabulary both ends of the control protocol use; the state manager
// returns most of them itself, and verdict turns its other reasons into
// them.
func (s *Server) CheckDataIO(ctx context.Context, ino uint64, sid [16]byte, write bool) (uint64, error) {
	st := state.Stateid{Seqid: binary.BigEndian.Uint32(sid[:4])}
	copy(st.Other[:], sid[4:])
	id, err := s.st.m.CheckIOAny(st, state.FileID(ino), write)
	if err != nil {
		return 0, verdict(err)
	}
	s.pnfs.mu.Lock()
	fenced := s.pnfs.fenced[id]
	s.pnfs.mu.Unlock()
	if fenced {
		return uint64(id), fmt.Errorf("%w after layout revocation", pnfs.ErrFenced)
	}
	return uint64(id), nil
}

// verdict turns the state manager's refusal of a data-server I/O into a
// stateid verdict of package pnfs. The state manager's ErrBadStateid,
// ErrOldStateid, ErrStaleStateid, ErrExpired and ErrOpenMode are pnfs's
// already and pass through; the reasons the control protocol has no code
// for become the nearest verdict.
func verdict(err error) error {
	for _, v := range []error{pnfs.ErrBadStateid, pnfs.ErrOldStateid, pnfs.ErrStaleStateid,
		pnfs.ErrExpired, pnfs.ErrOpenMode} {
		if errors.Is(err, v) {
			return err
		}
	}
	for _, m := range []struct{ from, to error }{
		{state.ErrLocked, pnfs.ErrOpenMode},
		// The client learns the reason from TEST_STATEID at the MDS.
		{state.ErrDelegRevoked, pnfs.ErrBadStateid},
	} {
		if errors.Is(err, m.from) {
			return fmt.Errorf("%w: %v", m.to, err)
		}
	}
	return err
}

// ClusterSecret is the MDS's master filehandle secret. Never hand it to a
// data server: they get DataFHKey, which makes data filehandles only.
func (s *Server) ClusterSecret() []byte { return s.fh.secret }

// FileSize is the size of file ino as the metadata server knows it, for a
// data server deciding where a file ends (cluster FILE_SIZE).
func (s *Server) FileSize(ctx context.Context, ino uint64) (uint64, error) {
	a, err := s.meta.GetAttr(ctx, meta.Ino(ino))
	if err != nil {
		return 0, err
	}
	return a.Size, nil
}

// recallFile sends CB_LAYOUTRECALL for file to every holder and reports
// whether the layouts are gone. Callers of conflicting operations answer
// NFS4ERR_DELAY while it returns false; clients that do not return their
// layouts within a lease are revoked and fenced by the state manager.
func (p *pnfsState) recallFile(ino uint64, fh []byte) bool {
	if p == nil {
		return true // no layouts
	}
	s, file := p.s, state.FileID(ino)
	if s.st.m.Recalled(file) {
		return true
	}
	p.mu.Lock()
	last, seen := p.recalls[file]
	resend := !seen || time.Since(last) > time.Second
	if resend {
		p.recalls[file] = time.Now()
	}
	p.mu.Unlock()
	holders := s.st.m.BeginRecall(file)
	for _, h := range holders {
		// A layout granted since the last CB_LAYOUTRECALL (New) is
		// recalled now whatever the resend pacing: no callback has
		// named it, and its holder would never learn it must return it.
		if resend || h.New {
			s.event(Event{Kind: EventLayoutRecall, ClientID: uint64(h.ClientID), Ino: ino})
			go s.sendLayoutRecall(h, file, fh)
		}
	}
	return false
}

// recallWait bounds how long an operation that needs a file's layouts
// gone (a REMOVE of its last link, a truncate) waits after recalling them
// before it answers NFS4ERR_DELAY. A client gives back a layout it is not
// using within a callback round trip or two, while Linux waits 100 ms or
// more before it retries an operation answered NFS4ERR_DELAY: an `rm -r`
// of files the client had just read took 100 ms per file.
const recallWait = 100 * time.Millisecond

// recallAndWait is recallFile for an operation of c: it waits up to
// recallWait for the holders to give the layouts back and reports
// whether they did.
func (c *compound) recallAndWait(ino meta.Ino, fh []byte) bool {
	s := c.s
	if s.pnfs.recallFile(uint64(ino), fh) {
		return true
	}
	t := time.NewTimer(recallWait)
	defer t.Stop()
	select {
	case <-s.st.m.LayoutsGone(state.FileID(ino)):
		return true
	case <-t.C:
	case <-c.ctx.Done():
	}
	return false
}

func (s *Server) sendLayoutRecall(h state.LayoutHolder, file state.FileID, fh []byte) {
	status := s.sendRecallOf(s.recallType(fh), h, nfs4.Layoutrecall4{
		LorRecalltype: nfs4.LAYOUTRECALL4_FILE,
		LorLayout: &nfs4.LayoutrecallFile4{
			LorFh:      fh,
			LorOffset:  0,
			LorLength:  ^uint64(0),
			LorStateid: fromState(h.Stateid),
		},
	}, true)
	if status == nfs4.NFS4ERR_NOMATCHING_LAYOUT {
		// The client has no layout for the file: nothing to wait for.
		s.st.m.RecallNoMatch(h.ClientID, file)
	}
}

// recallType is the layout type of the file a recall names by fh: the
// file's own (layoutpolicy.go).
func (s *Server) recallType(fh []byte) nfs4.Layouttype4 {
	if h, err := s.fh.decode(fh); err == nil && h.kind == fhObject {
		t, err := s.layoutTypeOfFile(s.st.ctx, s.ns.byID[h.export], h.ino)
		if err != nil {
			s.log.Warn("the layout type of a recalled file is unknown: using its export's", "ino", h.ino, "err", err)
		}
		return t
	}
	return nfs4.LAYOUT4_NFSV4_1_FILES
}

// sendRecallOf is sendRecall for layouts of type typ.
func (s *Server) sendRecallOf(typ nfs4.Layouttype4, h state.LayoutHolder, recall nfs4.Layoutrecall4, changed bool) nfs4.Nfsstat4 {
	ctx, cancel := context.WithTimeout(s.st.ctx, 15*time.Second)
	defer cancel()
	op := nfs4.NfsCbArgop4{
		Argop: nfs4.OP_CB_LAYOUTRECALL,
		Opcblayoutrecall: &nfs4.CBLAYOUTRECALL4args{
			CloraType:    typ,
			CloraIomode:  nfs4.LAYOUTIOMODE4_ANY,
			CloraChanged: changed,
			CloraRecall:  recall,
		},
	}
	for _, sid := range h.Sessions {
		s.counters.recalls.Add(1)
		res, err := s.callback(ctx, sid, op)
		if err != nil {
			s.log.Debug("CB_LAYOUTRECALL", "session", sid.String(), "err", err)
			continue
		}
		if len(res) == 1 && res[0].Opcblayoutrecall != nil {
			return res[0].Opcblayoutrecall.ClorrStatus
		}
		return nfs4.NFS4_OK
	}
	return nfs4.NFS4ERR_DELAY
}

// recallAll recalls every layout (a data server joined or left, so the
// device list changed), one CB_LAYOUTRECALL per file and holder.
//
// Not one LAYOUTRECALL4_ALL per client: Linux (6.1 and 7.2 alike)
// answers that only once it has drained every layout it holds, and a
// layout with READs in flight to the data server that just died does not
// drain until those give up. Meanwhile every LAYOUTGET is refused with
// NFS4ERR_RECALLCONFLICT, and the client backs off further each time, so
// a diskless node booting from the cluster stalled for a lease plus that
// back-off (25-35 s with a 15 s lease; docs/diskless.md). A recall of
// one file Linux answers at once (NOMATCHING_LAYOUT for a layout it drops,
// or it returns the layout once that file's I/O is done), and the other
// files' layouts are not held up.
//
// When a data server left (left), the layouts of files on exports with a
// flex_recall_delay are recalled that much later (Export.FlexRecallDelay),
// so that their clients' own error reports arrive first.
func (s *Server) recallAll(left bool) {
	later := map[time.Duration][]state.FileID{}
	for _, f := range s.st.m.FilesWithLayouts() {
		if d := s.pnfs.leaveRecallDelay(f); left && d > 0 {
			later[d] = append(later[d], f)
			continue
		}
		s.pnfs.recall(uint64(f))
	}
	for d, files := range later {
		go func() {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-s.st.ctx.Done():
				return
			case <-t.C:
			}
			for _, f := range files {
				s.pnfs.recall(uint64(f))
			}
		}()
	}
}

// leaveRecallDelay is the flex_recall_delay of the export of file f (by
// the filehandle of its last LAYOUTGET), or 0.
func (p *pnfsState) leaveRecallDelay(f state.FileID) time.Duration {
	p.mu.Lock()
	fh := p.layoutFH[f]
	p.mu.Unlock()
	if fh == nil {
		return 0
	}
	h, err := p.s.fh.decode(fh)
	if err != nil || h.kind != fhObject {
		return 0
	}
	if e := p.s.ns.byID[h.export]; e.flex() {
		return e.FlexRecallDelay
	}
	return 0
}
