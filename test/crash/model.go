package crash

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"time"
)

// opKind is one namespace change of the workload.
type opKind int

const (
	opMkdir opKind = iota
	opCreate
	opRename
	opRemove
	opRmdir
)

func (k opKind) String() string {
	return [...]string{"mkdir", "create", "rename", "remove", "rmdir"}[k]
}

// op is one change, in the order a worker made it. Paths are relative to
// the export's root.
type op struct {
	kind     opKind
	path     string
	to       string // rename
	data     bool   // create: 64 bytes written and committed before the ack
	ino      uint64 // create with data: the file's inode number
	sent     time.Time
	acked    time.Time // zero: no answer before the kill
	ackedSeq int       // order of the ack among all of the round's acks
}

// tree is a namespace as the model sees it: path → is a directory.
type tree map[string]bool

// apply changes t as op does.
func (t tree) apply(o op) {
	switch o.kind {
	case opMkdir:
		t[o.path] = true
	case opCreate:
		t[o.path] = false
	case opRename:
		t[o.to] = t[o.path]
		delete(t, o.path)
	case opRemove, opRmdir:
		delete(t, o.path)
	}
}

// entryHash is one entry's share of a tree's hash; a tree's hash is the
// XOR of its entries', so applying an op updates it in O(1).
func entryHash(p string, dir bool) uint64 {
	h := fnv.New64a()
	h.Write([]byte(p))
	if dir {
		h.Write([]byte{'/'})
	}
	return h.Sum64()
}

func (t tree) hash() uint64 {
	var x uint64
	for p, d := range t {
		x ^= entryHash(p, d)
	}
	return x
}

// worker generates one worker's changes inside its own directory, from
// the model of what it has done so far (each op is sent only after the
// previous one was answered, so the model is exact until the kill).
type worker struct {
	root string // "rN/wM"
	rnd  *rand.Rand
	now  tree // the model after every op sent
	n    int
	ops  []op
}

func newWorker(root string, seed uint64) *worker {
	return &worker{root: root, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), now: tree{}}
}

// next picks the next change: the worker's directory first, then mostly
// creates, renames and removes, with some directories to move files
// between.
func (w *worker) next() op {
	w.n++
	if w.n == 1 {
		return op{kind: opMkdir, path: w.root}
	}
	var files, dirs, emptyDirs []string
	for p, d := range w.now {
		if d {
			dirs = append(dirs, p)
		} else {
			files = append(files, p)
		}
	}
	slices.Sort(files)
	slices.Sort(dirs)
	for _, d := range dirs {
		if d == w.root {
			continue
		}
		empty := true
		for p := range w.now {
			if strings.HasPrefix(p, d+"/") {
				empty = false
				break
			}
		}
		if empty {
			emptyDirs = append(emptyDirs, d)
		}
	}
	dir := dirs[w.rnd.IntN(len(dirs))]
	name := fmt.Sprintf("%s/n%d", dir, w.n)
	r := w.rnd.IntN(100)
	switch {
	case r < 8 && len(dirs) < 12:
		return op{kind: opMkdir, path: name}
	case r < 12 && len(emptyDirs) > 0:
		return op{kind: opRmdir, path: emptyDirs[w.rnd.IntN(len(emptyDirs))]}
	case r < 55 || len(files) < 3:
		return op{kind: opCreate, path: name, data: w.rnd.IntN(8) == 0}
	case r < 80:
		return op{kind: opRename, path: files[w.rnd.IntN(len(files))], to: name}
	default:
		return op{kind: opRemove, path: files[w.rnd.IntN(len(files))]}
	}
}

// matchResult is how one worker's directory after the crash compares
// with its changes.
type matchResult struct {
	prefix int  // the ops whose effects are there: ops[:prefix]
	found  bool // some prefix explains the directory
	acked  int  // ops answered before the kill
	sent   int
}

// match finds the prefixes of w's ops that give exactly the entries found
// under w.root (found holds the whole export's tree; only w.root and what
// is below it count). It returns the longest.
func (w *worker) match(found tree) matchResult {
	mine := tree{}
	for p, d := range found {
		if p == w.root || strings.HasPrefix(p, w.root+"/") {
			mine[p] = d
		}
	}
	want := mine.hash()
	res := matchResult{sent: len(w.ops)}
	for _, o := range w.ops {
		if !o.acked.IsZero() {
			res.acked++
		}
	}
	t := tree{}
	h := uint64(0)
	check := func(k int) {
		if h == want && maps.Equal(t, mine) {
			res.prefix, res.found = k, true
		}
	}
	check(0)
	for i, o := range w.ops {
		// Update the hash by the entries the op changes.
		switch o.kind {
		case opMkdir, opCreate:
			h ^= entryHash(o.path, o.kind == opMkdir)
		case opRename:
			d := t[o.path]
			h ^= entryHash(o.path, d) ^ entryHash(o.to, d)
		case opRemove, opRmdir:
			h ^= entryHash(o.path, t[o.path])
		}
		t.apply(o)
		check(i + 1)
	}
	return res
}

// parentOf is path's directory.
func parentOf(p string) string { return path.Dir(p) }
