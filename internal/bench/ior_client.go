package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/shoalfs/shoal/client"
)

// ClientSpec is the job of one ior client.
type ClientSpec struct {
	Addr string `json:"addr"`
	Root string `json:"root"`
	// Path is the client's own file.
	Path  string `json:"path"`
	Index int    `json:"index"`
	// Phase is PhaseWrite or PhaseRead.
	Phase    string `json:"phase"`
	Size     int64  `json:"size"`
	Transfer int    `json:"transfer"`
	PNFS     bool   `json:"pnfs"`
	// Shared puts every client in one file (Path), each writing and
	// reading its own segment [Index*Size, (Index+1)*Size), IOR's
	// segmented shared-file mode; otherwise Path is the client's own.
	Shared bool `json:"shared,omitempty"`
	// Random visits the transfers of the client's block in a seeded
	// random order (the same permutation in the write and read phases)
	// instead of front to back.
	Random bool `json:"random,omitempty"`
	// Count, if not zero, limits the phase to the first Count transfers
	// (in visiting order): a read after a stonewalled write reads only
	// what was written.
	Count int64 `json:"count,omitempty"`
	// Stonewall, if not zero, ends the phase once it has run that long:
	// the client reports what it moved until then (IOR's -D).
	Stonewall time.Duration `json:"stonewall,omitempty"`
	// Access is the client's access method ("" or "direct", "odirect",
	// "cached"; client.ParseAccess).
	Access string `json:"access,omitempty"`
	// SmallIOThreshold is the client's client.Policy.SmallIOThreshold:
	// requests shorter than it go through the metadata server (0: the
	// library's default).
	SmallIOThreshold int `json:"small_io_threshold,omitempty"`
	// Meta configures the mdtest- and postmark-like phases.
	Meta *MetaSpec `json:"meta,omitempty"`
	// MeasureCPU asks the client to report its process's CPU time; only
	// meaningful when it is a process of its own.
	MeasureCPU bool `json:"measure_cpu,omitempty"`
}

// ClientResult is what one client reports after its phase.
type ClientResult struct {
	Index int   `json:"index"`
	Bytes int64 `json:"bytes"`
	// Transfers is how many I/O calls completed (ior) or operations
	// (metadata phases: one per file, or per postmark transaction part).
	Transfers int64 `json:"transfers"`
	// StartNS and EndNS are wall-clock Unix nanoseconds of the timed
	// region; the clients run on one machine, so they share the clock.
	StartNS int64 `json:"start_ns"`
	EndNS   int64 `json:"end_ns"`
	// CPUSeconds is the client's CPU time in the timed region, -1 if not
	// measured.
	CPUSeconds float64 `json:"cpu_seconds"`
	// CommitSeconds is, for a writer, how long the final COMMIT (Sync)
	// and CLOSE took, LAYOUTCOMMIT included; part of the timed region.
	CommitSeconds float64 `json:"commit_seconds,omitempty"`
	// DSBytes and MDSBytes are the READ and WRITE payload bytes the client
	// sent to or got from data servers and the metadata server in the
	// timed region; Failovers counts data-server requests it redid through
	// the metadata server, LayoutGets the layouts it obtained.
	DSBytes    uint64 `json:"ds_bytes"`
	MDSBytes   uint64 `json:"mds_bytes"`
	Failovers  uint64 `json:"failovers,omitempty"`
	LayoutGets uint64 `json:"layout_gets,omitempty"`
	Error      string `json:"error,omitempty"`
}

// clientMsg is one line a client writes: first a ready message (or an
// error), then its result.
type clientMsg struct {
	Ready  bool          `json:"ready,omitempty"`
	Result *ClientResult `json:"result,omitempty"`
	Error  string        `json:"error,omitempty"`
}

// goTimeout is how long a ready client waits for the start signal.
const goTimeout = 10 * time.Minute

