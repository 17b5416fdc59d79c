package failover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/wiring"
)

// The linearizability check: concurrent clients (Shoal's client, given
// every MDS address) put, get and delete a few files while the harness
// kills and pauses MDS nodes, an etcd member and a data server; the
// history the clients record is checked with porcupine against a model of
// the files' contents. A put writes a fresh temporary file and renames it
// over the key, so it takes effect at one instant (the rename) or not at
// all; a get reads the whole file; a delete removes it. An operation that
// failed may or may not have taken effect: it stays open to the end of
// the history (porcupine may place it anywhere after its call, or
// nowhere); a failed get is dropped (it changed nothing).

type linOp uint8

const (
	opPut linOp = iota
	opGet
	opDel
	opAcquire // a non-blocking write lock on lockKey; Val names the client
	opRelease
)

// emptyFile is what a get records for a file that exists but is empty.
const emptyFile = "<empty>"

// lockKey is the file whose byte 0 the clients lock: its register holds
// the holder's name ("" free).
const lockKey = "/lin/lock"

type linIn struct {
	Op     linOp
	Key    string
	Val    string // put's value
	Client int    // who sent it (history.add sets it)
}

type linOut struct {
	Unknown bool   // the operation failed: its effect is unknown
	Val     string // get's value ("" absent)
	Existed bool   // del: the file was there
	Granted bool   // acquire: the lock was granted
	// Exposing marks a del that succeeded right before a leader died:
	// its replay record may survive. Uncertain marks a later del of the
	// same key by the same client: a surviving record may answer it
	// (success, once) while the name is absent. See history.replayable.
	Exposing, Uncertain bool
}

// linState is a key's register ("": no such file) and the replay records
// that may survive for it: the IDs of their clients, sorted, as a string
// so that the state stays comparable.
type linState struct {
	Val     string
	Records string
}

// withRecord adds a surviving record of client c.
func (s linState) withRecord(c int) linState {
	ids := []string{strconv.Itoa(c)}
	if s.Records != "" {
		ids = append(ids, strings.Split(s.Records, ",")...)
	}
	sort.Strings(ids)
	s.Records = strings.Join(ids, ",")
	return s
}

// takeRecord uses up a surviving record of client c, if there is one.
func (s linState) takeRecord(c int) (linState, bool) {
	if s.Records == "" {
		return s, false
	}
	ids := strings.Split(s.Records, ",")
	for i, id := range ids {
		if id == strconv.Itoa(c) {
			s.Records = strings.Join(append(ids[:i:i], ids[i+1:]...), ",")
			return s, true
		}
	}
	return s, false
}

// linModel is a register per key whose value is a file's contents ("":
// no such file).
var linModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(linIn).Key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{linState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		st, in, out := state.(linState), input.(linIn), output.(linOut)
		s := st.Val
		set := func(v string) linState { n := st; n.Val = v; return n }
		switch in.Op {
		case opPut:
			if out.Unknown {
				return []interface{}{set(in.Val), st}
			}
			return []interface{}{set(in.Val)}
		case opGet:
			if out.Val == s {
				return []interface{}{st}
			}
			return nil
		case opAcquire:
			switch {
			case out.Unknown && s == "":
				return []interface{}{set(in.Val), st}
			case out.Unknown:
				return []interface{}{st}
			case out.Granted && s == "":
				return []interface{}{set(in.Val)}
			case !out.Granted && s != "" && s != in.Val:
				return []interface{}{st}
			}
			return nil
		case opRelease:
			switch {
			case s != in.Val:
				return nil // releasing a lock it does not hold
			case out.Unknown:
				return []interface{}{set(""), st}
			}
			return []interface{}{set("")}
		default:
			if out.Unknown {
				return []interface{}{set(""), st}
			}
			if out.Existed == (s != "") {
				n := set("")
				if out.Exposing {
					n = n.withRecord(in.Client)
				}
				return []interface{}{n}
			}
			if out.Uncertain && out.Existed && s == "" {
				// Answered from a surviving record of this client's.
				if n, ok := st.takeRecord(in.Client); ok {
					return []interface{}{n}
				}
			}
			return nil
		}
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(linIn), output.(linOut)
		switch {
		case in.Op == opPut:
			return fmt.Sprintf("put(%s, %q) unknown=%v", in.Key, in.Val, out.Unknown)
		case in.Op == opGet:
			return fmt.Sprintf("get(%s) -> %q", in.Key, out.Val)
		case in.Op == opAcquire:
			return fmt.Sprintf("%s: lock -> granted=%v unknown=%v", in.Val, out.Granted, out.Unknown)
		case in.Op == opRelease:
			return fmt.Sprintf("%s: unlock unknown=%v", in.Val, out.Unknown)
		default:
			return fmt.Sprintf("del(%s) existed=%v unknown=%v exposing=%v uncertain=%v", in.Key, out.Existed, out.Unknown, out.Exposing, out.Uncertain)
		}
	},
}

