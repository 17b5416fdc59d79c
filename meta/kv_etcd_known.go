package meta

import "errors"

// What the engine knows of the store, carried from one round to the next.
//
// A round of Updates (tryBatch) reads at one snapshot revision and
// commits on the condition that the generation key was not changed since
// that snapshot. Every commit of every engine on the prefix changes the
// generation key. So when a round commits, the state right after it is
// exactly the round's snapshot as read, plus the round's writes: nobody
// else changed a key in between, or the commit would have failed. The
// engine keeps that (etcdKV.known: the values read and written, absent
// keys included, and gen's mod revision in that state, knownGen), and the
// next round whose snapshot has the same generation (the round starts
// from the commit's revision, or reads gen and finds it unchanged) starts
// its reads there instead of asking etcd again. A remove after the create
// of the same file then reads nothing: the parent, the entry and the
// inode are all known.
//
// Nothing is trusted beyond what the commit condition checks anyway: if
// another process committed meanwhile, the round's generation differs
// and the known state is dropped (snapshot read fresh), or, when the
// round started from the last commit's revision without reading gen, its
// commit meets a moved generation and fails, and the round runs again on
// a fresh snapshot, as any conflict does. A round whose calls all fail
// without writing answers from the known state just as it would from a
// snapshot read at the last commit's revision, which is what the engine
// read before (snapRev). Any round that does not end in a commit whose
// revision is known (a conflict, a refusal, a lost reply however
// resolved) drops it.

// Creates go one step further. A create reads its parent, the counters
// and the parent's policy, all known after the engine's last create in
// that directory, and the new name's entry, which is not known since
// nobody had it. A round of one call (a lone update, so no other call's
// result can depend on it) therefore takes entries it has neither read
// nor written as absent, and its commit carries the check: etcd compares
// each such key's create revision with 0, which holds only if the key
// does not exist. A create of a new name is then one request, the
// commit. If the assumption was wrong (the name exists), the commit
// fails, and its Else branch (gen's mod revision) tells that apart from a
// conflict: the round runs again at once on the same snapshot, reading
// the entry, and the create answers "exists" as before. A call that
// fails or writes nothing after assuming (a remove of a name the engine
// does not know, which reads as absent) gets no commit to check it, so it
// runs again reading too, before anything is answered (errAssumed).

// errAssumed ends a round whose result rests on an entry assumed absent
// that no commit checked, or that the commit found present: the round
// runs again, reading what it assumed.
var errAssumed = errors.New("meta: etcd: an entry assumed absent needs reading")

// etcdKnownMax bounds the known state; past it, the next round starts
// afresh.
const etcdKnownMax = 1 << 16

// knownFor returns the reads a round at a snapshot whose generation key
// has mod revision genRev may start from, and forgets them (a round that
// does not commit must not leave them behind).
func (s *etcdKV) knownFor(genRev int64) *snapReads {
	k := s.known
	s.known = nil
	if k == nil || s.knownGen != genRev || genRev == 0 {
		return &snapReads{}
	}
	return k
}

// keep records reads, with writes applied, as the state at the commit
// whose revision (and so gen's mod revision) is rev.
func (s *etcdKV) keep(reads *snapReads, writes map[string]etcdWrite, rev int64) {
	reads.mu.Lock()
	defer reads.mu.Unlock()
	if len(reads.m)+len(writes) > etcdKnownMax {
		return
	}
	if reads.m == nil {
		reads.m = make(map[string][]byte, len(writes))
	}
	for k, w := range writes {
		if w.del {
			reads.m[k] = nil
		} else {
			reads.m[k] = w.val
		}
	}
	s.known, s.knownGen = reads, rev
}
