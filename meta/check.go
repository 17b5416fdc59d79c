package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
)

// Check is the metadata layer's fsck: it reads the whole database in one
// read transaction (one consistent snapshot) and reports every way the
// namespace disagrees with itself. Every Engine change is one
// transaction that keeps all of these rules, so a database that only
// ever saw whole transactions, in any prefix of their commit order (what
// recovery after a machine crash leaves), passes; a problem means a
// transaction was torn, a record damaged, or a bug.
//
// The rules, by the Problem kind that reports a broken one:
//
//   - bad-record: a record does not decode, or its key has the wrong
//     length for its table; unknown-key: a key of no known table;
//   - dangling-entry: a directory entry names an inode that does not exist
//     (or lives in a parent that is not a directory); entry-type: it
//     records another type than the inode's;
//   - entry-index: an entry and the readdir index ('S') disagree (one
//     without the other, or another sequence number), or its sequence
//     number is not below the directory's next one;
//   - nlink: a file's link count differs from the entries that name it, or
//     a directory's from 2 plus its subdirectories;
//   - unlinked-inode: an inode that no entry names (other than the root)
//     and that is not a file kept as an orphan (the 'O' set), or an
//     orphan mark on an inode that is missing or still linked;
//   - dir-links: a directory named by more than one entry, or whose
//     parent pointer is not the directory that names it;
//   - unreachable: a directory whose parent pointers do not lead to the
//     root (a cycle cut off from the tree);
//   - record-without-inode: a symlink target, stripe map, inline data,
//     policy or extended-attribute record whose inode is gone, or of an
//     inode of a type that cannot have one; symlink: a symlink without
//     its target, or whose size is not the target's length;
//   - counter: the inodes-in-use counter differs from the number of
//     inodes, or the next inode number is not above every inode;
//   - unreferenced-data-object: a data object (CheckOptions.DataObjects)
//     of an inode that does not exist or is not a regular file.
//
// Client records, configuration values and replay records carry no
// namespace rules and are not checked. Check holds what it needs per
// inode and per entry in memory (some tens of bytes each), so checking a
// namespace of millions of files takes hundreds of MB.
func Check(ctx context.Context, e Engine, opts CheckOptions) (CheckReport, error) {
	k, ok := e.(*kvEngine)
	if !ok {
		return CheckReport{}, fmt.Errorf("meta: check: engine %T is not one of this package's", e)
	}
	if opts.MaxProblems <= 0 {
		opts.MaxProblems = 1000
	}
	c := &checker{opts: opts}
	err := k.view(ctx, func(x *tx) error {
		c.reset()
		return c.scan(x.t)
	})
	if err != nil {
		return CheckReport{}, fmt.Errorf("meta: check: %w", err)
	}
	c.verify()
	return c.rep, nil
}

// CheckOptions tunes Check.
type CheckOptions struct {
	// DataObjects are the inode numbers of the data objects found in the
	// server's data store (`shoal serve` keeps one file per regular file
	// that has data), for the unreferenced-data-object rule. Nil skips
	// it.
	DataObjects []Ino
	// MaxProblems bounds the problems reported (default 1000); the
	// report says how many more there were.
	MaxProblems int
}

// CheckReport is what Check found.
type CheckReport struct {
	Inodes      uint64 // inode records, orphans included
	Directories uint64
	Entries     uint64 // directory entries
	Orphans     uint64 // unlinked files kept until freed
	DataObjects uint64 // data objects checked
	Problems    []Problem
	// Omitted counts problems found beyond CheckOptions.MaxProblems.
	Omitted int
}

// OK reports whether the check found no problem.
func (r CheckReport) OK() bool { return len(r.Problems) == 0 && r.Omitted == 0 }

// Problem is one inconsistency.
type Problem struct {
	// Kind names the rule broken (see Check), for example
	// "dangling-entry".
	Kind string
	// Ino is the inode the problem is about (0 if none).
	Ino Ino
	// Detail says what was found, for a person.
	Detail string
}

func (p Problem) String() string {
	if p.Ino != 0 {
		return fmt.Sprintf("%s: inode %d: %s", p.Kind, p.Ino, p.Detail)
	}
	return p.Kind + ": " + p.Detail
}

