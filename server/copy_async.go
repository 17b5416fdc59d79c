package server

import (
	"context"
	"crypto/rand"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/server/internal/state"
)

// Asynchronous COPY (RFC 7862 §15.2.3, §15.8, §15.9, §16.1): a client
// that sets ca_synchronous false gets a reply at once, naming the copy by
// a copy stateid (wr_callback_id); the copy runs in the background, and
// CB_OFFLOAD on the COPY's session reports its outcome. OFFLOAD_STATUS
// reports its progress, OFFLOAD_CANCEL stops it.
//
// Copies shorter than asyncCopies.min are done synchronously all the
// same, as §15.2.3 allows (the reply's cr_synchronous says so): most
// copies take less time than the round trips of an asynchronous one, and
// a copy the data servers or the kernel do is fast. At most
// maxAsyncCopies copies are known at once (running, waiting for one of
// the asyncCopyWorkers, or finished and kept for OFFLOAD_STATUS for
// asyncCopyKeep); past that COPY is synchronous again. A copy stops when
// it is cancelled, when its session is gone (the client expired or
// destroyed it), or when the server closes; its record is dropped
// asyncCopyKeep after it ends.

const (
	// defaultAsyncCopyMin is asyncCopies.min unless a test changes it.
	defaultAsyncCopyMin = 256 << 20
	maxAsyncCopies      = 64
	asyncCopyWorkers    = 2
	// asyncCopyChunk is the part of a copy done between progress updates
	// and checks for cancellation.
	asyncCopyChunk = 64 << 20
	asyncCopyKeep  = 2 * time.Minute
)

type asyncCopies struct {
	once sync.Once
	min  uint64
	sem  chan struct{}
	wg   sync.WaitGroup

	mu   sync.Mutex
	byID map[[12]byte]*asyncCopy
}

func (a *asyncCopies) init() {
	a.once.Do(func() {
		if a.min == 0 {
			a.min = defaultAsyncCopyMin
		}
		a.sem = make(chan struct{}, asyncCopyWorkers)
		a.byID = map[[12]byte]*asyncCopy{}
	})
}

// wait waits for the copies running to stop (after the server's context
// is cancelled).
func (a *asyncCopies) wait() { a.wg.Wait() }

// asyncCopy is one asynchronous copy.
type asyncCopy struct {
	sid     nfs4.Stateid4
	client  state.ClientID
	session state.SessionID
	dstFH   []byte
	total   uint64
	copied  atomic.Uint64
	cancel  context.CancelFunc

	mu       sync.Mutex
	finished bool
	status   nfs4.Nfsstat4
}

func (r *asyncCopy) result() (done bool, st nfs4.Nfsstat4) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.finished, r.status
}

// startCopy starts an asynchronous copy of n bytes and returns its
// stateid; ok is false when too many copies are known (the caller copies
// synchronously).
func (c *compound) startCopy(src *object, dst *object, srcOff, dstOff, n uint64) (nfs4.Stateid4, bool) {
	s := c.s
	a := &s.copies
	a.init()
	r := &asyncCopy{client: c.seq.clientID, session: c.seq.session.ID(), dstFH: s.fh.encode(dst.fh), total: n}
	r.sid.Seqid = 1
	rand.Read(r.sid.Other[:])
	ctx, cancel := context.WithCancel(s.st.ctx)
	r.cancel = cancel
	a.mu.Lock()
	if len(a.byID) >= maxAsyncCopies {
		a.mu.Unlock()
		cancel()
		return nfs4.Stateid4{}, false
	}
	a.byID[r.sid.Other] = r
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer cancel()
		st := s.runCopy(ctx, r, src, dst, srcOff, dstOff)
		r.mu.Lock()
		r.finished, r.status = true, st
		r.mu.Unlock()
		if ctx.Err() == nil {
			s.sendOffload(r, st)
		}
		time.AfterFunc(asyncCopyKeep, func() {
			a.mu.Lock()
			delete(a.byID, r.sid.Other)
			a.mu.Unlock()
		})
	}()
	return r.sid, true
}

