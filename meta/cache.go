package meta

import "sync"

// readCache keeps the attributes of recently read inodes and the targets
// of recently looked-up names, so that GetAttr and Lookup of hot entries
// (stat, path walks) need no read transaction, snapshot or decoding, and
// on etcd no round trip to another process.
//
// Coherence with the engine's transactions: an update, once its
// transaction function has run and before the store commits it, drops
// the entries of the inodes it read or wrote and of the names it linked
// or unlinked, and counts itself in flight; once the commit is over it
// drops them again and leaves. Nothing is stored while an update is in
// flight, nor by a read that began before the last update began or
// ended (gen). So while an update commits, readers of what it touches
// go to the store, whose reads never go back in time; and after it, the
// cache holds only what was read after it.
//
// That argument needs one more thing: that this engine's updates are the
// only changes to the store. On bbolt it holds by construction (the file
// is locked by one process). On etcd it holds only while this process
// provably leads: held, when not nil, is asked at every read and every
// store, and while it says no the cache holds nothing and answers
// nothing. The etcd engine's held (etcdKV.leaseHeld) is true only while
// the metadata server's leadership lease is known to be alive in etcd
// and nothing has shown the fence broken or a commit's outcome unknown;
// see "The read cache" in the package doc for why that is enough. A
// single rule decides for both engines: a read may be served or stored
// only if held says yes (or there is no held), and never while an update
// it could miss is in flight.
type readCache struct {
	mu       sync.Mutex
	gen      uint64
	inflight int // updates between begin and end
	attrs    map[Ino]Attr
	names    map[nameKey]Ino // 0: the name does not exist
	// held, if not nil, reports whether the store is still this
	// engine's alone; once it says no, the cache is emptied, and it stays
	// empty while it does. Called with mu held: it must be cheap and
	// must not call back into the cache.
	held func() bool
}

type nameKey struct {
	parent Ino
	name   string
}

// readCacheMax bounds each map; a full map is emptied (entries are cheap
// to read again, and this keeps the cache free of LRU bookkeeping on the
// hot path).
const readCacheMax = 1 << 17

// newReadCache returns a cache that is valid while held says so (always,
// if held is nil).
func newReadCache(held func() bool) *readCache {
	return &readCache{attrs: map[Ino]Attr{}, names: map[nameKey]Ino{}, held: held}
}

// usableLocked reports whether the cache may answer or store now; when
// it may not, it forgets everything, and the generation moves so that a
// read that began before cannot store what it found either.
func (c *readCache) usableLocked() bool {
	if c.held == nil || c.held() {
		return true
	}
	if len(c.attrs) > 0 || len(c.names) > 0 {
		clear(c.attrs)
		clear(c.names)
	}
	c.gen++
	return false
}

// generation returns the generation to pass to the puts that follow a
// read started now.
func (c *readCache) generation() uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

func (c *readCache) attr(ino Ino) (Attr, bool) {
	if c == nil {
		return Attr{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.usableLocked() {
		return Attr{}, false
	}
	a, ok := c.attrs[ino]
	return a, ok
}

func (c *readCache) name(parent Ino, name string) (Ino, bool) {
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.usableLocked() {
		return 0, false
	}
	ino, ok := c.names[nameKey{parent, name}]
	return ino, ok
}

// put stores what a read that began at gen found: the attributes of
// inodes (ino 0 is skipped) and, if name is not empty, that parent's name
// leads to target (0: to nothing).
func (c *readCache) put(gen uint64, inos []Ino, attrs []Attr, parent Ino, name string, target Ino) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen || c.inflight > 0 || !c.usableLocked() {
		return
	}
	if len(c.attrs)+len(inos) > readCacheMax {
		clear(c.attrs)
	}
	for i, ino := range inos {
		if ino != 0 {
			c.attrs[ino] = attrs[i]
		}
	}
	if name != "" {
		if len(c.names) >= readCacheMax {
			clear(c.names)
		}
		c.names[nameKey{parent, name}] = target
	}
}

// begin is called by an update whose transaction x is about to commit.
func (c *readCache) begin(x *tx) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight++
	c.dropLocked(x)
}

// end is called once the update's commit is over (whatever its outcome),
// with its last transaction, if begin was called.
func (c *readCache) end(x *tx) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight--
	c.dropLocked(x)
}

func (c *readCache) dropLocked(x *tx) {
	c.gen++
	for _, n := range x.nodes {
		delete(c.attrs, n.ino)
	}
	for _, k := range x.names {
		delete(c.names, k)
	}
}