// checkInode is what Check keeps of one inode.
type checkInode struct {
	typ     FileType
	nlink   uint32
	parent  Ino
	size    uint64
	nextSeq uint64
	entries uint32 // entries naming it
	subdirs uint32 // for directories: entries of type directory in it
	entryIn Ino    // for directories: the directory whose entry names it
	orphan  bool
	symlink bool // has its target record
}

type checkEntry struct {
	dir Ino
	seq uint64
	ino Ino
	typ FileType
}

type checker struct {
	opts     CheckOptions
	rep      CheckReport
	inodes   map[Ino]*checkInode
	entries  []checkEntry
	names    map[nameKey]uint64 // (dir, name) → seq of its entry
	index    map[[2]uint64]string
	orphans  []Ino
	records  []checkRecord // records that belong to an inode
	nextIno  uint64
	files    uint64
	counters int
}

type checkRecord struct {
	table byte
	ino   Ino
	size  int
}

func (c *checker) reset() {
	c.rep = CheckReport{}
	c.inodes = map[Ino]*checkInode{}
	c.entries = nil
	c.names = map[nameKey]uint64{}
	c.index = map[[2]uint64]string{}
	c.orphans = nil
	c.records = nil
	c.nextIno, c.files, c.counters = 0, 0, 0
}

func (c *checker) problem(kind string, ino Ino, format string, args ...any) {
	if len(c.rep.Problems) >= c.opts.MaxProblems {
		c.rep.Omitted++
		return
	}
	c.rep.Problems = append(c.rep.Problems, Problem{Kind: kind, Ino: ino, Detail: fmt.Sprintf(format, args...)})
}

// tableNames names the per-inode tables in problems.
var tableNames = map[byte]string{
	pSymlink: "symlink target",
	pStripe:  "stripe map",
	pInline:  "inline data",
	pPolicy:  "policy",
	pXattr:   "extended attributes",
}

// scan reads every key once.
func (c *checker) scan(t kvTxn) error {
	return t.Scan([]byte{}, nil, func(k, v []byte) bool {
		if len(k) == 0 {
			c.problem("unknown-key", 0, "empty key")
			return true
		}
		switch k[0] {
		case pInode:
			c.inode(k, v)
		case pDentry:
			c.dentry(k, v)
		case pSeq:
			if len(k) != 17 {
				c.problem("bad-record", 0, "index key %x", k)
				return true
			}
			c.index[[2]uint64{be.Uint64(k[1:]), be.Uint64(k[9:])}] = string(v)
		case pOrphan:
			if len(k) != 9 {
				c.problem("bad-record", 0, "orphan key %x", k)
				return true
			}
			c.orphans = append(c.orphans, Ino(be.Uint64(k[1:])))
		case pSymlink, pStripe, pInline, pPolicy, pXattr:
			if len(k) != 9 {
				c.problem("bad-record", 0, "%s key %x", tableNames[k[0]], k)
				return true
			}
			c.records = append(c.records, checkRecord{table: k[0], ino: Ino(be.Uint64(k[1:])), size: len(v)})
		case pCounter:
			c.counter(k, v)
		case pConfig, pClient, pReplay:
		default:
			c.problem("unknown-key", 0, "key %q", k)
		}
		return true
	})
}

func (c *checker) inode(k, v []byte) {
	if len(k) != 9 {
		c.problem("bad-record", 0, "inode key %x", k)
		return
	}
	ino := Ino(be.Uint64(k[1:]))
	n, err := decodeInode(v)
	if err != nil {
		c.problem("bad-record", ino, "inode record: %v", err)
		return
	}
	c.inodes[ino] = &checkInode{typ: n.Type, nlink: n.Nlink, parent: n.Parent, size: n.Size, nextSeq: n.nextSeq}
}

func (c *checker) dentry(k, v []byte) {
	if len(k) < 10 {
		c.problem("bad-record", 0, "entry key %x", k)
		return
	}
	dir, name := Ino(be.Uint64(k[1:])), string(k[9:])
	d, err := decodeDentry(v)
	if err != nil {
		c.problem("bad-record", dir, "entry %q: %v", name, err)
		return
	}
	c.entries = append(c.entries, checkEntry{dir: dir, seq: d.seq, ino: d.ino, typ: d.typ})
	c.names[nameKey{dir, name}] = d.seq
}