// runCopy does the copy of r in chunks, once a worker is free.
func (s *Server) runCopy(ctx context.Context, r *asyncCopy, src, dst *object, srcOff, dstOff uint64) nfs4.Nfsstat4 {
	a := &s.copies
	select {
	case a.sem <- struct{}{}:
		defer func() { <-a.sem }()
	case <-ctx.Done():
		return nfs4.NFS4ERR_DELAY
	}
	for done := uint64(0); done < r.total; {
		if ctx.Err() != nil {
			return nfs4.NFS4ERR_DELAY
		}
		if _, err := s.st.m.Session(r.session); err != nil {
			r.cancel() // the client is gone: so is the copy
			return nfs4.NFS4ERR_BADSESSION
		}
		k := min(asyncCopyChunk, r.total-done)
		if err := s.copyFile(ctx, src.fh.ino, dst, srcOff+done, dstOff+done, k, k); err != nil {
			return statusOf(err)
		}
		done += k
		r.copied.Store(done)
	}
	return nfs4.NFS4_OK
}

// sendOffload reports the end of copy r to its client (CB_OFFLOAD).
func (s *Server) sendOffload(r *asyncCopy, st nfs4.Nfsstat4) {
	info := nfs4.OffloadInfo4{CoaStatus: st}
	if st == nfs4.NFS4_OK {
		info.CoaResok4 = &nfs4.WriteResponse4{WrCount: r.total, WrCommitted: nfs4.FILE_SYNC4, WrWriteverf: s.verifier()}
	} else {
		n := r.copied.Load()
		info.CoaBytesCopied = &n
	}
	ctx, cancel := context.WithTimeout(s.st.ctx, 15*time.Second)
	defer cancel()
	_, err := s.callback(ctx, r.session, nfs4.NfsCbArgop4{Argop: nfs4.OP_CB_OFFLOAD,
		Opcboffload: &nfs4.CBOFFLOAD4args{CoaFh: r.dstFH, CoaStateid: r.sid, CoaOffloadInfo: info}})
	if err != nil {
		// The client can still ask OFFLOAD_STATUS.
		s.log.Debug("CB_OFFLOAD", "session", r.session.String(), "err", err)
	}
}

// lookupCopy returns the copy named by sid, if this client started it.
func (c *compound) lookupCopy(sid nfs4.Stateid4) (*asyncCopy, nfs4.Nfsstat4) {
	a := &c.s.copies
	a.init()
	a.mu.Lock()
	r := a.byID[sid.Other]
	a.mu.Unlock()
	if r == nil || c.seq == nil || r.client != c.seq.clientID {
		return nil, nfs4.NFS4ERR_BAD_STATEID
	}
	return r, nfs4.NFS4_OK
}

// offloadStatus is OFFLOAD_STATUS (RFC 7862 §15.9): the bytes a copy has
// copied so far, and its status once it ended.
func (c *compound) offloadStatus(a *nfs4.OFFLOADSTATUS4args) opReply {
	if _, st := c.currentFile(); st != nfs4.NFS4_OK {
		return fail(st)
	}
	r, st := c.lookupCopy(a.OsaStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	res := &nfs4.OFFLOADSTATUS4resok{OsrCount: r.copied.Load()}
	if done, st := r.result(); done {
		res.OsrComplete = []nfs4.Nfsstat4{st}
	}
	return ok(res)
}

// offloadCancel is OFFLOAD_CANCEL (RFC 7862 §15.8): the copy stops (what
// it copied so far stays), and no CB_OFFLOAD follows.
func (c *compound) offloadCancel(a *nfs4.OFFLOADCANCEL4args) opReply {
	if _, st := c.currentFile(); st != nfs4.NFS4_OK {
		return fail(st)
	}
	r, st := c.lookupCopy(a.OcaStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if done, _ := r.result(); done {
		return fail(nfs4.NFS4ERR_COMPLETE_ALREADY)
	}
	r.cancel()
	return ok(nil)
}

// minAsync is the smallest copy done asynchronously when asked.
func (a *asyncCopies) minAsync() uint64 {
	a.init()
	return a.min
}
