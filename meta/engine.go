package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"
)

// maxReadDir bounds one ReadDir transaction.
const maxReadDir = 4096

// kvEngine implements Engine on any kvStore.
type kvEngine struct {
	kv     kvStore
	closed atomic.Bool
	// cache serves hot GetAttr and Lookup calls; nil for stores that
	// others write too (readCache).
	cache *readCache
}

var _ Engine = (*kvEngine)(nil)

func newKVEngine(kv kvStore) *kvEngine { return &kvEngine{kv: kv} }

// tx wraps a kvTxn with an inode cache so that an operation touching the
// same inode twice (a rename within one directory) sees its own updates and
// writes each inode once.
//
// Most transactions touch one to three inodes, so the cache is a slice
// searched in order, in arrays inside tx, indexed by a map only once it
// grows past txIndexAt (ReadDirPlus loading a directory's attributes):
// three maps per transaction were about a tenth of the MDS's allocations
// per small-file operation (server.BenchmarkSmallFileOps).
type tx struct {
	t     kvTxn
	nodes []txNode    // cached inodes, in the order first cached
	index map[Ino]int // position in nodes; nil until len(nodes) > txIndexAt
	names []txName    // entries linked or unlinked, in order (for readCache)
	nbuf  [4]txNode   // nodes' first backing array
	kbuf  [2]txName   // names' first backing array
	// freed counts the inodes deleteInode deleted, taken off the file
	// counter once, at flush: FreeOrphans frees up to 64 in one
	// transaction, which read and rewrote the counter for each.
	freed int64
}

// txName is an entry a transaction linked (to ino) or unlinked (ino 0).
type txName struct {
	key nameKey
	ino Ino
}

// txNode is an inode cached in a transaction: nil once deleted, dirty if
// it must be written back (flush).
type txNode struct {
	ino   Ino
	n     *inode
	dirty bool
}

// txIndexAt is how many cached inodes a transaction searches in order
// before it indexes them.
const txIndexAt = 16

func newTx(t kvTxn) *tx {
	x := &tx{t: t}
	x.nodes, x.names = x.nbuf[:0], x.kbuf[:0]
	return x
}

// find returns the position of ino in x.nodes, or -1.
func (x *tx) find(ino Ino) int {
	if x.index != nil {
		if i, ok := x.index[ino]; ok {
			return i
		}
		return -1
	}
	for i := range x.nodes {
		if x.nodes[i].ino == ino {
			return i
		}
	}
	return -1
}

// cached returns ino's cached inode (nil if deleted) and whether it is
// cached at all.
func (x *tx) cached(ino Ino) (*inode, bool) {
	if i := x.find(ino); i >= 0 {
		return x.nodes[i].n, true
	}
	return nil, false
}

// setNode caches n as ino's inode, dirty or not.
func (x *tx) setNode(ino Ino, n *inode, dirty bool) {
	if i := x.find(ino); i >= 0 {
		x.nodes[i].n, x.nodes[i].dirty = n, dirty
		return
	}
	x.nodes = append(x.nodes, txNode{ino: ino, n: n, dirty: dirty})
	switch {
	case x.index != nil:
		x.index[ino] = len(x.nodes) - 1
	case len(x.nodes) > txIndexAt:
		x.index = make(map[Ino]int, 2*len(x.nodes))
		for i, c := range x.nodes {
			x.index[c.ino] = i
		}
	}
}

// markDirty marks ino, whose cached inode is n, to be written back.
func (x *tx) markDirty(ino Ino, n *inode) { x.setNode(ino, n, true) }

// addName records that the entry name in dir was linked to ino, or
// unlinked (ino 0).
func (x *tx) addName(dir Ino, name string, ino Ino) {
	x.names = append(x.names, txName{nameKey{dir, name}, ino})
}

func (x *tx) inode(ino Ino) (*inode, error) {
	if n, ok := x.cached(ino); ok {
		if n == nil {
			return nil, fmt.Errorf("inode %d: %w", ino, ErrStale)
		}
		return n, nil
	}
	v, err := x.t.Get(inodeKey(ino))
	if err != nil {
		return nil, err
	}
	return x.decoded(ino, v)
}

// decoded decodes v, the stored record of ino (nil if absent), and caches
// the inode in the transaction when it decodes.
func (x *tx) decoded(ino Ino, v []byte) (*inode, error) {
	if v == nil {
		return nil, fmt.Errorf("inode %d: %w", ino, ErrStale)
	}
	n, err := decodeInode(v)
	if err != nil {
		return nil, fmt.Errorf("inode %d: %w", ino, err)
	}
	x.setNode(ino, n, false)
	return n, nil
}