// RunClient is one ior client, the body of `shoal bench client`. It
// connects, writes a ready line to out, waits for a "go" line on in (the
// barrier: every client connects before any starts), runs its phase and
// writes its result as a line to out. Dialing is outside the timed region;
// OPEN, the I/O, COMMIT and CLOSE are inside it. A client whose in closes
// before "go" stops without doing anything.
func RunClient(ctx context.Context, spec ClientSpec, in io.Reader, out io.Writer) error {
	enc := json.NewEncoder(out)
	fail := func(err error) error {
		enc.Encode(clientMsg{Error: err.Error()})
		return err
	}
	meta := isMetaPhase(spec.Phase)
	switch {
	case meta && spec.Meta == nil:
		return fail(fmt.Errorf("phase %q without its metadata settings", spec.Phase))
	case meta:
	case spec.Phase != PhaseWrite && spec.Phase != PhaseRead:
		return fail(fmt.Errorf("unknown phase %q", spec.Phase))
	case spec.Size <= 0 || spec.Transfer < minBlock || spec.Transfer > maxBlock:
		return fail(fmt.Errorf("bad size %d or transfer %d", spec.Size, spec.Transfer))
	}
	opts := pnfsOptions(spec.PNFS)
	opts.Root = spec.Root
	access, err := client.ParseAccess(spec.Access)
	if err != nil {
		return fail(err)
	}
	opts.Policy.Access = access
	opts.Policy.SmallIOThreshold = spec.SmallIOThreshold
	c, err := client.Dial(ctx, spec.Addr, opts)
	if err != nil {
		return fail(fmt.Errorf("dial %s: %w", spec.Addr, err))
	}
	defer c.Close()
	// Postmark's initial pool is built before the barrier, outside the
	// timed region, as postmark reports its transactions on their own.
	var pm *postmarkState
	if spec.Phase == PhasePostmark {
		if pm, err = postmarkSetup(ctx, c, spec); err != nil {
			return fail(fmt.Errorf("postmark pool: %w", err))
		}
	}
	if err := enc.Encode(clientMsg{Ready: true}); err != nil {
		return err
	}

	if err := waitGo(ctx, in); err != nil {
		return err
	}

	res := ClientResult{Index: spec.Index, CPUSeconds: -1}
	st0 := clientIOStats(c)
	cpu0, ok0 := procCPU(os.Getpid())
	start := time.Now()
	var n int64
	switch {
	case spec.Phase == PhasePostmark:
		n, res.Transfers, err = pm.run(ctx, c, spec)
	case meta:
		n, res.Transfers, err = clientMeta(ctx, c, spec)
	case spec.Phase == PhaseWrite:
		var commit time.Duration
		n, res.Transfers, commit, err = clientWrite(ctx, c, spec)
		res.CommitSeconds = commit.Seconds()
	default:
		n, res.Transfers, err = clientRead(ctx, c, spec)
	}
	end := time.Now()
	cpu1, ok1 := procCPU(os.Getpid())
	st1 := clientIOStats(c)
	res.DSBytes, res.MDSBytes = st1.dsBytes-st0.dsBytes, st1.mdsBytes-st0.mdsBytes
	res.Failovers, res.LayoutGets = st1.failovers-st0.failovers, st1.layoutGets-st0.layoutGets
	res.Bytes, res.StartNS, res.EndNS = n, start.UnixNano(), end.UnixNano()
	if spec.MeasureCPU && ok0 && ok1 {
		res.CPUSeconds = (cpu1 - cpu0).Seconds()
	}
	if err != nil {
		res.Error = err.Error()
	}
	if eerr := enc.Encode(clientMsg{Result: &res}); eerr != nil {
		return errors.Join(err, eerr)
	}
	if pm != nil && err == nil {
		// Untimed: the pool is removed after the result is out.
		err = pm.cleanup(context.WithoutCancel(ctx), c)
	}
	return err
}