// history records operations from several goroutines.
type history struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
	fails int
	// faults are the windows in which a leader was being replaced:
	// from, to, and 1 if the leader died without quiescing (kill -9 or
	// SIGSTOP), so that replay records it meant to retire survive.
	faults [][3]int64
}

// faultWindow records that a leader was replaced between from and to;
// abrupt: it died without quiescing.
func (h *history) faultWindow(from, to time.Time, abrupt bool) {
	var a int64
	if abrupt {
		a = 1
	}
	h.mu.Lock()
	h.faults = append(h.faults, [3]int64{int64(from.Sub(h.start)), int64(to.Sub(h.start)), a})
	h.mu.Unlock()
}

// replayable relaxes the check of deletes exactly where the server's
// replay records allow another answer (docs/availability.md, "Known
// limits"); every other answer is checked as it is.
//
//   - A delete that found nothing while a leader was replaced may be the
//     dead leader's work resent: its effect is unknown.
//   - The residual hazard of replay records: a REMOVE whose reply arrived
//     right before the leader died can leave a record the crash kept (the
//     slot's next request retires it, durably only with the next change
//     or within replayFlushEvery). If the same client then removes the
//     same name again at a later leader while the name is absent, that
//     leader answers it from the record: success, although nothing was
//     there. The record lives until it answers or expires (four leases).
//     So a delete that succeeded within recordSurvives before a leader
//     was killed or stopped is Exposing: the model gives its client a
//     record for the key. The same client's deletes of the key called
//     after the fault and within recordLives are Uncertain: one of them
//     may succeed on an absent key by using the record up.
func (h *history) replayable() (unknown, uncertain int) {
	const (
		recordSurvives = int64(time.Second)
		recordLives    = int64(4 * testLease)
	)
	h.mu.Lock()
	defer h.mu.Unlock()
	sort.SliceStable(h.ops, func(i, j int) bool { return h.ops[i].Call < h.ops[j].Call })
	type ck struct {
		client int
		key    string
	}
	// exposed: from when to when a client's deletes of a key may be
	// answered from a surviving record.
	exposed := map[ck][][2]int64{}
	for i, op := range h.ops {
		in, out := op.Input.(linIn), op.Output.(linOut)
		if in.Op != opDel || out.Unknown {
			continue
		}
		k := ck{op.ClientId, in.Key}
		for _, w := range exposed[k] {
			if out.Existed && op.Call >= w[0] && op.Call <= w[1] && !out.Uncertain {
				out.Uncertain = true
				h.ops[i].Output = out
				uncertain++
			}
		}
		for _, f := range h.faults {
			if !out.Existed && op.Call <= f[1] && op.Return >= f[0] {
				h.ops[i].Output = linOut{Unknown: true}
				h.ops[i].Return = math.MaxInt64
				unknown++
				break
			}
			if out.Existed && f[2] == 1 && op.Return <= f[0] && op.Return >= f[0]-recordSurvives {
				exposed[k] = append(exposed[k], [2]int64{f[0], f[0] + recordLives})
				out.Exposing = true
				h.ops[i].Output = out
			}
		}
	}
	return unknown, uncertain
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(client int, in linIn, call int64, out linOut, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ret := h.now()
	in.Client = client
	if err != nil {
		h.fails++
		if in.Op == opGet {
			return // a failed read changed nothing
		}
		out.Unknown, ret = true, math.MaxInt64
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// linClient runs random operations until stop.
func linClient(ctx context.Context, id int, addrs string, h *history, keys []string, stop <-chan struct{}) error {
	dctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	c, err := client.Dial(dctx, addrs, client.Options{})
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	lf, err := c.Open(octx, lockKey, os.O_CREATE|os.O_RDWR, 0o644)
	cancel()
	if err != nil {
		return err
	}
	defer lf.Close()
	me := fmt.Sprintf("c%d", id)
	rng := rand.New(rand.NewPCG(uint64(id), 7))
	for seq := 0; seq < 100000; seq++ {
		select {
		case <-stop:
			return nil
		default:
		}
		if rng.IntN(4) == 0 {
			lockCycle(ctx, id, me, lf, h, rng)
			continue
		}
		key := keys[rng.IntN(len(keys))]
		in := linIn{Key: key}
		switch r := rng.IntN(10); {
		case r < 4:
			in.Op, in.Val = opPut, fmt.Sprintf("c%d-%d", id, seq)
		case r < 9:
			in.Op = opGet
		default:
			in.Op = opDel
		}
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		call := h.now()
		out, err := linDo(octx, c, id, seq, in)
		cancel()
		h.add(id, in, call, out, err)
	}
	return nil
}

// lockCycle tries the lock without waiting and, if granted, holds it a
// moment and releases it.
func lockCycle(ctx context.Context, id int, me string, lf *client.File, h *history, rng *rand.Rand) {
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	call := h.now()
	err := lf.Lock(octx, 0, 1, true, false)
	granted := err == nil
	if errors.Is(err, syscall.EAGAIN) {
		err = nil
	}
	h.add(id, linIn{Op: opAcquire, Key: lockKey, Val: me}, call, linOut{Granted: granted}, err)
	if !granted {
		if err == nil {
			time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
		}
		return
	}
	time.Sleep(time.Duration(50+rng.IntN(150)) * time.Millisecond)
	call = h.now()
	err = lf.Unlock(octx, 0, 1)
	h.add(id, linIn{Op: opRelease, Key: lockKey, Val: me}, call, linOut{}, err)
}

func linDo(ctx context.Context, c *client.Client, id, seq int, in linIn) (linOut, error) {
	switch in.Op {
	case opPut:
		tmp := fmt.Sprintf("/lin/tmp/c%d-%d", id, seq)
		f, err := c.Open(ctx, tmp, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
		if err != nil {
			return linOut{}, err
		}
		if _, err := f.WriteAtContext(ctx, []byte(in.Val), 0); err != nil {
			f.Close()
			return linOut{}, err
		}
		if err := f.Close(); err != nil {
			return linOut{}, err
		}
		return linOut{}, c.Rename(ctx, tmp, in.Key)
	case opGet:
		f, err := c.Open(ctx, in.Key, os.O_RDONLY, 0)
		if errors.Is(err, fs.ErrNotExist) {
			return linOut{}, nil
		}
		if err != nil {
			return linOut{}, err
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err == nil && len(b) == 0 {
			// Every put writes a value before the rename that makes
			// it visible, so an empty file is never a state: kept
			// apart from "absent" so the checker flags it.
			return linOut{Val: emptyFile}, nil
		}
		return linOut{Val: string(b)}, err
	default:
		err := c.Remove(ctx, in.Key)
		if errors.Is(err, fs.ErrNotExist) {
			return linOut{Existed: false}, nil
		}
		return linOut{Existed: err == nil}, err
	}
}

// faults takes the cluster through every kind of failure, one after the
// other, until stop or the list ends.
func faults(t testing.TB, w *World, h *history, stop <-chan struct{}, kinds []string) {
	pause := func(d time.Duration) bool {
		select {
		case <-stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	for _, k := range kinds {
		if !pause(3 * time.Second) {
			return
		}
		t.Logf("fault: %s", k)
		switch k {
		case "kill-mds", "stop-mds", "stepdown":
			f := map[string]Fault{"kill-mds": Kill, "stop-mds": Stop, "stepdown": StepDown}[k]
			from := time.Now()
			w.Inject(f)
			if h != nil {
				// Until the clients have surely moved on.
				h.faultWindow(from, time.Now().Add(15*time.Second), f != StepDown)
			}
		case "kill-etcd":
			e := w.Etcd[1]
			e.P.Signal(syscall.SIGKILL)
			_ = e.P.Wait(10 * time.Second)
			if !pause(2 * time.Second) {
				return
			}
			w.RestartEtcd(1)
			w.WaitEtcd(30 * time.Second)
		case "kill-ds":
			d := w.DS[0]
			d.P.Signal(syscall.SIGKILL)
			_ = d.P.Wait(10 * time.Second)
			if !pause(2 * time.Second) {
				return
			}
			w.StartDS(d)
		}
	}
}

// runLinearizable runs the clients under faults and checks the history.
func runLinearizable(t *testing.T, w *World, kinds []string, dur time.Duration) (porcupine.CheckResult, *history) {
	ctx := context.Background()
	c := dial(t, w.MDSAddrs())
	if err := c.MkdirAll(ctx, "/lin/tmp", 0o755); err != nil {
		t.Fatal(err)
	}
	keys := []string{"/lin/a", "/lin/b", "/lin/c"}
	h := &history{start: time.Now()}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for id := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := linClient(ctx, id, w.MDSAddrs(), h, keys, stop); err != nil {
				errs <- err
			}
		}()
	}
	fdone := make(chan struct{})
	go func() { defer close(fdone); faults(t, w, h, stop, kinds) }()
	<-fdone
	// Late clients that know one MDS each, not the leader: as a client
	// whose connection to an old leader never broke. With fencing, no
	// such MDS serves them (it stands by, not listening); they only add
	// operations if a deposed leader still serves.
	leader := w.Leader()
	for i, m := range w.MDS {
		if m == leader {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := linClient(ctx, 10+i, m.Addr, h, keys, stop); err != nil {
				t.Logf("a client of %s alone: %v (as expected of a standby)", m.Node, err)
			}
		}()
	}
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	unknown, uncertain := h.replayable()
	t.Logf("deletes around leader changes: %d of unknown effect (found nothing while a leader was replaced), %d that a surviving replay record may answer (once per record)", unknown, uncertain)
	res, info := porcupine.CheckOperationsVerbose(linModel.ToModel(), h.ops, 2*time.Minute)
	t.Logf("history: %d operations (%d failed: effect unknown or dropped); porcupine: %v", len(h.ops), h.fails, res)
	if res == porcupine.Illegal {
		// Which key, and its history, for the failure message; the
		// visualisation goes where the test's directory is not removed.
		for _, part := range linModel.Partition(h.ops) {
			if porcupine.CheckOperations(linModel.ToModel(), part) {
				continue
			}
			t.Logf("not linearizable: %s (%d operations):", part[0].Input.(linIn).Key, len(part))
			sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
			if len(part) > 80 {
				// The visualisation has it all.
				part = part[len(part)-80:]
			}
			for _, op := range part {
				ret := "never"
				if op.Return != math.MaxInt64 {
					ret = time.Duration(op.Return).String()
				}
				t.Logf("  client %2d  %10v .. %-10s  %s", op.ClientId, time.Duration(op.Call), ret, linModel.DescribeOperation(op.Input, op.Output))
			}
		}
		path := filepath.Join(os.TempDir(), fmt.Sprintf("shoal-linearizability-%d.html", time.Now().UnixNano()))
		if f, err := os.Create(path); err == nil {
			_ = porcupine.Visualize(linModel.ToModel(), info, f)
			f.Close()
			t.Logf("porcupine's visualisation of the violation: %s", path)
		}
	}
	return res, h
}

// TestLinearizable: no violation under kill -9, SIGSTOP and step-down of
// the leader, kill -9 of an etcd member and of a data server.
func TestLinearizable(t *testing.T) {
	w := newCluster(t)
	res, h := runLinearizable(t, w, []string{"kill-mds", "kill-etcd", "stop-mds", "kill-ds", "stepdown"}, 5*time.Second)
	if res != porcupine.Ok {
		t.Fatalf("the history of %d operations is %v", len(h.ops), res)
	}
}

// TestLinearizableCatchesBrokenFencing: with fencing turned off (the
// test-only switch), a paused leader that wakes up goes on serving beside
// the new one, and the checker must find the history not linearizable:
// the proof that TestLinearizable can fail.
func TestLinearizableCatchesBrokenFencing(t *testing.T) {
	t.Setenv(wiring.UnsafeNoFencingEnv, "1") // inherited by the processes
	w := newCluster(t)
	res, h := runLinearizable(t, w, []string{"stop-mds"}, 15*time.Second)
	if res != porcupine.Illegal {
		t.Fatalf("with fencing off, the history of %d operations is %v; the checker should have caught the two leaders", len(h.ops), res)
	}
}