// inodes is inode for each of inos, reading the ones not cached in one
// batch. Its error is the one a loop of inode calls would return first.
func (x *tx) inodes(inos []Ino) ([]*inode, error) {
	if _, ok := x.t.(kvBatchGetter); !ok {
		// Gets are cheap here: skip the bookkeeping of a batch.
		out := make([]*inode, len(inos))
		for i, ino := range inos {
			n, err := x.inode(ino)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	}
	var keys [][]byte
	var miss []Ino
	seen := map[Ino]bool{}
	for _, ino := range inos {
		if x.find(ino) < 0 && !seen[ino] {
			seen[ino] = true
			keys = append(keys, inodeKey(ino))
			miss = append(miss, ino)
		}
	}
	vals, err := getMany(x.t, keys)
	if err != nil {
		return nil, err
	}
	// Decode lazily, in inos order, so that the first failing inode is
	// reported; only successfully decoded ones are cached, as inode does.
	fetched := make(map[Ino][]byte, len(miss))
	for i, ino := range miss {
		fetched[ino] = vals[i]
	}
	out := make([]*inode, len(inos))
	for i, ino := range inos {
		if v, ok := fetched[ino]; ok {
			delete(fetched, ino)
			if _, err := x.decoded(ino, v); err != nil {
				return nil, err
			}
		}
		n, err := x.inode(ino) // cached now, or cached before (possibly as deleted)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

func (x *tx) dir(ino Ino) (*inode, error) {
	n, err := x.inode(ino)
	if err != nil {
		return nil, err
	}
	if n.Type != TypeDirectory {
		return nil, fmt.Errorf("inode %d: %w", ino, ErrNotDir)
	}
	return n, nil
}

// touch marks n modified: change bumped, ctime (and mtime if mtime) = now.
func (x *tx) touch(ino Ino, n *inode, now time.Time, mtime bool) {
	n.Change++
	n.Ctime = now
	if mtime {
		n.Mtime = now
	}
	x.markDirty(ino, n)
}

func (x *tx) deleteInode(ino Ino, n *inode) error {
	x.setNode(ino, nil, false)
	if err := x.t.Delete(inodeKey(ino)); err != nil {
		return err
	}
	switch n.Type {
	case TypeSymlink:
		if err := x.t.Delete(symlinkKey(ino)); err != nil {
			return err
		}
	case TypeRegular:
		// The stripe map and inline data go with the inode: the caller deletes the data
		// it named (Engine.FreeOrphan).
		if err := x.t.Delete(stripeKey(ino)); err != nil {
			return err
		}
		if err := x.t.Delete(inlineKey(ino)); err != nil {
			return err
		}
	}
	if inherits(n.Type) {
		if err := x.t.Delete(policyKey(ino)); err != nil {
			return err
		}
	}
	if err := x.t.Delete(xattrKey(ino)); err != nil {
		return err
	}
	x.freed++
	return nil
}

func (x *tx) flush() error {
	if x.freed != 0 {
		if err := x.addCounter(keyFiles, -x.freed); err != nil {
			return err
		}
		x.freed = 0
	}
	for _, c := range x.nodes {
		if !c.dirty {
			continue
		}
		if err := x.t.Put(inodeKey(c.ino), c.n.encode()); err != nil {
			return err
		}
	}
	return nil
}

func (x *tx) counter(key []byte) (uint64, error) {
	v, err := x.t.Get(key)
	if err != nil || v == nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("meta: corrupt counter %q", key)
	}
	return be.Uint64(v), nil
}

func (x *tx) addCounter(key []byte, d int64) error {
	c, err := x.counter(key)
	if err != nil {
		return err
	}
	return x.t.Put(key, be.AppendUint64(nil, uint64(int64(c)+d)))
}

func (x *tx) lookup(parent Ino, name string) (dentry, bool, error) {
	v, err := x.t.Get(dentryKey(parent, name))
	if err != nil || v == nil {
		return dentry{}, false, err
	}
	d, err := decodeDentry(v)
	return d, err == nil, err
}

// addEntry links name in dir to ino under a fresh readdir sequence number.
func (x *tx) addEntry(dirIno Ino, dir *inode, name string, ino Ino, typ FileType) error {
	if dir.nextSeq < FirstCookie {
		dir.nextSeq = FirstCookie
	}
	seq := dir.nextSeq
	dir.nextSeq++
	x.markDirty(dirIno, dir)
	x.addName(dirIno, name, ino)
	if err := x.t.Put(dentryKey(dirIno, name), dentry{ino: ino, typ: typ, seq: seq}.encode()); err != nil {
		return err
	}
	return x.t.Put(seqKey(dirIno, seq), []byte(name))
}

func (x *tx) delEntry(dirIno Ino, name string, d dentry) error {
	x.addName(dirIno, name, 0)
	if err := x.t.Delete(dentryKey(dirIno, name)); err != nil {
		return err
	}
	return x.t.Delete(seqKey(dirIno, d.seq))
}

func (x *tx) isEmpty(dir Ino) (bool, error) {
	empty := true
	err := x.t.Scan(dentryPrefix(dir), nil, func(k, v []byte) bool {
		empty = false
		return false
	})
	return empty, err
}

func validName(name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("%q: %w", name[:32]+"...", ErrNameTooLong)
	}
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("name %q: %w", name, ErrInval)
	}
	return nil
}

