package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
)

// Moving a file's data between data servers (drain, rebalance).
//
// Move never lets a reader see a mixture or a hole: the file's layouts are
// recalled and held back first (clients then do their I/O through the
// MDS), the file's I/O through the MDS waits on its shard lock, the stripe
// units whose data server changes are copied and committed, read back and
// compared, and only then does the stripe map switch, in one metadata
// transaction that fails if the map changed meanwhile. Data left on data
// servers that are no longer in the map is removed last; if the MDS dies
// before that, the leftovers are unreferenced objects, never wrong bytes.

// HoldFunc recalls every layout of file ino and keeps new ones from being
// granted until release is called (server.Server.HoldLayouts).
type HoldFunc func(ctx context.Context, ino uint64) (release func(), err error)

// MoveStats says what one Move copied.
type MoveStats struct {
	Bytes int64 // bytes copied (and verified)
}

// Move changes file ino's stripe map from old to the data servers ids,
// with stripe unit 0 on ids[first], copying whatever has to move. hold
// may be nil when no client can hold layouts (tests of the MDS alone).
// It fails with meta.ErrConflict if the map is no longer old.
func (s *Striped) Move(ctx context.Context, ino uint64, old meta.StripeMap, ids []string, first uint32, hold HoldFunc) (MoveStats, error) {
	var st MoveStats
	nm := meta.StripeMap{Unit: old.Unit, First: first, DataServers: slices.Clone(ids)}
	if nm.Equal(old) {
		return st, nil
	}
	if hold != nil {
		release, err := hold(ctx, ino)
		if err != nil {
			return st, fmt.Errorf("cluster: move ino %d: recalling layouts: %w", ino, err)
		}
		defer release()
	}
	l := &s.moving[ino%uint64(len(s.moving))]
	l.Lock()
	defer l.Unlock()
	cur, err := s.maps.StripeMap(ctx, meta.Ino(ino))
	if err != nil {
		return st, fmt.Errorf("cluster: move ino %d: %w", ino, err)
	}
	if cur.Gen != old.Gen {
		return st, fmt.Errorf("cluster: move ino %d: map is at generation %d, not %d: %w", ino, cur.Gen, old.Gen, meta.ErrConflict)
	}
	// Writes made through the MDS must be durable where they are before
	// they are copied.
	if err := s.Sync(ino); err != nil {
		return st, fmt.Errorf("cluster: move ino %d: %w", ino, err)
	}
	size, err := objectsSize(ctx, s.r, ino, old.DataServers, nil)
	if err != nil {
		return st, fmt.Errorf("cluster: move ino %d: %w", ino, err)
	}
	type chunk struct {
		off      uint64
		n        int
		src, dst string
		sum      [32]byte
	}
	var chunks []chunk
	step := min(old.Unit, maxIO)
	for off := uint64(0); off < size; {
		end := min((off/old.Unit+1)*old.Unit, off+step, size)
		src, dst := dsFor(old, off), dsFor(nm, off)
		if src != dst {
			chunks = append(chunks, chunk{off: off, n: int(end - off), src: src, dst: dst})
		}
		off = end
	}
	bufs := sync.Pool{New: func() any { b := make([]byte, step); return &b }}
	var mu sync.Mutex
	written := map[string]bool{}
	err = parallel(len(chunks), func(i int) error {
		c := &chunks[i]
		bp := bufs.Get().(*[]byte)
		defer bufs.Put(bp)
		buf := (*bp)[:c.n]
		if _, err := readObj(ctx, s.r, ino, c.src, c.off, buf); err != nil {
			return err
		}
		c.sum = sha256.Sum256(buf)
		if err := writeObj(ctx, s.r, ino, c.dst, c.off, buf, false, s.noteWrite); err != nil {
			return err
		}
		mu.Lock()
		written[c.dst] = true
		mu.Unlock()
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("cluster: move ino %d: copying: %w", ino, err)
	}
	dsts := make([]string, 0, len(written))
	for id := range written {
		dsts = append(dsts, id)
	}
	if err := parallel(len(dsts), func(i int) error { return s.commit(ctx, ino, dsts[i]) }); err != nil {
		return st, fmt.Errorf("cluster: move ino %d: committing copies: %w", ino, err)
	}
	err = parallel(len(chunks), func(i int) error {
		c := &chunks[i]
		bp := bufs.Get().(*[]byte)
		defer bufs.Put(bp)
		buf := (*bp)[:c.n]
		if _, err := readObj(ctx, s.r, ino, c.dst, c.off, buf); err != nil {
			return err
		}
		if sum := sha256.Sum256(buf); !bytes.Equal(sum[:], c.sum[:]) {
			return fmt.Errorf("copy of %d bytes at %d on %s does not match its source on %s", c.n, c.off, c.dst, c.src)
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("cluster: move ino %d: verifying: %w", ino, err)
	}
	for _, c := range chunks {
		st.Bytes += int64(c.n)
	}
	got, err := s.maps.ReplaceStripeMap(ctx, meta.Ino(ino), old.Gen, nm)
	if err != nil {
		return st, fmt.Errorf("cluster: move ino %d: switching its map: %w", ino, err)
	}
	s.forget(ino)
	s.remember(ino, got)
	var gone []string
	for _, id := range old.DataServers {
		if !nm.Holds(id) && !slices.Contains(gone, id) {
			gone = append(gone, id)
		}
	}
	err = parallel(len(gone), func(i int) error {
		conn, err := s.r.conn(gone[i])
		if err == nil {
			err = objRemove(ctx, conn, ino)
		}
		return err
	})
	// Units that left a data server which stays in the map are freed
	// there too, so the move leaves no second copy behind.
	var stay []chunk
	for _, c := range chunks {
		if nm.Holds(c.src) {
			stay = append(stay, c)
		}
	}
	err = errors.Join(err, parallel(len(stay), func(i int) error {
		conn, err := s.r.conn(stay[i].src)
		if err == nil {
			err = objPunch(ctx, conn, ino, stay[i].off, uint64(stay[i].n))
		}
		return err
	}))
	if err != nil {
		// The map no longer names them: what is left there is garbage,
		// not data anyone can read.
		return st, fmt.Errorf("cluster: move ino %d: removing old copies: %w", ino, errors.Join(err, errLeftover))
	}
	return st, nil
}

// errLeftover marks a Move whose map switched but whose old objects were
// not all removed.
var errLeftover = errors.New("cluster: old objects left behind")

func objPunch(ctx context.Context, conn *rpc.Conn, ino, off, length uint64) error {
	var res ctlproto.CtlStatusRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_PUNCH, &ctlproto.CtlPunchArgs{Ino: ino, Offset: off, Length: length}, &res); err != nil {
		return err
	}
	return errOf(res.Status)
}