// waitGo reads lines from in until "go", bounded by goTimeout and ctx.
func waitGo(ctx context.Context, in io.Reader) error {
	got := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "go" {
				got <- nil
				return
			}
		}
		got <- errors.New("start signal channel closed before go")
	}()
	t := time.NewTimer(goTimeout)
	defer t.Stop()
	select {
	case err := <-got:
		return err
	case <-t.C:
		return fmt.Errorf("no start signal within %v", goTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// iorStamp marks a transfer with its client and offset, so a transfer
// read from the wrong file or offset is detected.
func iorStamp(b []byte, index int, off int64) {
	if len(b) >= 16 {
		binary.BigEndian.PutUint64(b, uint64(off))
		binary.BigEndian.PutUint64(b[8:], uint64(index))
	}
}

// iorTemplate is the transfer buffer's content. It depends only on the
// transfer size, so the reader (another process) can rebuild what the
// writer wrote without being told; random-looking bytes keep any
// compression or zero detection from flattering the numbers.
func iorTemplate(n int) []byte {
	b := make([]byte, n)
	var seed [32]byte
	copy(seed[:], "shoal ior benchmark data pattern")
	r := mathrand.NewChaCha8(seed)
	r.Read(b)
	return b
}

// transferOrder returns the offsets, relative to the client's block, of
// the transfers the phase visits, in order: front to back, or a
// permutation seeded by the client's index so that the reader (another
// process) visits the same transfers as the writer did.
func transferOrder(spec ClientSpec) []int64 {
	t := int64(spec.Transfer)
	n := (spec.Size + t - 1) / t
	offs := make([]int64, n)
	for i := range offs {
		offs[i] = int64(i) * t
	}
	if spec.Random {
		var seed [32]byte
		binary.BigEndian.PutUint64(seed[:], uint64(spec.Index)+1)
		copy(seed[8:], "shoal ior random order")
		r := mathrand.New(mathrand.NewChaCha8(seed))
		r.Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
	}
	if spec.Count > 0 && spec.Count < n {
		offs = offs[:spec.Count]
	}
	return offs
}

// segment is where the client's block starts in its file.
func segment(spec ClientSpec) int64 {
	if spec.Shared {
		return int64(spec.Index) * spec.Size
	}
	return 0
}

// stonewalled reports whether the phase begun at start has used up its
// time limit after calls transfers; the first transfer always runs, so a
// stonewalled phase still moves something.
func stonewalled(spec ClientSpec, start time.Time, calls int64) bool {
	return calls > 0 && spec.Stonewall > 0 && time.Since(start) >= spec.Stonewall
}

// clientWrite writes the client's block and returns the bytes and calls
// done and how long the closing COMMIT and CLOSE took.
func clientWrite(ctx context.Context, c *client.Client, spec ClientSpec) (int64, int64, time.Duration, error) {
	flag := os.O_CREATE | os.O_WRONLY
	if !spec.Shared {
		// A shared file is written by every client at once: none may
		// truncate what another already wrote.
		flag |= os.O_TRUNC
	}
	begin := time.Now()
	f, err := c.Open(ctx, spec.Path, flag, 0o644)
	if err != nil {
		return 0, 0, 0, err
	}
	buf := iorTemplate(spec.Transfer)
	base := segment(spec)
	var done, calls int64
	for _, rel := range transferOrder(spec) {
		if err != nil || stonewalled(spec, begin, calls) {
			break
		}
		off := base + rel
		b := buf[:min(int64(spec.Transfer), spec.Size-rel)]
		iorStamp(b, spec.Index, off)
		var n int
		n, err = f.WriteAtContext(ctx, b, off)
		done += int64(n)
		calls++
		if err == nil && n != len(b) {
			err = fmt.Errorf("short write at offset %d: %d of %d bytes", off, n, len(b))
		}
	}
	start := time.Now()
	if err == nil {
		err = f.SyncContext(ctx)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return done, calls, time.Since(start), err
}

func clientRead(ctx context.Context, c *client.Client, spec ClientSpec) (int64, int64, error) {
	begin := time.Now()
	f, err := c.Open(ctx, spec.Path, os.O_RDONLY, 0)
	if err != nil {
		return 0, 0, err
	}
	want := iorTemplate(spec.Transfer)
	buf := make([]byte, spec.Transfer)
	base := segment(spec)
	var done, calls int64
	for _, rel := range transferOrder(spec) {
		if err != nil || stonewalled(spec, begin, calls) {
			break
		}
		off := base + rel
		b := buf[:min(int64(spec.Transfer), spec.Size-rel)]
		var n int
		n, err = f.ReadAtContext(ctx, b, off)
		done += int64(n)
		calls++
		if n == len(b) && err == io.EOF {
			err = nil // the last transfer may report EOF with all its bytes
		}
		switch {
		case err != nil:
		case n < len(b):
			err = fmt.Errorf("short read at offset %d: %d of %d bytes", off, n, len(b))
		default:
			w := want[:len(b)]
			iorStamp(w, spec.Index, off)
			if !bytes.Equal(b, w) {
				err = fmt.Errorf("transfer at offset %d: data read differs from data written", off)
			}
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return done, calls, err
}

// clientConn reads a launched client's messages.
type clientConn struct {
	h    *ClientHandle
	msgs chan clientMsg
	errs chan error
	once sync.Once
	err  error
}

func newClientConn(h *ClientHandle) *clientConn {
	cc := &clientConn{h: h, msgs: make(chan clientMsg, 16), errs: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(h.Out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		// A client writes two messages; a few more lines are tolerated
		// and ignored.
		for i := 0; i < 16 && sc.Scan(); i++ {
			var m clientMsg
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				cc.errs <- fmt.Errorf("bad message %q: %w", sc.Text(), err)
				return
			}
			cc.msgs <- m
		}
		err := sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		cc.errs <- fmt.Errorf("client output ended: %w", err)
	}()
	return cc
}

// next returns the client's next message.
func (cc *clientConn) next(ctx context.Context) (clientMsg, error) {
	select {
	case m := <-cc.msgs:
		return m, nil
	case err := <-cc.errs:
		// A message may have arrived just before the output ended.
		select {
		case m := <-cc.msgs:
			cc.errs <- err
			return m, nil
		default:
		}
		cc.errs <- err
		return clientMsg{}, err
	case <-ctx.Done():
		return clientMsg{}, ctx.Err()
	}
}

func (cc *clientConn) close() error {
	cc.once.Do(func() {
		cc.h.In.Close()
		cc.err = cc.h.Stop()
	})
	return cc.err
}

// clientExitGrace is how long a client that reported (or was told to
// abort) gets to exit before it is killed.
const clientExitGrace = 10 * time.Second

// ProcessLauncher runs each client as a child process, `Exe bench client
// --spec JSON`, so its CPU time is its own and the Go runtime of one client
// does not schedule another's work.
type ProcessLauncher struct {
	Exe string
	// Args come before --spec; default "bench", "client".
	Args []string
	// LogDir receives each client's stderr (default: discarded).
	LogDir string
	// Command, if set, builds the command for a client from its argv
	// (the binary and its arguments); the testbed uses it to run each
	// client inside its own network namespace. Default: argv as is.
	Command func(ctx context.Context, spec ClientSpec, argv []string) (*exec.Cmd, error)
}

var (
	_ ClientLauncher = (*ProcessLauncher)(nil)
	_ ClientLauncher = (*InProcessLauncher)(nil)
)

// Launch implements ClientLauncher.
func (p *ProcessLauncher) Launch(ctx context.Context, spec ClientSpec) (*ClientHandle, error) {
	spec.MeasureCPU = true
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	args := p.Args
	if len(args) == 0 {
		args = []string{"bench", "client"}
	}
	argv := append(append([]string{p.Exe}, args...), "--spec", string(js))
	var cmd *exec.Cmd
	if p.Command != nil {
		if cmd, err = p.Command(ctx, spec, argv); err != nil {
			return nil, err
		}
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
	}
	cmd.SysProcAttr = childProcAttr()
	// Plain pipes rather than cmd.StdoutPipe: the reader may still be
	// draining when the process is waited for.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout = inR, outW
	var logf *os.File
	if p.LogDir != "" {
		logf, err = os.OpenFile(filepath.Join(p.LogDir, fmt.Sprintf("client-%d.log", spec.Index)),
			os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			cmd.Stderr = logf
		}
	}
	if err := cmd.Start(); err != nil {
		for _, f := range []*os.File{inR, inW, outR, outW, logf} {
			if f != nil {
				f.Close()
			}
		}
		return nil, fmt.Errorf("start %s: %w", p.Exe, err)
	}
	inR.Close()
	outW.Close()
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		if logf != nil {
			logf.Close()
		}
		close(exited)
	}()
	// A cancelled run (Ctrl-C, timeout) kills the client at once.
	stopWatch := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() {
			stopWatch()
			inW.Close()
			t := time.NewTimer(clientExitGrace)
			defer t.Stop()
			select {
			case <-exited:
				stopErr = waitErr
			case <-t.C:
				cmd.Process.Kill()
				<-exited
				stopErr = fmt.Errorf("pid %d did not exit within %v; killed", cmd.Process.Pid, clientExitGrace)
			}
			outR.Close()
		})
		return stopErr
	}
	return &ClientHandle{In: inW, Out: outR, PID: cmd.Process.Pid, Stop: stop}, nil
}

// InProcessLauncher runs each client as a goroutine of this process,
// speaking the same protocol over in-memory pipes. Its CPU time is not
// separable; tests use it because it needs no binary.
type InProcessLauncher struct{}

// Launch implements ClientLauncher.
func (InProcessLauncher) Launch(ctx context.Context, spec ClientSpec) (*ClientHandle, error) {
	spec.MeasureCPU = false
	ctx, cancel := context.WithCancel(ctx)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := RunClient(ctx, spec, inR, outW)
		outW.Close()
		inR.Close()
		done <- err
	}()
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() {
			inW.Close()
			t := time.NewTimer(clientExitGrace)
			defer t.Stop()
			select {
			case stopErr = <-done:
			case <-t.C:
				cancel()
				stopErr = <-done
			}
			cancel()
			outR.Close()
		})
		return stopErr
	}
	return &ClientHandle{In: inW, Out: outR, Stop: stop}, nil
}