func nowOr(now time.Time) time.Time {
	if now.IsZero() {
		return time.Now()
	}
	return now
}

func (e *kvEngine) check(ctx context.Context) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if ctx != nil {
		return ctx.Err()
	}
	return nil
}

func (e *kvEngine) update(ctx context.Context, fn func(x *tx) error) error {
	if err := e.check(ctx); err != nil {
		return err
	}
	// The read cache forgets what the transaction touched before it
	// commits and again after (readCache). Stores may run fn more than
	// once (bbolt's group commit replays it); the cache counts the
	// update once.
	var (
		last      *tx    // the transaction the cache counts as begun, if any
		seq       uint64 // what begin returned for it
		committed bool
	)
	defer func() {
		if last != nil {
			e.cache.end(last, seq, committed)
		}
	}()
	run := func(t kvTxn) error {
		x := newTx(t)
		if err := fn(x); err != nil {
			return err
		}
		if last != nil {
			e.cache.end(last, seq, false)
		}
		last = x
		seq = e.cache.begin(x)
		return x.flush()
	}
	var err error
	if d, ok := e.kv.(kvDeferrer); ok && isDeferred(ctx) {
		err = d.UpdateDeferred(run)
	} else {
		err = e.kv.Update(run)
	}
	// The last run is the one committed: a store runs fn again only
	// for an attempt that did not commit.
	committed = err == nil
	return err
}

// skipInodes advances the inode counter by n, durably (see walKV.inoGap),
// and sets the sweep mark.
func (e *kvEngine) skipInodes(ctx context.Context, n uint64) error {
	return e.update(ctx, func(x *tx) error {
		next, err := x.counter(keyNextIno)
		if err != nil {
			return err
		}
		if err := x.t.Put(keyNextIno, be.AppendUint64(nil, next+n)); err != nil {
			return err
		}
		// Data objects of the creates that can have been lost are below
		// the new counter: the sweep's mark (sweep.go).
		return x.markSweep(next + n)
	})
}

func (e *kvEngine) view(ctx context.Context, fn func(x *tx) error) error {
	if err := e.check(ctx); err != nil {
		return err
	}
	return e.kv.View(func(t kvTxn) error { return fn(newTx(t)) })
}

func (e *kvEngine) Init(ctx context.Context) error {
	return e.update(ctx, func(x *tx) error {
		v, err := x.t.Get(inodeKey(RootIno))
		if err != nil || v != nil {
			return err
		}
		now := time.Now()
		root := &inode{Attr: Attr{
			Type: TypeDirectory, Mode: 0o755, Nlink: 2,
			Atime: now, Mtime: now, Ctime: now, Btime: now,
			Change: 1, Parent: RootIno,
		}, nextSeq: FirstCookie}
		x.markDirty(RootIno, root)
		if err := x.t.Put(keyNextIno, be.AppendUint64(nil, uint64(RootIno)+1)); err != nil {
			return err
		}
		return x.t.Put(keyFiles, be.AppendUint64(nil, 1))
	})
}

func (e *kvEngine) GetAttr(ctx context.Context, ino Ino) (Attr, error) {
	if a, ok := e.cache.attr(ino); ok {
		if err := e.check(ctx); err != nil {
			return Attr{}, err
		}
		return a, nil
	}
	gen := e.cache.generation()
	var a Attr
	err := e.view(ctx, func(x *tx) error {
		n, err := x.inode(ino)
		if err != nil {
			return err
		}
		a = n.Attr
		return nil
	})
	if err == nil {
		e.cache.put(gen, []Ino{ino}, []Attr{a}, 0, "", 0)
	}
	return a, err
}