func (c *checker) counter(k, v []byte) {
	switch {
	case bytes.Equal(k, keyNextIno) && len(v) == 8:
		c.nextIno = be.Uint64(v)
		c.counters++
	case bytes.Equal(k, keyFiles) && len(v) == 8:
		c.files = be.Uint64(v)
		c.counters++
	default:
		c.problem("bad-record", 0, "counter %q (%d bytes)", k, len(v))
	}
}

// verify checks the rules over what scan read.
func (c *checker) verify() {
	c.rep.Inodes = uint64(len(c.inodes))
	c.rep.Entries = uint64(len(c.names))

	// Entries: their inode, their type, their index record.
	names := make([]nameKey, 0, len(c.names))
	for nk := range c.names {
		names = append(names, nk)
	}
	// Map order is random; reports are easier to compare sorted.
	slices.SortFunc(names, func(a, b nameKey) int {
		if a.parent != b.parent {
			return cmpIno(a.parent, b.parent)
		}
		return bytes.Compare([]byte(a.name), []byte(b.name))
	})
	for _, nk := range names {
		seq := c.names[nk]
		if got, ok := c.index[[2]uint64{uint64(nk.parent), seq}]; !ok || got != nk.name {
			c.problem("entry-index", nk.parent, "entry %q (sequence %d) has no readdir index record", nk.name, seq)
		}
		if dir := c.inodes[nk.parent]; dir != nil && dir.typ == TypeDirectory && seq >= max(dir.nextSeq, FirstCookie) {
			c.problem("entry-index", nk.parent, "entry %q has sequence %d, not below the directory's next %d", nk.name, seq, dir.nextSeq)
		}
	}
	for key, name := range c.index {
		if seq, ok := c.names[nameKey{Ino(key[0]), name}]; !ok || seq != key[1] {
			c.problem("entry-index", Ino(key[0]), "readdir index record %d names %q, which has no entry with that sequence", key[1], name)
		}
	}
	slices.SortFunc(c.entries, func(a, b checkEntry) int {
		if a.dir != b.dir {
			return cmpIno(a.dir, b.dir)
		}
		return cmpUint(a.seq, b.seq)
	})
	for _, en := range c.entries {
		dir := c.inodes[en.dir]
		if dir == nil || dir.typ != TypeDirectory {
			c.problem("dangling-entry", en.dir, "entry (sequence %d, inode %d) in a parent that is not a directory", en.seq, en.ino)
			continue
		}
		n := c.inodes[en.ino]
		if n == nil {
			c.problem("dangling-entry", en.ino, "named by an entry of directory %d (sequence %d) but has no inode record", en.dir, en.seq)
			continue
		}
		if n.typ != en.typ {
			c.problem("entry-type", en.ino, "entry in directory %d says %s, inode is %s", en.dir, en.typ, n.typ)
		}
		n.entries++
		if n.typ == TypeDirectory {
			dir.subdirs++
			if n.entryIn != 0 && n.entryIn != en.dir {
				c.problem("dir-links", en.ino, "directory named in both %d and %d", n.entryIn, en.dir)
			}
			n.entryIn = en.dir
		}
	}

	// Orphan marks.
	for _, ino := range c.orphans {
		n := c.inodes[ino]
		switch {
		case n == nil:
			c.problem("unlinked-inode", ino, "orphan mark of an inode that does not exist")
		case n.typ != TypeRegular || n.nlink != 0:
			c.problem("unlinked-inode", ino, "orphan mark on a %s with %d links", n.typ, n.nlink)
		default:
			n.orphan = true
			c.rep.Orphans++
		}
	}

	// Records that belong to an inode.
	for _, r := range c.records {
		n := c.inodes[r.ino]
		what := tableNames[r.table]
		if n == nil {
			c.problem("record-without-inode", r.ino, "%s record of an inode that does not exist", what)
			continue
		}
		okType := true
		switch r.table {
		case pSymlink:
			okType = n.typ == TypeSymlink
			if okType {
				n.symlink = true
				if uint64(r.size) != n.size {
					c.problem("symlink", r.ino, "size %d, target %d bytes", n.size, r.size)
				}
			}
		case pStripe, pInline:
			okType = n.typ == TypeRegular
		case pPolicy:
			okType = inherits(n.typ)
		}
		if !okType {
			c.problem("record-without-inode", r.ino, "%s record of a %s", what, n.typ)
		}
	}

	// Inodes: link counts, reachability.
	inos := make([]Ino, 0, len(c.inodes))
	for ino := range c.inodes {
		inos = append(inos, ino)
	}
	slices.Sort(inos)
	maxIno := Ino(0)
	for _, ino := range inos {
		n := c.inodes[ino]
		maxIno = max(maxIno, ino)
		switch {
		case n.typ == TypeDirectory:
			c.rep.Directories++
			c.checkDir(ino, n)
		case ino == RootIno:
			c.problem("bad-record", ino, "the root is a %s", n.typ)
		case n.nlink == 0:
			if !n.orphan {
				c.problem("unlinked-inode", ino, "%s with no links and no orphan mark", n.typ)
			}
			if n.entries != 0 {
				c.problem("nlink", ino, "%s with no links is named by %d entries", n.typ, n.entries)
			}
		case n.entries == 0:
			c.problem("unlinked-inode", ino, "%s with %d links is named by no entry", n.typ, n.nlink)
		case n.entries != n.nlink:
			c.problem("nlink", ino, "%s has %d links, %d entries name it", n.typ, n.nlink, n.entries)
		}
		if n.typ == TypeSymlink && !n.symlink {
			c.problem("symlink", ino, "symlink without its target record")
		}
	}
	if _, ok := c.inodes[RootIno]; !ok && len(c.inodes) > 0 {
		c.problem("unreachable", RootIno, "the root directory has no inode record")
	}

	// Counters.
	if c.counters != 2 && len(c.inodes) > 0 {
		c.problem("counter", 0, "%d of the 2 counters present", c.counters)
	} else if len(c.inodes) > 0 {
		if c.files != uint64(len(c.inodes)) {
			c.problem("counter", 0, "inodes in use counted %d, %d inode records", c.files, len(c.inodes))
		}
		if c.nextIno <= uint64(maxIno) {
			c.problem("counter", maxIno, "next inode number %d is not above the largest in use", c.nextIno)
		}
	}

	// Data objects.
	c.rep.DataObjects = uint64(len(c.opts.DataObjects))
	for _, ino := range c.opts.DataObjects {
		n := c.inodes[ino]
		switch {
		case n == nil:
			c.problem("unreferenced-data-object", ino, "data object of an inode that does not exist")
		case n.typ != TypeRegular:
			c.problem("unreferenced-data-object", ino, "data object of a %s", n.typ)
		}
	}
}

