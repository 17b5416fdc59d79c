package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/client/internal/scripted"
	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestScripted replays client/testdata/*.txt: contract tests of the
// client's session and layout-state handling against a server whose
// answers the script dictates (package scripted). Every action prints the
// COMPOUNDs the server received while it ran, one a line, as
// "request ops -> status notes", then "=> " and the action's outcome.
//
// Commands:
//
//	file name=N size=S        a regular file in the server's root
//	dial [slots=N]            client.Dial; the server grants N slots (default 1)
//	reply OP [status=S] [flags=F,...] [seqid=N] [deleg] [codes=S,...] [hold] [times=N]
//	                          override the next answer to OP (scripted.Rule)
//	stat PATH | open NAME as=F [rw] | layout F | close F | lock F [write] | unlock F
//	                          client actions; with async=ID they run in
//	                          the background and print nothing
//	wait ID                   wait for a background action, print as above
//	wait-held OP | release OP a reply held by "reply OP hold"
//	wait-trace TEXT           wait for TEXT in a COMPOUND not printed yet,
//	                          then print them (background work of the client)
//	wait-state-revoked N      wait until the client mended N revoked open
//	                          or lock stateids (Stats.StateRevoked)
//	recall F                  send CB_LAYOUTRECALL of F's layout
//	restart                   the server forgets all state, starts a grace period
//	expire                    the server forgets all state, no grace period
//	trace                     print the COMPOUNDs not printed yet
//	stats                     the client's recovery and layout counters
//	flex mirrors=N [flags=F,...] [loose]
//	                          hand out flexfiles layouts of N mirrors: mirror 0
//	                          on the server itself, mirror k on data server
//	                          "dsK" (another scripted server, started here,
//	                          whose COMPOUNDs print prefixed "dsK: "); a rule
//	                          with fh=NAME#mK goes to the server of mirror K;
//	                          flags are ffl_flags without FF_FLAGS_; loose:
//	                          loosely coupled data servers (anonymous
//	                          stateid, synthetic owner 1000:2000)
//	dial ... [minor=N] [direct]
//	                          NFSv4.N; direct: every ReadAt and WriteAt goes
//	                          to the layout as it is (no cache, no small-I/O
//	                          shortcut through the MDS)
//	write F off=O len=N | read F off=O len=N
//	                          I/O of a pattern that depends on the offset; a
//	                          read says whether it got the pattern back. Both
//	                          wait for the layouts F returns in the background
//	data NAME                 the bytes each mirror's data file holds
//
// Rules not used up when a file ends fail the test: a rule that never
// fired tested nothing.
func TestScripted(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if !strings.HasSuffix(path, ".txt") {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		srv, err := scripted.Start()
		if err != nil {
			t.Fatal(err)
		}
		r := &scriptRunner{srv: srv, ctx: ctx, files: map[string]*client.File{}, async: map[string]chan string{}}
		defer func() {
			for _, f := range r.files {
				f.Close()
			}
			if r.c != nil {
				r.c.Close()
			}
			srv.Close()
			for _, d := range r.dss {
				d.Close()
			}
		}()
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			return r.run(t, td)
		})
		for _, s := range append([]*scripted.Server{srv}, r.dss...) {
			if p := s.PendingRules(); len(p) > 0 {
				t.Errorf("%s: rules never used: %v", path, p)
			}
		}
	})
}

type scriptRunner struct {
	srv    *scripted.Server
	ctx    context.Context
	c      *client.Client
	files  map[string]*client.File
	async  map[string]chan string
	cursor int // trace entries printed so far
	// dss are the data servers of flexfiles mirrors 1.. ("flex"), and
	// dsCursor their trace entries printed so far.
	dss      []*scripted.Server
	dsCursor []int
}

// actionTimeout bounds one client action: only so a broken client fails
// the test instead of hanging it, never an assertion about speed.
const actionTimeout = 20 * time.Second

func (r *scriptRunner) run(t *testing.T, td *datadriven.TestData) string {
	t.Helper()
	switch td.Cmd {
	case "file":
		size, _ := strconv.ParseUint(argOr(td, "size", "0"), 10, 64)
		r.srv.AddFile(arg(t, td, "name"), size)
		return ""
	case "reply":
		rule := parseRule(t, td)
		srv := r.srv
		if _, m, ok := strings.Cut(rule.FH, "#m"); ok {
			if k, _ := strconv.Atoi(m); k > 0 && k <= len(r.dss) {
				srv = r.dss[k-1]
			}
		}
		srv.AddRule(rule)
		return ""
	case "flex":
		n, _ := strconv.Atoi(arg(t, td, "mirrors"))
		addrs := []string{r.srv.Addr()}
		for range n - 1 {
			d, err := scripted.Start()
			if err != nil {
				t.Fatal(err)
			}
			r.dss = append(r.dss, d)
			r.dsCursor = append(r.dsCursor, 0)
			addrs = append(addrs, d.Addr())
		}
		var flags uint32
		if a, ok := td.Arg("flags"); ok {
			for _, v := range a.Vals {
				f, ok := map[string]uint32{
					"NO_LAYOUTCOMMIT": nfs4.FF_FLAGS_NO_LAYOUTCOMMIT, "NO_IO_THRU_MDS": nfs4.FF_FLAGS_NO_IO_THRU_MDS,
					"NO_READ_IO": nfs4.FF_FLAGS_NO_READ_IO, "WRITE_ONE_MIRROR": nfs4.FF_FLAGS_WRITE_ONE_MIRROR,
				}[v]
				if !ok {
					t.Fatalf("%s: unknown flexfiles flag %q", td.Pos, v)
				}
				flags |= f
			}
		}
		r.srv.SetFlex(addrs, flags, td.HasArg("loose"))
		return ""
	case "data":
		name := td.CmdArgs[0].Key
		var b strings.Builder
		for k, srv := range append([]*scripted.Server{r.srv}, r.dss...) {
			d := srv.Data(fmt.Sprintf("%s#m%d", name, k))
			fmt.Fprintf(&b, "m%d: %d bytes%s\n", k, len(d), map[bool]string{true: ", as written", false: ""}[len(d) > 0 && isPattern(d, 0)])
		}
		return b.String()
	case "restart":
		r.srv.Restart()
		return ""
	case "expire":
		r.srv.Expire()
		return ""
	case "trace":
		return r.flush("")
	case "stats":
		s := r.c.Stats()
		return fmt.Sprintf("recoveries=%d retries=%d layoutgets=%d layoutreturns=%d layoutrecalls=%d delegations-revoked=%d\n",
			s.Recoveries, s.Retries, s.LayoutGets, s.LayoutReturns, s.LayoutRecalls, s.DelegationsRevoked)
	case "wait-state-revoked":
		// wait-state-revoked N: until the client has mended N revoked
		// open or lock stateids (Stats.StateRevoked), bounded.
		want, err := strconv.ParseUint(td.CmdArgs[0].Key, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", td.Pos, err)
		}
		deadline := time.Now().Add(actionTimeout)
		for r.c.Stats().StateRevoked < want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d revoked stateids mended after %v, want %d", td.Pos, r.c.Stats().StateRevoked, actionTimeout, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return r.flush("")
	case "recall":
		ctx, cancel := context.WithTimeout(r.ctx, actionTimeout)
		defer cancel()
		out, err := r.srv.CallbackRecall(ctx, td.CmdArgs[0].Key)
		if err != nil {
			t.Fatalf("%s: %v", td.Pos, err)
		}
		return r.flush(out + "\n")
	case "wait-held":
		ctx, cancel := context.WithTimeout(r.ctx, actionTimeout)
		defer cancel()
		if err := r.srv.WaitHeld(ctx, parseOp(t, td.CmdArgs[0].Key)); err != nil {
			t.Fatalf("%s: %v", td.Pos, err)
		}
		return r.flush("")
	case "release":
		if err := r.srv.Release(parseOp(t, td.CmdArgs[0].Key)); err != nil {
			t.Fatalf("%s: %v", td.Pos, err)
		}
		return ""
	case "wait-trace":
		ctx, cancel := context.WithTimeout(r.ctx, actionTimeout)
		defer cancel()
		text := td.CmdArgs[0].Key
		if err := r.srv.WaitTrace(ctx, r.cursor, text); err != nil {
			t.Fatalf("%s: %v", td.Pos, err)
		}
		return r.flush("")
	case "wait":
		ch := r.async[td.CmdArgs[0].Key]
		if ch == nil {
			t.Fatalf("%s: no background action %q", td.Pos, td.CmdArgs[0].Key)
		}
		delete(r.async, td.CmdArgs[0].Key)
		select {
		case out := <-ch:
			return r.flush(out)
		case <-time.After(actionTimeout):
			t.Fatalf("%s: background action %q did not finish", td.Pos, td.CmdArgs[0].Key)
		}
	}
	act := r.action(t, td)
	if id, ok := td.Arg("async"); ok {
		ch := make(chan string, 1)
		r.async[id.Vals[0]] = ch
		go func() { ch <- act() }()
		return ""
	}
	return r.flush(act())
}

// flush prints the trace entries not printed yet, then tail: the
// server's, then each flexfiles data server's (whose order relative to
// the server's is not determined: the client writes mirrors at once).
func (r *scriptRunner) flush(tail string) string {
	lines, next := r.srv.Trace(r.cursor)
	r.cursor = next
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	for k, d := range r.dss {
		lines, r.dsCursor[k] = d.Trace(r.dsCursor[k])
		for _, l := range lines {
			fmt.Fprintf(&b, "ds%d: %s\n", k+1, l)
		}
	}
	b.WriteString(tail)
	return b.String()
}

// scriptPattern is what "write" writes at off: a function of the offset.
func scriptPattern(b []byte, off int64) {
	for i := range b {
		b[i] = byte((off + int64(i)) % 251)
	}
}

func isPattern(b []byte, off int64) bool {
	want := make([]byte, len(b))
	scriptPattern(want, off)
	return bytes.Equal(b, want)
}

// action returns the client action td names; it runs it when called and
// returns its outcome line.
func (r *scriptRunner) action(t *testing.T, td *datadriven.TestData) func() string {
	t.Helper()
	outcome := func(err error, ok string) string {
		if err != nil {
			// Name the servers as the trace does: their ports vary.
			msg := strings.ReplaceAll(err.Error(), r.srv.Addr(), "server")
			for k, d := range r.dss {
				msg = strings.ReplaceAll(msg, d.Addr(), fmt.Sprintf("ds%d", k+1))
			}
			return "=> error: " + msg + "\n"
		}
		return "=> " + ok + "\n"
	}
	ctxFor := func() (context.Context, context.CancelFunc) { return context.WithTimeout(r.ctx, actionTimeout) }
	switch td.Cmd {
	case "dial":
		if n, ok := td.Arg("slots"); ok {
			k, _ := strconv.Atoi(n.Vals[0])
			r.srv.SetSlots(k)
		}
		opts := client.Options{Logger: quietLogger()}
		if n, ok := td.Arg("minor"); ok {
			k, _ := strconv.Atoi(n.Vals[0])
			opts.MinorVersion = uint32(k)
		}
		if td.HasArg("direct") {
			opts.Policy.Access = client.AccessDirect
			opts.Policy.SmallIOThreshold = -1
		}
		return func() string {
			ctx, cancel := ctxFor()
			defer cancel()
			c, err := client.Dial(ctx, r.srv.Addr(), opts)
			r.c = c
			return outcome(err, "ok")
		}
	case "stat":
		p := td.CmdArgs[0].Key
		return func() string {
			ctx, cancel := ctxFor()
			defer cancel()
			a, err := r.c.Stat(ctx, p)
			return outcome(err, fmt.Sprintf("%s size=%d", a.Type, a.Size))
		}
	case "open":
		name, as := td.CmdArgs[0].Key, arg(t, td, "as")
		flag := os.O_RDONLY
		if td.HasArg("rw") {
			flag = os.O_RDWR
		}
		return func() string {
			ctx, cancel := ctxFor()
			defer cancel()
			f, err := r.c.Open(ctx, "/"+name, flag, 0)
			if err == nil {
				r.files[as] = f
			}
			return outcome(err, "ok")
		}
	case "layout":
		f := r.file(t, td.CmdArgs[0].Key)
		return func() string {
			ctx, cancel := ctxFor()
			defer cancel()
			addr, stripe, stripes, err := client.StripeOf(ctx, f, 0)
			if addr == r.srv.Addr() {
				addr = "server"
			}
			return outcome(err, fmt.Sprintf("layout: data server %s stripe %d of %d", addr, stripe, stripes))
		}
	case "write", "read":
		f := r.file(t, td.CmdArgs[0].Key)
		off, _ := strconv.ParseInt(arg(t, td, "off"), 10, 64)
		n, _ := strconv.Atoi(arg(t, td, "len"))
		write := td.Cmd == "write"
		return func() string {
			ctx, cancel := ctxFor()
			defer cancel()
			b := make([]byte, n)
			// A failure returns the layout in the background: wait for
			// it, so that it prints here, in a determined place.
			defer client.WaitRetired(ctx, f)
			if write {
				scriptPattern(b, off)
				k, err := f.WriteAtContext(ctx, b, off)
				return outcome(err, fmt.Sprintf("wrote %d", k))
			}
			k, err := f.ReadAtContext(ctx, b, off)
			if err == io.EOF {
				err = nil
			}
			return outcome(err, fmt.Sprintf("read %d, as written: %v", k, isPattern(b[:k], off)))
		}
	case "lock", "unlock":
		f := r.file(t, td.CmdArgs[0].Key)
		write := td.HasArg("write")
		unlock := td.Cmd == "unlock"
		return func() string {
			ctx, cancel := ctxFor()
			defer cancel()
			if unlock {
				return outcome(f.Unlock(ctx, 0, 100), "ok")
			}
			return outcome(f.Lock(ctx, 0, 100, write, false), "ok")
		}
	case "close":
		name := td.CmdArgs[0].Key
		f := r.file(t, name)
		return func() string {
			err := f.Close()
			delete(r.files, name)
			return outcome(err, "ok")
		}
	}
	t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	return nil
}

func (r *scriptRunner) file(t *testing.T, name string) *client.File {
	f := r.files[name]
	if f == nil {
		t.Fatalf("no open file %q", name)
	}
	return f
}

func parseRule(t *testing.T, td *datadriven.TestData) scripted.Rule {
	t.Helper()
	rule := scripted.Rule{Op: parseOp(t, td.CmdArgs[0].Key)}
	for _, a := range td.CmdArgs[1:] {
		switch a.Key {
		case "status":
			rule.Status = parseStatus(t, a.Vals[0])
		case "flags":
			for _, v := range a.Vals {
				f, ok := scripted.SeqFlagByName(v)
				if !ok {
					t.Fatalf("%s: unknown SEQ4_STATUS flag %q", td.Pos, v)
				}
				rule.Flags |= f
			}
		case "seqid":
			n, err := strconv.ParseUint(a.Vals[0], 10, 32)
			if err != nil {
				t.Fatalf("%s: seqid: %v", td.Pos, err)
			}
			rule.Seqid = uint32(n)
		case "deleg":
			rule.Deleg = true
		case "codes":
			for _, v := range a.Vals {
				rule.Codes = append(rule.Codes, parseStatus(t, v))
			}
		case "hold":
			rule.Hold = true
		case "times":
			rule.Times, _ = strconv.Atoi(a.Vals[0])
		case "fh":
			rule.FH = a.Vals[0]
		default:
			t.Fatalf("%s: unknown reply argument %q", td.Pos, a.Key)
		}
	}
	return rule
}

func parseOp(t *testing.T, name string) nfs4.NfsOpnum4 {
	op, ok := scripted.OpByName(name)
	if !ok {
		t.Fatalf("unknown operation %q", name)
	}
	return op
}

func parseStatus(t *testing.T, name string) nfs4.Nfsstat4 {
	st, ok := scripted.StatusByName(name)
	if !ok {
		t.Fatalf("unknown status %q", name)
	}
	return st
}

func arg(t *testing.T, td *datadriven.TestData, key string) string {
	t.Helper()
	a, ok := td.Arg(key)
	if !ok || len(a.Vals) == 0 {
		t.Fatalf("%s: missing %s=", td.Pos, key)
	}
	return a.Vals[0]
}

func argOr(td *datadriven.TestData, key, def string) string {
	if a, ok := td.Arg(key); ok && len(a.Vals) > 0 {
		return a.Vals[0]
	}
	return def
}