func (e *kvEngine) SetAttr(ctx context.Context, ino Ino, sa SetAttr, now time.Time) (Attr, error) {
	now = nowOr(now)
	var a Attr
	err := e.update(ctx, func(x *tx) error {
		n, err := x.inode(ino)
		if err != nil {
			return err
		}
		m := sa.Mask
		if m&SetSize != 0 {
			switch n.Type {
			case TypeRegular:
			case TypeDirectory:
				return fmt.Errorf("setattr size on %d: %w", ino, ErrIsDir)
			default:
				return fmt.Errorf("setattr size on %d: %w", ino, ErrInval)
			}
		}
		if m&SetMode != 0 {
			n.Mode = sa.Mode & ModeMask
		}
		if m&SetUID != 0 {
			n.UID = sa.UID
		}
		if m&SetGID != 0 {
			n.GID = sa.GID
		}
		mtime := false
		if m&SetSize != 0 && sa.Size != n.Size {
			n.Size = sa.Size
			mtime = true
		}
		x.touch(ino, n, now, mtime)
		switch {
		case m&SetAtimeNow != 0:
			n.Atime = now
		case m&SetAtime != 0:
			n.Atime = sa.Atime
		}
		switch {
		case m&SetMtimeNow != 0:
			n.Mtime = now
		case m&SetMtime != 0:
			n.Mtime = sa.Mtime
		}
		if m&SetChange != 0 && sa.Change > n.Change {
			n.Change = sa.Change
		}
		a = n.Attr
		return nil
	})
	return a, err
}

// writeTarget reads ino for a write to its data: a regular file.
func (x *tx) writeTarget(ino Ino) (*inode, error) {
	n, err := x.inode(ino)
	if err != nil {
		return nil, err
	}
	if n.Type != TypeRegular {
		return nil, fmt.Errorf("write to %d (%v): %w", ino, n.Type, ErrInval)
	}
	return n, nil
}

// wrote records a write that ended at end: the size grows to it, and
// mtime, ctime and change move.
func (x *tx) wrote(ino Ino, n *inode, end uint64, now time.Time) Attr {
	n.Size = max(n.Size, end)
	x.touch(ino, n, now, true)
	return n.Attr
}

func (e *kvEngine) Wrote(ctx context.Context, ino Ino, end uint64, now time.Time) (Attr, error) {
	now = nowOr(now)
	var a Attr
	err := e.update(ctx, func(x *tx) error {
		n, err := x.writeTarget(ino)
		if err != nil {
			return err
		}
		a = x.wrote(ino, n, end, now)
		return nil
	})
	return a, err
}

func (e *kvEngine) Lookup(ctx context.Context, parent Ino, name string) (Node, error) {
	if nd, found, ok := e.cachedLookup(parent, name); ok {
		if err := e.check(ctx); err != nil {
			return Node{}, err
		}
		if !found {
			return Node{}, fmt.Errorf("lookup %q in %d: %w", name, parent, ErrNotFound)
		}
		return nd, nil
	}
	gen := e.cache.generation()
	var (
		nd    Node
		pa    Attr
		found bool
	)
	err := e.view(ctx, func(x *tx) error {
		if err := prefetch(x.t, inodeKey(parent), dentryKey(parent, name)); err != nil {
			return err
		}
		dir, err := x.dir(parent)
		if err != nil {
			return err
		}
		pa = dir.Attr
		d, ok, err := x.lookup(parent, name)
		if err != nil {
			return err
		}
		if found = ok; !ok {
			return fmt.Errorf("lookup %q in %d: %w", name, parent, ErrNotFound)
		}
		n, err := x.inode(d.ino)
		if err != nil {
			return err
		}
		nd = Node{d.ino, n.Attr}
		return nil
	})
	if err == nil || !found && errors.Is(err, ErrNotFound) {
		e.cache.put(gen, []Ino{parent, nd.Ino}, []Attr{pa, nd.Attr}, parent, name, nd.Ino)
	}
	return nd, err
}

// cachedLookup answers Lookup from the cache if it knows the parent (a
// directory), the name and, if the name exists, its inode: ok reports
// whether it did, found whether the name exists.
func (e *kvEngine) cachedLookup(parent Ino, name string) (nd Node, found, ok bool) {
	return e.cache.lookup(parent, name)
}

