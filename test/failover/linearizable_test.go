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
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/wiring"
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
)

type linIn struct {
	Op  linOp
	Key string
	Val string // put's value
}

type linOut struct {
	Unknown bool   // the operation failed: its effect is unknown
	Val     string // get's value ("" absent)
	Existed bool   // del: the file was there
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
	Init: func() []interface{} { return []interface{}{""} },
	Step: func(state, input, output interface{}) []interface{} {
		s, in, out := state.(string), input.(linIn), output.(linOut)
		switch in.Op {
		case opPut:
			if out.Unknown {
				return []interface{}{in.Val, s}
			}
			return []interface{}{in.Val}
		case opGet:
			if out.Val == s {
				return []interface{}{s}
			}
			return nil
		default:
			if out.Unknown {
				return []interface{}{"", s}
			}
			if out.Existed == (s != "") {
				return []interface{}{""}
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
		default:
			return fmt.Sprintf("del(%s) existed=%v unknown=%v", in.Key, out.Existed, out.Unknown)
		}
	},
}

// history records operations from several goroutines.
type history struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
	fails int
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(client int, in linIn, call int64, out linOut, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ret := h.now()
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
	rng := rand.New(rand.NewPCG(uint64(id), 7))
	for seq := 0; seq < 100000; seq++ {
		select {
		case <-stop:
			return nil
		default:
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
func faults(t testing.TB, w *World, stop <-chan struct{}, kinds []string) {
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
		case "kill-mds":
			w.Inject(Kill)
		case "stop-mds":
			w.Inject(Stop)
		case "stepdown":
			w.Inject(StepDown)
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
	go func() { defer close(fdone); faults(t, w, stop, kinds) }()
	<-fdone
	time.Sleep(min(dur, 5*time.Second))
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	res, info := porcupine.CheckOperationsVerbose(linModel.ToModel(), h.ops, 2*time.Minute)
	t.Logf("history: %d operations (%d failed: effect unknown or dropped); porcupine: %v", len(h.ops), h.fails, res)
	if res == porcupine.Illegal {
		path := w.Base + "/linearizability.html"
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
	res, h := runLinearizable(t, w, []string{"stop-mds", "stop-mds"}, 5*time.Second)
	if res != porcupine.Illegal {
		t.Fatalf("with fencing off, the history of %d operations is %v; the checker should have caught the two leaders", len(h.ops), res)
	}
}