// checkDir checks a directory's links and its path to the root.
func (c *checker) checkDir(ino Ino, n *checkInode) {
	if n.nlink != 2+n.subdirs {
		c.problem("nlink", ino, "directory has %d links and %d subdirectories", n.nlink, n.subdirs)
	}
	if ino == RootIno {
		if n.entries != 0 || n.parent != RootIno {
			c.problem("dir-links", ino, "root named by %d entries, parent %d", n.entries, n.parent)
		}
		return
	}
	if n.entries == 0 {
		if n.nlink != 0 { // a removed directory is deleted, never kept
			c.problem("unlinked-inode", ino, "directory named by no entry")
		} else {
			c.problem("unlinked-inode", ino, "directory with no links still stored")
		}
		return
	}
	if n.entries > 1 {
		c.problem("dir-links", ino, "directory named by %d entries", n.entries)
	}
	if n.entryIn != n.parent {
		c.problem("dir-links", ino, "parent pointer %d, named in directory %d", n.parent, n.entryIn)
	}
	// Follow parent pointers to the root; more hops than directories
	// means a cycle.
	p, hops := n.parent, 0
	for p != RootIno {
		pn := c.inodes[p]
		if pn == nil || pn.typ != TypeDirectory || hops > len(c.inodes) {
			c.problem("unreachable", ino, "parent chain does not lead to the root (stops at %d)", p)
			return
		}
		p = pn.parent
		hops++
	}
}

func cmpIno(a, b Ino) int { return cmpUint(uint64(a), uint64(b)) }

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ErrInconsistent is wrapped by CheckReport.Err.
var ErrInconsistent = errors.New("meta: namespace inconsistent")

// Err returns nil if the check passed, else an error wrapping
// ErrInconsistent that lists the first problems.
func (r CheckReport) Err() error {
	if r.OK() {
		return nil
	}
	var b bytes.Buffer
	for i, p := range r.Problems {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more", len(r.Problems)-10+r.Omitted)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return fmt.Errorf("%w: %d problems: %s", ErrInconsistent, len(r.Problems)+r.Omitted, b.String())
}