func (e *kvEngine) Create(ctx context.Context, parent Ino, name string, args CreateArgs, now time.Time) (Node, ChangeInfo, error) {
	if err := validName(name); err != nil {
		return Node{}, ChangeInfo{}, err
	}
	if !args.Type.valid() {
		return Node{}, ChangeInfo{}, fmt.Errorf("create type %d: %w", args.Type, ErrInval)
	}
	if args.Type == TypeSymlink && (args.Target == "" || len(args.Target) > math.MaxUint16) {
		return Node{}, ChangeInfo{}, fmt.Errorf("symlink target length %d: %w", len(args.Target), ErrInval)
	}
	now = nowOr(now)
	var nd Node
	var ci ChangeInfo
	err := e.update(ctx, func(x *tx) error {
		nd, ci = Node{}, ChangeInfo{}
		// What a create reads, in one round trip on etcd.
		if err := prefetch(x.t, inodeKey(parent), dentryKey(parent, name), policyKey(parent), keyNextIno, keyFiles); err != nil {
			return err
		}
		dir, err := x.dir(parent)
		if err != nil {
			return err
		}
		// Read the name and, for an inode that inherits it, the parent's
		// policy together: one round trip on etcd.
		keys := [][]byte{dentryKey(parent, name)}
		if inherits(args.Type) {
			keys = append(keys, policyKey(parent))
		}
		vals, err := getMany(x.t, keys)
		if err != nil {
			return err
		}
		if vals[0] != nil {
			d, err := decodeDentry(vals[0])
			if err != nil {
				return err
			}
			n, err := x.inode(d.ino)
			if err != nil {
				return err
			}
			nd = Node{d.ino, n.Attr}
			return fmt.Errorf("create %q in %d: %w", name, parent, ErrExist)
		}
		var policy []byte
		if len(vals) > 1 {
			policy = vals[1]
		}
		if args.Type == TypeDirectory && dir.Nlink == math.MaxUint32 {
			return fmt.Errorf("mkdir in %d: %w", parent, ErrTooManyLinks)
		}
		next, err := x.counter(keyNextIno)
		if err != nil {
			return err
		}
		ino := Ino(next)
		if err := x.t.Put(keyNextIno, be.AppendUint64(nil, next+1)); err != nil {
			return err
		}
		if err := x.addCounter(keyFiles, 1); err != nil {
			return err
		}
		n := &inode{Attr: Attr{
			Type: args.Type, Mode: args.Mode & ModeMask, Nlink: 1,
			UID: args.UID, GID: args.GID,
			Atime: now, Mtime: now, Ctime: now, Btime: now, Change: 1,
		}}
		switch args.Type {
		case TypeDirectory:
			n.Nlink = 2
			n.Parent = parent
			n.nextSeq = FirstCookie
			dir.Nlink++
		case TypeSymlink:
			n.Size = uint64(len(args.Target))
			if err := x.t.Put(symlinkKey(ino), []byte(args.Target)); err != nil {
				return err
			}
		case TypeBlock, TypeChar:
			n.RdevMajor, n.RdevMinor = args.RdevMajor, args.RdevMinor
		}
		if args.Exclusive {
			n.Verifier = args.Verifier
		}
		if err := x.inheritPolicy(parent, ino, policy); err != nil {
			return err
		}
		x.markDirty(ino, n)
		ci.Before = dir.Change
		if err := x.addEntry(parent, dir, name, ino, n.Type); err != nil {
			return err
		}
		x.touch(parent, dir, now, true)
		ci.After = dir.Change
		nd = Node{ino, n.Attr}
		return x.replayed(ctx, ino, now)
	})
	return nd, ci, err
}

func (e *kvEngine) Link(ctx context.Context, ino Ino, parent Ino, name string, now time.Time) (Attr, ChangeInfo, error) {
	if err := validName(name); err != nil {
		return Attr{}, ChangeInfo{}, err
	}
	now = nowOr(now)
	var a Attr
	var ci ChangeInfo
	err := e.update(ctx, func(x *tx) error {
		n, err := x.inode(ino)
		if err != nil {
			return err
		}
		if n.Type == TypeDirectory {
			return fmt.Errorf("link %d: %w", ino, ErrIsDir)
		}
		if n.Nlink == 0 {
			return fmt.Errorf("link orphan %d: %w", ino, ErrNotFound)
		}
		dir, err := x.dir(parent)
		if err != nil {
			return err
		}
		if _, ok, err := x.lookup(parent, name); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("link %q in %d: %w", name, parent, ErrExist)
		}
		if n.Nlink == math.MaxUint32 {
			return fmt.Errorf("link %d: %w", ino, ErrTooManyLinks)
		}
		ci.Before = dir.Change
		if err := x.addEntry(parent, dir, name, ino, n.Type); err != nil {
			return err
		}
		x.touch(parent, dir, now, true)
		ci.After = dir.Change
		n.Nlink++
		x.touch(ino, n, now, false)
		a = n.Attr
		return x.replayed(ctx, ino, now)
	})
	return a, ci, err
}

