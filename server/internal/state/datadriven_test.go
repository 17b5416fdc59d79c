package state

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/shoalfs/shoal/pnfs"
)

// errNames maps sentinels to the NFS4ERR names used in testdata.
var errNames = []struct {
	err  error
	name string
}{
	{ErrStaleClientID, "NFS4ERR_STALE_CLIENTID"}, {ErrClidInUse, "NFS4ERR_CLID_INUSE"},
	{ErrClientidBusy, "NFS4ERR_CLIENTID_BUSY"}, {ErrNoEnt, "NFS4ERR_NOENT"},
	{ErrNotSame, "NFS4ERR_NOT_SAME"}, {ErrPerm, "NFS4ERR_PERM"},
	{ErrBadSession, "NFS4ERR_BADSESSION"}, {ErrBadSlot, "NFS4ERR_BADSLOT"},
	{ErrSeqMisordered, "NFS4ERR_SEQ_MISORDERED"}, {ErrRetryUncachedRep, "NFS4ERR_RETRY_UNCACHED_REP"},
	{ErrSeqFalseRetry, "NFS4ERR_SEQ_FALSE_RETRY"}, {ErrRepTooBigToCache, "NFS4ERR_REP_TOO_BIG_TO_CACHE"},
	{ErrDelay, "NFS4ERR_DELAY"}, {pnfs.ErrBadStateid, "NFS4ERR_BAD_STATEID"},
	{pnfs.ErrOldStateid, "NFS4ERR_OLD_STATEID"}, {pnfs.ErrStaleStateid, "NFS4ERR_STALE_STATEID"},
	{pnfs.ErrExpired, "NFS4ERR_EXPIRED"}, {ErrShareDenied, "NFS4ERR_SHARE_DENIED"},
	{ErrLocked, "NFS4ERR_LOCKED"}, {ErrDenied, "NFS4ERR_DENIED"},
	{ErrLocksHeld, "NFS4ERR_LOCKS_HELD"}, {pnfs.ErrOpenMode, "NFS4ERR_OPENMODE"},
	{ErrInval, "NFS4ERR_INVAL"}, {ErrGrace, "NFS4ERR_GRACE"},
	{ErrNoGrace, "NFS4ERR_NO_GRACE"}, {ErrReclaimBad, "NFS4ERR_RECLAIM_BAD"},
	{ErrCompleteAlready, "NFS4ERR_COMPLETE_ALREADY"}, {ErrServerFault, "NFS4ERR_SERVERFAULT"},
	{ErrDelegRevoked, "NFS4ERR_DELEG_REVOKED"},
	{ErrRecallConflict, "NFS4ERR_RECALLCONFLICT"}, {ErrLayoutTryLater, "NFS4ERR_LAYOUTTRYLATER"},
	{ErrNoMatchingLayout, "NFS4ERR_NOMATCHING_LAYOUT"}, {ErrBadLayout, "NFS4ERR_BADLAYOUT"},
}

func errName(err error) string {
	var re *RecallError
	if errors.As(err, &re) {
		// Which recalls go out now is part of what the scripts check;
		// the dispatcher answers NFS4ERR_DELAY.
		var out []string
		for _, h := range re.Holders {
			out = append(out, fmt.Sprintf("%v@%d", h.Type, h.File))
		}
		return fmt.Sprintf("NFS4ERR_DELAY recall=[%s]", strings.Join(out, " "))
	}
	var d *LockDeniedError
	if errors.As(err, &d) {
		l := strconv.FormatUint(d.Length, 10)
		if d.Length == LengthToEOF {
			l = "EOF"
		}
		return fmt.Sprintf("NFS4ERR_DENIED offset=%d length=%s type=%v owner=%s", d.Offset, l, d.Type, d.Owner.Owner)
	}
	for _, e := range errNames {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return "unexpected: " + err.Error()
}

// ddState is the world of one testdata file. Clients, sessions, held
// slots and stateids are referred to by names chosen in the file.
type ddState struct {
	h        *harness
	clients  map[string]ClientID
	seqs     map[string]uint32 // eir_sequenceid per client name
	sessions map[string]*Session
	slots    map[string]*Slot // "session/slot"
	sids     map[string]Stateid
	nextSid  map[string]int
	since    uint64            // the last break-seq
	sizes    map[FileID]uint64 // file sizes grown by accepted LAYOUTCOMMITs
	revoked  int               // how many of h.revoked were reported
}

func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		d := &ddState{
			h:        newHarness(t),
			clients:  map[string]ClientID{},
			seqs:     map[string]uint32{},
			sessions: map[string]*Session{},
			slots:    map[string]*Slot{},
			sids:     map[string]Stateid{},
			nextSid:  map[string]int{},
			sizes:    map[FileID]uint64{},
		}
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			out, err := d.run(t, td)
			if err != nil {
				return errName(err) + "\n"
			}
			return out + "\n"
		})
	})
}

