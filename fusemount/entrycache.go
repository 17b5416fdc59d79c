package fusemount

import (
	"context"
	"sync"
	"time"

	"github.com/shoalfs/shoal/client"
)

// The mount's own name and attribute cache.
//
// The kernel caches names and attributes for the mount (Config's
// DirTimeout and AttrTimeout), but it forgets them whenever it reclaims
// dentries and inodes: under memory pressure, after drop_caches, and for
// anything it never looked up (a tree another process of this machine
// wrote). Then every stat(2) of a known name was a LOOKUP at the server.
// So the mount keeps what the server last said, apart from the kernel's
// caches, in a bounded cache (Config.EntryCache entries, default
// DefaultEntryCache): each name of a directory with its file handle and
// fileid, and each object's attributes, with the time the server sent
// them. A LOOKUP is answered from it while both are younger than the
// kernel's own timeouts would allow (a name DirTimeout, a file's
// attributes AttrTimeout, a directory's DirTimeout), and the kernel gets
// only the rest of those timeouts. So the staleness bound for another
// client's change is the one the mount already documents for the
// kernel's caches: a file's attributes or its removal show within
// AttrTimeout, a rename within DirTimeout; names that do not exist are
// never cached.
//
// The mount's own changes are coherent at once: every operation that
// adds, removes or renames a name drops the name before and after it is
// sent, every change to an object drops its attributes (node.changed),
// and every answer from the server refreshes them (node.noteAttr). A
// reply that may predate one of our own changes is not cached: a change
// counter (gen) is read before a request is sent and checked when its
// answer is stored.
//
// A directory that sees a run of lookups of existing names the cache does
// not hold (readdirAfter of them, each within missWindow of the last, no
// lookup of a missing name in between: a stat of every file of a
// directory, as find, du or a build does, not the creation of new files,
// which looks each new name up first) is read once
// with its entries' handles and attributes (one READDIR per 32 KiB of
// listing, the same reply that answers ls -l), and the rest of the run is
// answered from the cache. A directory is read at most once per
// missWindow.
//
// Eviction is arbitrary (Go map order) once a map is full: the bound is
// on memory, and an evicted entry costs one LOOKUP.
//
// Lock order: node.mu before entryCache.mu; the cache calls nothing.

// DefaultEntryCache is the default bound of the mount's name cache and of
// its attribute cache, in entries.
const DefaultEntryCache = 1 << 16

// Lookups of names the cache lacks that make the mount read the
// directory (see above).
const (
	readdirAfter = 8
	missWindow   = time.Second
)

type entryKey struct {
	dir  uint64 // the directory's fileid
	name string
}

type cachedName struct {
	fh  []byte
	ino uint64
	at  time.Time
}

type cachedAttr struct {
	a  client.Attr
	at time.Time
}

type missRun struct {
	n      int
	last   time.Time
	filled time.Time // when the directory was last read for the cache
	busy   bool      // a read is under way
}

type entryCache struct {
	max             int
	fileTTL, dirTTL time.Duration

	mu     sync.Mutex
	gen    uint64 // counts the mount's own changes
	names  map[entryKey]cachedName
	attrs  map[uint64]cachedAttr
	misses map[uint64]*missRun
}

// newEntryCache returns a cache of max entries per map, nil (no cache)
// if max is negative or either timeout is not positive.
func newEntryCache(max int, fileTTL, dirTTL time.Duration) *entryCache {
	if max == 0 {
		max = DefaultEntryCache
	}
	if max < 0 || fileTTL <= 0 || dirTTL <= 0 {
		return nil
	}
	return &entryCache{max: max, fileTTL: fileTTL, dirTTL: dirTTL,
		names: make(map[entryKey]cachedName), attrs: make(map[uint64]cachedAttr), misses: make(map[uint64]*missRun)}
}

func (c *entryCache) attrTTL(t client.FileType) time.Duration {
	if t == client.TypeDir {
		return c.dirTTL
	}
	return c.fileTTL
}