// unlink removes the entry name (d) from dirIno and drops the link it held.
// The returned attributes have Nlink zero if the inode was deleted. A
// regular file that loses its last link becomes an orphan, unless free is
// set, in which case its inode is deleted too.
func (x *tx) unlink(dirIno Ino, dir *inode, name string, d dentry, now time.Time, free bool) (Attr, error) {
	n, err := x.inode(d.ino)
	if err != nil {
		return Attr{}, err
	}
	if err := x.delEntry(dirIno, name, d); err != nil {
		return Attr{}, err
	}
	if n.Type == TypeDirectory {
		dir.Nlink--
		n.Nlink = 0
	} else {
		n.Nlink--
	}
	n.Change++
	n.Ctime = now
	a := n.Attr
	if n.Nlink == 0 && n.Type != TypeRegular {
		return a, x.deleteInode(d.ino, n)
	}
	if n.Nlink == 0 && free {
		return a, x.deleteInode(d.ino, n)
	}
	x.markDirty(d.ino, n)
	if n.Nlink == 0 {
		// A regular file may still be open on some client: keep it as an
		// orphan until the server frees it (see Engine.Remove).
		return a, x.t.Put(orphanKey(d.ino), []byte{1})
	}
	return a, nil
}

func (e *kvEngine) Remove(ctx context.Context, parent Ino, name string, now time.Time) (Node, ChangeInfo, error) {
	if len(name) > MaxNameLen {
		return Node{}, ChangeInfo{}, ErrNameTooLong
	}
	now = nowOr(now)
	var nd Node
	var ci ChangeInfo
	err := e.update(ctx, func(x *tx) error {
		if err := prefetch(x.t, inodeKey(parent), dentryKey(parent, name)); err != nil {
			return err
		}
		dir, err := x.dir(parent)
		if err != nil {
			return err
		}
		d, ok, err := x.lookup(parent, name)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("remove %q in %d: %w", name, parent, ErrNotFound)
		}
		if d.typ == TypeDirectory {
			empty, err := x.isEmpty(d.ino)
			if err != nil {
				return err
			}
			if !empty {
				return fmt.Errorf("remove %q in %d: %w", name, parent, ErrNotEmpty)
			}
		}
		ci.Before = dir.Change
		free := freeUnlinkedFrom(ctx)
		if free != nil {
			free.Freed = false // a store may run the transaction more than once
		}
		doFree := free != nil && free.Ino == d.ino && d.typ == TypeRegular
		a, err := x.unlink(parent, dir, name, d, now, doFree)
		if err != nil {
			return err
		}
		if doFree && a.Nlink == 0 {
			free.Freed = true
		}
		x.touch(parent, dir, now, true)
		ci.After = dir.Change
		nd = Node{d.ino, a}
		return x.replayed(ctx, d.ino, now)
	})
	return nd, ci, err
}

func (e *kvEngine) Rename(ctx context.Context, srcParent Ino, srcName string, dstParent Ino, dstName string, now time.Time) (RenameResult, error) {
	if len(srcName) > MaxNameLen {
		return RenameResult{}, ErrNameTooLong
	}
	if err := validName(dstName); err != nil {
		return RenameResult{}, err
	}
	now = nowOr(now)
	var res RenameResult
	err := e.update(ctx, func(x *tx) error {
		res = RenameResult{}
		sdir, err := x.dir(srcParent)
		if err != nil {
			return err
		}
		ddir, err := x.dir(dstParent)
		if err != nil {
			return err
		}
		res.Src = ChangeInfo{sdir.Change, sdir.Change}
		res.Dst = ChangeInfo{ddir.Change, ddir.Change}
		sd, ok, err := x.lookup(srcParent, srcName)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("rename %q in %d: %w", srcName, srcParent, ErrNotFound)
		}
		if srcParent == dstParent && srcName == dstName {
			return nil
		}
		dd, exists, err := x.lookup(dstParent, dstName)
		if err != nil {
			return err
		}
		if exists && dd.ino == sd.ino {
			return nil // both names are links to one inode: POSIX says do nothing
		}
		isDir := sd.typ == TypeDirectory
		if isDir && srcParent != dstParent {
			// Refuse to move a directory into its own subtree.
			for p, hops := dstParent, 0; ; hops++ {
				if p == sd.ino {
					return fmt.Errorf("rename dir %d under itself: %w", sd.ino, ErrInval)
				}
				if p == RootIno || hops > 1<<16 {
					break
				}
				pn, err := x.inode(p)
				if err != nil {
					return err
				}
				p = pn.Parent
			}
		}
		if exists {
			switch {
			case isDir && dd.typ != TypeDirectory:
				return fmt.Errorf("rename dir over %q: %w", dstName, ErrNotDir)
			case !isDir && dd.typ == TypeDirectory:
				return fmt.Errorf("rename over dir %q: %w", dstName, ErrIsDir)
			case dd.typ == TypeDirectory:
				empty, err := x.isEmpty(dd.ino)
				if err != nil {
					return err
				}
				if !empty {
					return fmt.Errorf("rename over %q: %w", dstName, ErrNotEmpty)
				}
			}
			a, err := x.unlink(dstParent, ddir, dstName, dd, now, false)
			if err != nil {
				return err
			}
			res.Replaced = Node{dd.ino, a}
		}
		sn, err := x.inode(sd.ino)
		if err != nil {
			return err
		}
		if err := x.delEntry(srcParent, srcName, sd); err != nil {
			return err
		}
		if err := x.addEntry(dstParent, ddir, dstName, sd.ino, sd.typ); err != nil {
			return err
		}
		if isDir && srcParent != dstParent {
			sdir.Nlink--
			ddir.Nlink++
			sn.Parent = dstParent
		}
		x.touch(sd.ino, sn, now, false)
		x.touch(srcParent, sdir, now, true)
		if dstParent != srcParent {
			x.touch(dstParent, ddir, now, true)
		}
		res.Src.After = sdir.Change
		res.Dst.After = ddir.Change
		return x.replayed(ctx, sd.ino, now)
	})
	return res, err
}