func arg(t *testing.T, td *datadriven.TestData, key string) string {
	t.Helper()
	a, ok := td.Arg(key)
	if !ok || len(a.Vals) == 0 {
		t.Fatalf("%s: missing %s=", td.Pos, key)
	}
	return a.Vals[0]
}

func optArg(td *datadriven.TestData, key, def string) string {
	if a, ok := td.Arg(key); ok && len(a.Vals) > 0 {
		return a.Vals[0]
	}
	return def
}

func num(t *testing.T, s string) uint64 {
	t.Helper()
	if s == "EOF" {
		return LengthToEOF
	}
	n, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		t.Fatalf("bad number %q", s)
	}
	return n
}

func access(s string) uint32 {
	var v uint32
	if strings.Contains(s, "r") {
		v |= AccessRead
	}
	if strings.Contains(s, "w") {
		v |= AccessWrite
	}
	return v
}

func lockType(t *testing.T, s string) LockType {
	for lt := ReadLock; lt <= WriteWLock; lt++ {
		if lt.String() == s {
			return lt
		}
	}
	t.Fatalf("bad lock type %q", s)
	return 0
}

// stateid returns a named stateid, with its seqid overridden by seqid=.
func (d *ddState) stateid(t *testing.T, td *datadriven.TestData) Stateid {
	name := arg(t, td, "stateid")
	s, ok := d.sids[name]
	switch name {
	case "anon":
		s, ok = AnonymousStateid, true
	case "bypass":
		s, ok = ReadBypassStateid, true
	}
	if !ok {
		t.Fatalf("unknown stateid %s", name)
	}
	if v := optArg(td, "seqid", ""); v != "" {
		s.Seqid = uint32(num(t, v))
	}
	return s
}

// name gives a stateid a stable name: the prefix plus a counter, reused
// for the same "other".
func (d *ddState) name(prefix string, s Stateid) string {
	for n, v := range d.sids {
		if v.Other == s.Other && strings.HasPrefix(n, prefix) {
			d.sids[n] = s
			return n
		}
	}
	d.nextSid[prefix]++
	n := fmt.Sprintf("%s%d", prefix, d.nextSid[prefix])
	d.sids[n] = s
	return n
}

func (d *ddState) client(t *testing.T, td *datadriven.TestData) ClientID {
	return d.clients[arg(t, td, "client")]
}