// mark returns the change counter, to pass to put with the answer to a
// request sent after it.
func (c *entryCache) mark() uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// get returns name in directory dir if the cache holds it and its
// attributes, both young enough, and how long each may still be trusted.
func (c *entryCache) get(dir uint64, name string) (fh []byte, a client.Attr, at time.Time, entryLeft, attrLeft time.Duration, ok bool) {
	if c == nil {
		return nil, a, at, 0, 0, false
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.names[entryKey{dir, name}]
	if !ok {
		return nil, a, at, 0, 0, false
	}
	ca, ok := c.attrs[e.ino]
	if !ok {
		return nil, a, at, 0, 0, false
	}
	entryLeft = c.dirTTL - now.Sub(e.at)
	attrLeft = c.attrTTL(ca.a.Type) - now.Sub(ca.at)
	if entryLeft <= 0 || attrLeft <= 0 {
		return nil, a, at, 0, 0, false
	}
	return e.fh, ca.a, ca.at, entryLeft, attrLeft, true
}

// put stores name in dir with its handle and attributes, sent by the
// server at, unless the mount changed anything since gen.
func (c *entryCache) put(dir uint64, name string, fh []byte, a *client.Attr, at time.Time, gen uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	c.putLocked(dir, name, fh, a, at)
}

func (c *entryCache) putLocked(dir uint64, name string, fh []byte, a *client.Attr, at time.Time) {
	k := entryKey{dir, name}
	if _, ok := c.names[k]; !ok && len(c.names) >= c.max {
		for old := range c.names {
			delete(c.names, old)
			break
		}
	}
	c.names[k] = cachedName{fh: fh, ino: a.Fileid, at: at}
	c.setAttrLocked(a.Fileid, a, at)
}

func (c *entryCache) setAttrLocked(ino uint64, a *client.Attr, at time.Time) {
	if _, ok := c.attrs[ino]; !ok && len(c.attrs) >= c.max {
		for old := range c.attrs {
			delete(c.attrs, old)
			break
		}
	}
	c.attrs[ino] = cachedAttr{a: *a, at: at}
}

// noteAttr stores attributes the server sent at for an object, current
// as of every change the mount made (see node.noteLocked).
func (c *entryCache) noteAttr(ino uint64, a *client.Attr, at time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.setAttrLocked(ino, a, at)
	c.mu.Unlock()
}

// dropAttr forgets an object's attributes, which may predate one of the
// mount's changes.
func (c *entryCache) dropAttr(ino uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	delete(c.attrs, ino)
	c.mu.Unlock()
}

// changedAttr forgets an object's attributes: the mount changed it.
func (c *entryCache) changedAttr(ino uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.gen++
	delete(c.attrs, ino)
	c.mu.Unlock()
}

// changedName forgets name in dir: the mount is adding, removing or
// renaming it. Operations call it before and after they send the change.
func (c *entryCache) changedName(dir uint64, name string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.gen++
	delete(c.names, entryKey{dir, name})
	delete(c.attrs, dir) // its mtime, size and link count
	c.mu.Unlock()
}

// created is changedName for an operation that made name in dir, with
// the new object's handle and attributes, sent by the server at.
func (c *entryCache) created(dir uint64, name string, fh []byte, a *client.Attr, at time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.gen++
	delete(c.attrs, dir)
	c.putLocked(dir, name, fh, a, at)
	c.mu.Unlock()
}

// notFound records a lookup of a name dir does not have: the run of
// lookups that would read the directory ends (creating files asks for
// each new name first).
func (c *entryCache) notFound(dir uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if r := c.misses[dir]; r != nil {
		r.n = 0
	}
	c.mu.Unlock()
}

// missed records a lookup of an existing name in dir that the cache could
// not answer and reports whether the caller should read the directory
// into the cache now (fillDir, which ends the read).
func (c *entryCache) missed(dir uint64) bool {
	if c == nil {
		return false
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.misses[dir]
	if r == nil {
		if len(c.misses) >= c.max {
			clear(c.misses)
		}
		r = &missRun{}
		c.misses[dir] = r
	}
	if now.Sub(r.last) > missWindow {
		r.n = 0
	}
	r.n++
	r.last = now
	if r.n < readdirAfter || r.busy || now.Sub(r.filled) < missWindow {
		return false
	}
	r.busy = true
	return true
}

// fill stores a directory listing read after gen, and ends the read
// missed started.
func (c *entryCache) fill(dir uint64, ents []client.DirEntry, at time.Time, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.misses[dir]; r != nil {
		r.busy, r.filled, r.n = false, time.Now(), 0
	}
	c.listedLocked(dir, ents, at, gen)
}

// listed stores a directory listing read after gen for a READDIR of the
// kernel (ls -l), whose stat(2)s may follow after the kernel forgot.
func (c *entryCache) listed(dir uint64, ents []client.DirEntry, at time.Time, gen uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listedLocked(dir, ents, at, gen)
}

func (c *entryCache) listedLocked(dir uint64, ents []client.DirEntry, at time.Time, gen uint64) {
	if c.gen != gen {
		return
	}
	for i := range ents {
		e := &ents[i]
		if e.Handle == nil || e.Name == "." || e.Name == ".." {
			continue
		}
		c.putLocked(dir, e.Name, e.Handle, &e.Attr, at)
	}
}

// fillDir reads the directory n into the cache (see missed).
func (n *node) fillDir(ctx context.Context, c *client.Client) {
	ec := n.fsys.entries
	gen := ec.mark()
	at := time.Now()
	var ents []client.DirEntry
	if errno := n.withFH(ctx, c, func(fh []byte) (err error) {
		ents, err = c.ReadDirHandle(ctx, fh)
		return err
	}); errno != 0 {
		ents = nil
	}
	ec.fill(n.StableAttr().Ino, ents, at, gen)
}
