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
	// seq counts begins; busy* count the updates in flight that touch
	// an inode or name, last* the latest begin that touched it (kept
	// while any update is in flight). See end.
	seq      uint64
	busyIno  map[Ino]int
	lastIno  map[Ino]uint64
	busyName map[nameKey]int
	lastName map[nameKey]uint64
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
	return &readCache{attrs: map[Ino]Attr{}, names: map[nameKey]Ino{}, held: held,
		busyIno: map[Ino]int{}, lastIno: map[Ino]uint64{}, busyName: map[nameKey]int{}, lastName: map[nameKey]uint64{}}
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

// lookup answers a Lookup if the cache knows the parent (a directory),
// the name and, if the name exists, its inode: ok reports whether it
// did, found whether the name exists. One lock and one check of held for
// the three.
func (c *readCache) lookup(parent Ino, name string) (nd Node, found, ok bool) {
	if c == nil {
		return Node{}, false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.usableLocked() {
		return Node{}, false, false
	}
	if pa, ok := c.attrs[parent]; !ok || pa.Type != TypeDirectory {
		return Node{}, false, false
	}
	ino, ok := c.names[nameKey{parent, name}]
	if !ok {
		return Node{}, false, false
	}
	if ino == 0 {
		return Node{}, false, true
	}
	a, ok := c.attrs[ino]
	return Node{ino, a}, true, ok
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

// begin is called by an update whose transaction x is about to commit;
// it returns the update's place in the order of begins, for end. Stores
// run the last attempt of each update in the order they commit it (bbolt
// and the log replay a round in order; etcd's rounds and their calls run
// in order, and a retried round runs, and begins, again), so that order
// is the commit order.
func (c *readCache) begin(x *tx) uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight++
	c.seq++
	for _, n := range x.nodes {
		c.busyIno[n.ino]++
		c.lastIno[n.ino] = c.seq
	}
	for _, k := range x.names {
		c.busyName[k.key]++
		c.lastName[k.key] = c.seq
	}
	c.dropLocked(x)
	return c.seq
}

// end is called once the update's commit is over, with its last
// transaction and what begin returned for it, if begin was called;
// committed reports whether the store committed x (the update returned
// no error).
//
// A committed update knows the store's state for what it touched: the
// inodes of x hold exactly what the commit left (it read them in the
// snapshot the commit applied to, and wrote them), and the names it
// linked or unlinked lead where it left them. So it stores them, for each
// inode or name that no update begun after it touched (the commit order is
// the begin order: a later one would have committed later) and that no
// update in flight touches (whose commit could land any moment). Creates
// thus leave their files cached for the stats that follow them.
func (c *readCache) end(x *tx, seq uint64, committed bool) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight--
	// What x may leave behind: what it touched last and nothing in
	// flight touches. Once nothing in flight touches an inode or name,
	// no end will look at its last begin again (an update's end looks
	// only at what it touched itself), so that is forgotten here: the
	// bookkeeping never holds more than the updates in flight touch.
	var keepIno []int
	var keepName []int
	for i, n := range x.nodes {
		if c.busyIno[n.ino]--; c.busyIno[n.ino] > 0 {
			continue
		}
		if c.lastIno[n.ino] == seq && n.n != nil {
			keepIno = append(keepIno, i)
		}
		delete(c.busyIno, n.ino)
		delete(c.lastIno, n.ino)
	}
	for i, k := range x.names {
		if c.busyName[k.key]--; c.busyName[k.key] > 0 {
			continue
		}
		if c.lastName[k.key] == seq {
			keepName = append(keepName, i)
		}
		delete(c.busyName, k.key)
		delete(c.lastName, k.key)
	}
	c.dropLocked(x)
	if !committed || !c.usableLocked() {
		return
	}
	if len(c.attrs)+len(keepIno) > readCacheMax {
		clear(c.attrs)
	}
	for _, i := range keepIno {
		c.attrs[x.nodes[i].ino] = storedAttr(x.nodes[i].n)
	}
	if len(c.names)+len(keepName) > readCacheMax {
		clear(c.names)
	}
	// A name changed twice in x (unlinked, then linked again) leads
	// where its last change left it.
	for _, i := range keepName {
		k := x.names[i]
		c.names[k.key] = k.ino
	}
}

func (c *readCache) dropLocked(x *tx) {
	c.gen++
	for _, n := range x.nodes {
		delete(c.attrs, n.ino)
	}
	for _, k := range x.names {
		delete(c.names, k.key)
	}
}

// storedAttr is n's Attr as a read of the store returns it: times as
// decoded (no monotonic reading, the local zone), so that a cached answer
// is the same value as the one a read would give.
func storedAttr(n *inode) Attr {
	d, err := decodeInode(n.encode())
	if err != nil {
		panic("meta: an inode does not decode as it encodes: " + err.Error())
	}
	return d.Attr
}