func (e *kvEngine) Readlink(ctx context.Context, ino Ino) (string, error) {
	var s string
	err := e.view(ctx, func(x *tx) error {
		n, err := x.inode(ino)
		if err != nil {
			return err
		}
		if n.Type != TypeSymlink {
			return fmt.Errorf("readlink %d: %w", ino, ErrNotSymlink)
		}
		v, err := x.t.Get(symlinkKey(ino))
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("meta: symlink %d has no target", ino)
		}
		s = string(v)
		return nil
	})
	return s, err
}

func (e *kvEngine) ReadDir(ctx context.Context, dir Ino, cookie uint64, max int) ([]Entry, bool, error) {
	if max <= 0 {
		return nil, false, fmt.Errorf("readdir max %d: %w", max, ErrInval)
	}
	max = min(max, maxReadDir)
	var ents []Entry
	eof := true
	err := e.view(ctx, func(x *tx) error {
		ents, eof = ents[:0], true
		if _, err := x.dir(dir); err != nil {
			return err
		}
		start := cookie + 1
		if cookie < FirstCookie {
			start = FirstCookie
		}
		if start == 0 { // cookie was MaxUint64
			return nil
		}
		var names []string
		var seqs []uint64
		err := x.t.Scan(seqPrefix(dir), seqKey(dir, start), func(k, v []byte) bool {
			if len(names) == max {
				eof = false
				return false
			}
			names = append(names, string(v))
			seqs = append(seqs, be.Uint64(k[9:]))
			return true
		})
		if err != nil {
			return err
		}
		// Read all dentries, then all their inodes, in two batches (on
		// etcd a round trip per MaxTxnOps keys, not one per key), but
		// report the error that entry-by-entry reading would meet
		// first: entries before the first bad dentry are checked for
		// their inode before the bad dentry is reported.
		keys := make([][]byte, len(names))
		for i, name := range names {
			keys[i] = dentryKey(dir, name)
		}
		vals, err := getMany(x.t, keys)
		if err != nil {
			return err
		}
		dents := make([]dentry, 0, len(names))
		var bad error
		for i, v := range vals {
			var d dentry
			if v != nil {
				if d, err = decodeDentry(v); err != nil {
					bad = err
					break
				}
			}
			if v == nil || d.seq != seqs[i] {
				bad = fmt.Errorf("meta: dir %d: index entry %d (%q) has no dentry", dir, seqs[i], names[i])
				break
			}
			dents = append(dents, d)
		}
		inos := make([]Ino, len(dents))
		for i, d := range dents {
			inos[i] = d.ino
		}
		nodes, err := x.inodes(inos)
		if err != nil {
			return err
		}
		if bad != nil {
			return bad
		}
		for i, d := range dents {
			ents = append(ents, Entry{Name: names[i], Ino: d.ino, Cookie: seqs[i], Attr: nodes[i].Attr})
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return ents, eof, nil
}

func (e *kvEngine) StatFS(ctx context.Context) (StatFS, error) {
	var st StatFS
	err := e.view(ctx, func(x *tx) error {
		f, err := x.counter(keyFiles)
		if err != nil {
			return err
		}
		n, err := x.counter(keyNextIno)
		st = StatFS{Files: f, NextIno: Ino(n)}
		return err
	})
	return st, err
}

// pOrphan prefixes the orphan set: one key per orphan, the inode number
// big-endian (so a scan yields inode order), with a one-byte placeholder
// value.
const pOrphan = 'O'

func orphanKey(ino Ino) []byte { return be.AppendUint64([]byte{pOrphan}, uint64(ino)) }

// orphanPage bounds the keys one Orphans transaction reads.
const orphanPage = 1024

func (e *kvEngine) Orphans(ctx context.Context) ([]Ino, error) {
	var out []Ino
	start := []byte{pOrphan}
	// Page through the set so that every transaction stays small; each
	// page starts after the last key of the previous one. An orphan made
	// concurrently below the current page is missed, which is fine for
	// the intended use, at startup before serving.
	for {
		var page []Ino
		err := e.view(ctx, func(x *tx) error {
			page = page[:0]
			return x.t.Scan([]byte{pOrphan}, start, func(k, _ []byte) bool {
				if len(k) != 9 {
					return true
				}
				page = append(page, Ino(be.Uint64(k[1:])))
				return len(page) < orphanPage
			})
		})
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < orphanPage {
			return out, nil
		}
		start = orphanKey(page[len(page)-1] + 1)
	}
}

func (e *kvEngine) FreeOrphan(ctx context.Context, ino Ino) (Attr, error) {
	var a Attr
	err := e.update(ctx, func(x *tx) (err error) {
		a, err = x.freeOrphan(ino)
		return err
	})
	return a, err
}

func (e *kvEngine) FreeOrphans(ctx context.Context, inos []Ino) error {
	err := e.update(ctx, func(x *tx) error {
		for _, ino := range inos {
			if _, err := x.freeOrphan(ino); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, ErrTxnTooLarge) && len(inos) > 1 {
		// Too many for one etcd transaction: halves, each atomic.
		if err := e.FreeOrphans(ctx, inos[:len(inos)/2]); err != nil {
			return err
		}
		return e.FreeOrphans(ctx, inos[len(inos)/2:])
	}
	return err
}

// freeOrphan is FreeOrphan in x.
func (x *tx) freeOrphan(ino Ino) (Attr, error) {
	n, err := x.inode(ino)
	if errors.Is(err, ErrStale) {
		// Freed already; drop a mark that might have outlived it.
		return Attr{}, x.t.Delete(orphanKey(ino))
	}
	if err != nil {
		return Attr{}, err
	}
	if n.Nlink != 0 {
		return Attr{}, fmt.Errorf("free orphan %d: has %d links: %w", ino, n.Nlink, ErrInval)
	}
	if err := x.t.Delete(orphanKey(ino)); err != nil {
		return Attr{}, err
	}
	return n.Attr, x.deleteInode(ino, n)
}

func clientKey(key []byte) []byte { return append([]byte{pClient}, key...) }

func (e *kvEngine) PutClient(ctx context.Context, key, rec []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("empty client key: %w", ErrInval)
	}
	return e.update(ctx, func(x *tx) error { return x.t.Put(clientKey(key), bytes.Clone(rec)) })
}

func (e *kvEngine) DeleteClient(ctx context.Context, key []byte) error {
	return e.update(ctx, func(x *tx) error { return x.t.Delete(clientKey(key)) })
}

func (e *kvEngine) Clients(ctx context.Context) ([]ClientRecord, error) {
	var out []ClientRecord
	err := e.view(ctx, func(x *tx) error {
		out = out[:0]
		return x.t.Scan([]byte{pClient}, nil, func(k, v []byte) bool {
			out = append(out, ClientRecord{Key: bytes.Clone(k[1:]), Rec: bytes.Clone(v)})
			return true
		})
	})
	return out, err
}

func configKey(key string) []byte { return append([]byte{pConfig}, key...) }

func (e *kvEngine) GetConfig(ctx context.Context, key string) ([]byte, error) {
	var val []byte
	err := e.view(ctx, func(x *tx) error {
		v, err := x.t.Get(configKey(key))
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("config %q: %w", key, ErrNotFound)
		}
		val = bytes.Clone(v)
		return nil
	})
	return val, err
}

func (e *kvEngine) PutConfig(ctx context.Context, key string, val []byte) error {
	if key == "" {
		return fmt.Errorf("empty config key: %w", ErrInval)
	}
	return e.update(ctx, func(x *tx) error { return x.t.Put(configKey(key), bytes.Clone(val)) })
}

func (e *kvEngine) Close() error {
	if e.closed.Swap(true) {
		return ErrClosed
	}
	if err := e.kv.Close(); err != nil && !errors.Is(err, errKVClosed) {
		return fmt.Errorf("meta: close: %w", err)
	}
	return nil
}