func (d *ddState) run(t *testing.T, td *datadriven.TestData) (string, error) {
	ctx := context.Background()
	m := d.h.m
	switch td.Cmd {
	case "exchange-id":
		name := arg(t, td, "client")
		r, err := m.ExchangeID(ctx, ExchangeIDArgs{
			OwnerID:   []byte(optArg(td, "owner", name)),
			Verifier:  [8]byte{byte(num(t, optArg(td, "verifier", "1")))},
			Principal: optArg(td, "principal", "p"),
			Update:    td.HasArg("update"),
		})
		if err != nil {
			return "", err
		}
		prev, known := d.clients[name]
		d.clients[name] = r.ClientID
		d.seqs[name] = r.SequenceID
		return fmt.Sprintf("seqid=%d confirmed=%v same-clientid=%v", r.SequenceID, r.Confirmed, known && prev == r.ClientID), nil
	case "create-session":
		name := arg(t, td, "client")
		seq := d.seqs[name]
		if v := optArg(td, "seq", ""); v != "" {
			seq = uint32(num(t, v))
		}
		r, err := m.CreateSession(ctx, CreateSessionArgs{
			ClientID:  d.clients[name],
			Sequence:  seq,
			Principal: optArg(td, "principal", "p"),
			Fore: ChannelAttrs{
				MaxRequestSize: 1 << 20, MaxResponseSize: 1 << 20, MaxOperations: 16,
				MaxRequests:           uint32(num(t, optArg(td, "slots", "2"))),
				MaxResponseSizeCached: uint32(num(t, optArg(td, "cached", "64"))),
			},
		})
		if err != nil {
			return "", err
		}
		sname := optArg(td, "session", "")
		if sname != "" {
			if old := d.sessions[sname]; old != nil && old.ID() != r.SessionID {
				return fmt.Sprintf("new session (replaces %s)", sname), nil
			}
			s, err := m.Session(r.SessionID)
			if err != nil {
				return "", err
			}
			d.sessions[sname] = s
		}
		return fmt.Sprintf("ok slots=%d cached=%d", r.Fore.MaxRequests, r.Fore.MaxResponseSizeCached), nil
	case "destroy-session":
		return "ok", m.DestroySession(d.sessions[arg(t, td, "session")].ID())
	case "destroy-clientid":
		return "ok", m.DestroyClientID(ctx, d.client(t, td))
	case "sequence":
		sname := arg(t, td, "session")
		slot := uint32(num(t, arg(t, td, "slot")))
		r, err := m.Sequence(SequenceArgs{
			SessionID:     d.sessions[sname].ID(),
			SlotID:        slot,
			SequenceID:    uint32(num(t, arg(t, td, "seqid"))),
			HighestSlotID: slot,
			RequestHash:   num(t, optArg(td, "hash", "0")),
		})
		if err != nil {
			return "", err
		}
		if r.Slot == nil {
			return fmt.Sprintf("replay %q", r.Replay), nil
		}
		d.slots[fmt.Sprintf("%s/%d", sname, slot)] = r.Slot
		return fmt.Sprintf("new highest=%d target=%d", r.HighestSlotID, r.TargetHighestSlotID), nil
	case "complete":
		key := fmt.Sprintf("%s/%s", arg(t, td, "session"), arg(t, td, "slot"))
		sl := d.slots[key]
		if sl == nil {
			t.Fatalf("no held slot %s", key)
		}
		delete(d.slots, key)
		return "ok", sl.Complete([]byte(strings.TrimSpace(td.Input)), td.HasArg("cache"))
	case "advance":
		dur, err := time.ParseDuration(arg(t, td, "by"))
		if err != nil {
			t.Fatal(err)
		}
		d.h.clock.Advance(dur)
		return "ok", nil
	case "sweep":
		before := len(d.h.purged)
		n := m.Sweep(ctx)
		var lines []string
		for _, p := range d.h.purged[before:] {
			lines = append(lines, fmt.Sprintf("purged %s (%v) files=%v", d.clientName(p.ClientID), p.Reason, p.Files))
		}
		d.h.mu.Lock()
		for _, id := range d.h.revoked[d.revoked:] {
			lines = append(lines, fmt.Sprintf("revoked layouts of %s", d.clientName(id)))
		}
		d.revoked = len(d.h.revoked)
		d.h.mu.Unlock()
		return fmt.Sprintf("swept %d", n) + prefixLines(lines), nil
	case "restart":
		d.h.restart(uint32(num(t, arg(t, td, "epoch"))))
		return fmt.Sprintf("grace=%v", d.h.m.InGrace()), nil
	case "renew":
		return "ok", m.Renew(d.client(t, td))
	case "in-grace":
		return fmt.Sprintf("grace=%v", m.InGrace()), nil
	case "reclaim-complete":
		return "ok", m.ReclaimComplete(d.client(t, td), td.HasArg("one-fs"))
	case "open":
		r, err := m.Open(OpenArgs{
			ClientID: d.client(t, td),
			Owner:    []byte(optArg(td, "owner", "o")),
			File:     FileID(num(t, arg(t, td, "file"))),
			Access:   access(arg(t, td, "access")),
			Deny:     access(optArg(td, "deny", "")),
			Reclaim:  td.HasArg("reclaim"),
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s seqid=%d access=%d deny=%d", d.name("open", r.Stateid), r.Stateid.Seqid, r.Access, r.Deny), nil
	case "downgrade":
		s, err := m.OpenDowngrade(d.client(t, td), d.stateid(t, td), access(arg(t, td, "access")), access(optArg(td, "deny", "")))
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s seqid=%d", d.name("open", s), s.Seqid), nil
	case "close":
		s, err := m.Close(d.client(t, td), d.stateid(t, td))
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("closed seqid=%d", s.Seqid), nil
	case "lock":
		a := LockArgs{
			ClientID: d.client(t, td),
			Type:     lockType(t, arg(t, td, "type")),
			Offset:   num(t, arg(t, td, "offset")),
			Length:   num(t, arg(t, td, "length")),
			Reclaim:  td.HasArg("reclaim"),
		}
		if o := optArg(td, "open", ""); o != "" {
			a.NewLockOwner = true
			a.OpenStateid = d.sids[o]
			a.LockOwner = []byte(arg(t, td, "lock-owner"))
		} else {
			a.LockStateid = d.stateid(t, td)
		}
		s, err := m.Lock(a)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s seqid=%d", d.name("lock", s), s.Seqid), nil
	case "locku":
		s, err := m.Unlock(d.client(t, td), d.stateid(t, td), num(t, arg(t, td, "offset")), num(t, arg(t, td, "length")))
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s seqid=%d", d.name("lock", s), s.Seqid), nil
	case "lockt":
		err := m.LockTest(LockTestArgs{
			ClientID:  d.client(t, td),
			File:      FileID(num(t, arg(t, td, "file"))),
			Type:      lockType(t, arg(t, td, "type")),
			Offset:    num(t, arg(t, td, "offset")),
			Length:    num(t, arg(t, td, "length")),
			LockOwner: []byte(arg(t, td, "lock-owner")),
		})
		return "ok", err
	case "io":
		write := arg(t, td, "op") == "write"
		return "ok", m.CheckIO(d.client(t, td), d.stateid(t, td), FileID(num(t, arg(t, td, "file"))), write)
	case "test-stateid":
		return errOK(m.TestStateid(d.client(t, td), []Stateid{d.stateid(t, td)})[0]), nil
	case "free-stateid":
		return "ok", m.FreeStateid(d.client(t, td), d.stateid(t, td))
	case "locks":
		return "[" + ranges(m, FileID(num(t, arg(t, td, "file")))) + "]", nil
	case "bind-back":
		// A back channel connection: the client can be called back.
		_, err := m.BindConnToSession(d.sessions[arg(t, td, "session")].ID(), new(int), ChannelBoth)
		return "ok", err
	case "delegate":
		typ := DelegRead
		if arg(t, td, "type") == "write" {
			typ = DelegWrite
		}
		var since uint64
		if td.HasArg("since") {
			since = d.since
		}
		g, why, err := m.Delegate(DelegArgs{ClientID: d.client(t, td), File: FileID(num(t, arg(t, td, "file"))),
			Type: typ, Fallback: td.HasArg("fallback"), Since: since})
		if err != nil {
			return "", err
		}
		if g.Type == 0 {
			return fmt.Sprintf("none why=%s", noDelegNames[why]), nil
		}
		return fmt.Sprintf("%s %v seqid=%d", d.name("deleg", g.Stateid), g.Type, g.Stateid.Seqid), nil
	case "break":
		release, err := m.BreakDelegations(d.client(t, td), FileID(num(t, arg(t, td, "file"))), td.HasArg("write"))
		if err != nil {
			return "", err
		}
		if !td.HasArg("hold") {
			release()
		}
		return "ok", nil
	case "break-seq":
		d.since = m.BreakSeq()
		return "ok", nil
	case "delegreturn":
		return "ok", m.DelegReturn(d.client(t, td), d.stateid(t, td), FileID(num(t, arg(t, td, "file"))))
	case "delegations":
		return fmt.Sprintf("%d", m.Delegations()), nil
	default:
		if out, ok, err := d.runLayout(t, td); ok {
			return out, err
		}
	}
	t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	return "", nil
}

var noDelegNames = map[NoDelegReason]string{
	NoDelegContention: "contention", NoDelegResource: "resource", NoDelegUpgrade: "upgrade",
}

func errOK(err error) string {
	if err == nil {
		return "ok"
	}
	return errName(err)
}

func (d *ddState) clientName(id ClientID) string {
	var names []string
	for n, c := range d.clients {
		if c == id {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return fmt.Sprintf("%#x", uint64(id))
	}
	return strings.Join(names, ",")
}

func prefixLines(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return "\n" + strings.Join(lines, "\n")
}

// layoutIOModes names the iomodes in testdata.
var layoutIOModes = map[string]uint32{"read": IOModeRead, "rw": IOModeRW, "any": IOModeAny}

func iomodeName(m uint32) string {
	for n, v := range layoutIOModes {
		if v == m {
			return n
		}
	}
	return fmt.Sprintf("iomode(%d)", m)
}

// holders prints the layouts a recall goes to, one per line, in a stable
// order: the client's name, the stateid's name and the seqid it carries.
func (d *ddState) holders(hs []LayoutHolder) string {
	lines := make([]string, 0, len(hs))
	for _, h := range hs {
		lines = append(lines, fmt.Sprintf("recall %s %s seqid=%d", d.clientName(h.ClientID), d.name("layout", h.Stateid), h.Stateid.Seqid))
	}
	sort.Strings(lines)
	return fmt.Sprintf("%d holders", len(hs)) + prefixLines(lines)
}

// runLayout runs the commands of layout state (RFC 8881 §12); ok is false
// for a command it does not know.
func (d *ddState) runLayout(t *testing.T, td *datadriven.TestData) (out string, ok bool, err error) {
	m := d.h.m
	file := func() FileID { return FileID(num(t, arg(t, td, "file"))) }
	switch td.Cmd {
	case "layoutget":
		mode, known := layoutIOModes[arg(t, td, "iomode")]
		if !known {
			t.Fatalf("%s: bad iomode", td.Pos)
		}
		s, err := m.LayoutGet(d.client(t, td), d.stateid(t, td), file(), mode)
		if err != nil {
			return "", true, err
		}
		return fmt.Sprintf("%s seqid=%d iomode=%s", d.name("layout", s), s.Seqid, iomodeName(m.LayoutIOMode(s))), true, nil
	case "layoutreturn":
		// LAYOUTRETURN4_FILE: Shoal's layouts cover the whole file, so
		// whatever range the client names returns the layout.
		_, present, err := m.LayoutReturnFile(d.client(t, td), d.stateid(t, td), file())
		if err != nil {
			return "", true, err
		}
		return fmt.Sprintf("ok present=%v", present), true, nil
	case "layoutreturn-all":
		return "ok", true, m.LayoutReturnAll(d.client(t, td))
	case "layoutcommit":
		// The size a LAYOUTCOMMIT may grow the file to (RFC 8881
		// §18.42.3): the last write offset plus one, never shrinking it,
		// and only under a stateid CheckLayoutCommit accepts.
		f := file()
		if err := m.CheckLayoutCommit(d.client(t, td), d.stateid(t, td), f); err != nil {
			return "", true, err
		}
		changed := false
		if lw := optArg(td, "last-write", ""); lw != "" {
			if end := num(t, lw) + 1; end > d.sizes[f] {
				d.sizes[f], changed = end, true
			}
		}
		return fmt.Sprintf("ok size=%d changed=%v", d.sizes[f], changed), true, nil
	case "layout-check":
		return "ok", true, m.CheckLayout(d.client(t, td), d.stateid(t, td), file())
	case "recall":
		return d.holders(m.BeginRecall(file())), true, nil
	case "recall-all":
		return d.holders(m.BeginRecallAll()), true, nil
	case "recall-nomatch":
		m.RecallNoMatch(d.client(t, td), file())
		return "ok", true, nil
	case "layouts":
		gone := "open"
		select {
		case <-m.LayoutsGone(file()):
			gone = "closed"
		default:
		}
		return fmt.Sprintf("held=%v write=%v gone=%s", m.HasLayouts(file()), m.HasWriteLayouts(file()), gone), true, nil
	case "layout-iomode":
		return iomodeName(m.LayoutIOMode(d.stateid(t, td))), true, nil
	case "ds-io":
		// A data server asks whether a stateid allows I/O (CheckIOAny).
		id, err := m.CheckIOAny(d.stateid(t, td), file(), arg(t, td, "op") == "write")
		if err != nil {
			return "", true, err
		}
		return "ok client=" + d.clientName(id), true, nil
	}
	return "", false, nil
}
