package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/internal/xdr"
)

func TestMain(m *testing.M) {
	// Poison released buffers in this package's tests whatever the build
	// tags, so a use after release is seen as corrupted data; but not when
	// benchmarking, where it would be measured.
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		poisonReleased = true
	}
	os.Exit(m.Run())
}

// pattern returns n bytes that depend on seed and position, so a buffer
// holding another call's data (or poison) never compares equal.
func pattern(seed uint32, n int) []byte {
	b := make([]byte, n)
	x := seed*2654435761 + 1
	for i := 0; i+4 <= n; i += 4 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		binary.BigEndian.PutUint32(b[i:], x)
	}
	return b
}

func TestRecordClass(t *testing.T) {
	tests := []struct {
		n      int
		pooled bool
		size   int
	}{
		{0, false, 0},
		{minPooled - 1, false, 0},
		{minPooled, true, 64<<10 + recordSlack},
		{64<<10 + recordSlack, true, 64<<10 + recordSlack},
		{64<<10 + recordSlack + 1, true, 128<<10 + recordSlack},
		{1<<20 + 300, true, 1<<20 + recordSlack}, // a 1 MiB WRITE with its headers
		{2<<20 + 64<<10, true, 4<<20 + recordSlack},
		{1<<maxPooledShift + recordSlack + 1, false, 0},
	}
	for _, tc := range tests {
		_, size, ok := recordClass(tc.n)
		if ok != tc.pooled || size != tc.size {
			t.Errorf("recordClass(%d) = %d, %v; want %d, %v", tc.n, size, ok, tc.size, tc.pooled)
		}
	}
}

// TestRecordReaderPooled reads records around the pooling thresholds and
// checks their contents, whether they are pooled, and that released buffers
// are handed out again.
func TestRecordReaderPooled(t *testing.T) {
	const max = DefaultMaxRecord
	tests := []struct {
		name   string
		n      int
		frags  []int
		pooled bool
	}{
		{"small", 1000, nil, false},
		{"just below", minPooled - 4, nil, false},
		{"smallest class", minPooled, nil, true},
		{"1 MiB write", 1<<20 + 300, nil, true},
		{"at limit", max, nil, false}, // its class is 4 MiB: beyond the limit
		{"fragmented", 1<<20 + 300, []int{1 << 19, 1 << 19}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := pattern(uint32(tc.n), tc.n)
			var stream []byte
			for range 3 {
				stream = append(stream, fragment(want, tc.frags...)...)
			}
			rr := recordReader{r: bytes.NewReader(stream), max: max}
			for i := range 3 {
				before := recordPoolStats.reused.Load()
				rec, rb, err := rr.next()
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(rec, want) {
					t.Fatalf("record %d differs", i)
				}
				if (rb != nil) != tc.pooled {
					t.Fatalf("record %d pooled = %v, want %v", i, rb != nil, tc.pooled)
				}
				if rb == nil {
					continue
				}
				if _, size, _ := recordClass(tc.n); len(rb.b) != size || &rb.b[0] != &rec[0] {
					t.Fatalf("buffer of %d bytes for a %d-byte record, or not its start", len(rb.b), tc.n)
				}
				if i > 0 && recordPoolStats.reused.Load() == before {
					// sync.Pool may drop a buffer (always under -race
					// some of the time), so this is informational.
					t.Logf("record %d: buffer not reused", i)
				}
				// rec must not be read after this: the pools are shared
				// with whatever else runs in the process.
				rb.release()
			}
		})
	}
}

// Procedures of the handler used by the reuse tests.
const (
	procRelease = 1 // checks the payload, declares release
	procRetain  = 2 // keeps the payload, does not declare release
	procEcho    = 3 // splices the payload into the reply, declares release
)

// reuseHandler serves the procedures above. Payloads are opaque<> holding
// pattern(seed, n) preceded by the uint32 seed.
type reuseHandler struct {
	mu       sync.Mutex
	retained map[uint32][]byte
}

func (h *reuseHandler) ServeRPC(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
	d := xdr.NewDecoder(call.Args)
	seed := d.Uint32()
	data := d.Opaque(0)
	if d.Err() != nil {
		return GarbageArgs
	}
	switch call.Proc {
	case procRelease:
		ok := bytes.Equal(data, pattern(seed, len(data)))
		res.Bool(ok)
		call.ReleaseArgsAfterReply()
	case procRetain:
		h.mu.Lock()
		h.retained[seed] = data // aliases the record, kept past the reply
		h.mu.Unlock()
		res.Bool(true)
	case procEcho:
		res.OpaqueRef(data) // aliases the record until the reply is written
		call.ReleaseArgsAfterReply()
	default:
		return ProcUnavail
	}
	return Success
}

type seededArg struct {
	seed uint32
	data []byte
}

func (a seededArg) EncodeXDR(e *xdr.Encoder) {
	e.Uint32(a.seed)
	e.OpaqueRef(a.data)
}

func callOK(ctx context.Context, c *Conn, proc, seed uint32, n int) error {
	res, err := c.Call(ctx, testProg, testVers, proc, OpaqueAuth{}, seededArg{seed, pattern(seed, n)})
	if err != nil {
		return err
	}
	if ok := xdr.NewDecoder(res).Bool(); !ok {
		return fmt.Errorf("proc %d seed %d: handler saw corrupted arguments", proc, seed)
	}
	return nil
}

// TestReleasedArgsAreReused: a handler that declares its arguments not
// retained gets its record buffers recycled.
func TestReleasedArgsAreReused(t *testing.T) {
	checkLeaks(t)
	addr := startServer(t, &Server{Handler: &reuseHandler{}})
	c := dial(t, addr, nil)
	ctx := testCtx(t)
	const calls = 100
	reused := recordPoolStats.reused.Load()
	released := recordPoolStats.released.Load()
	for i := range calls {
		if err := callOK(ctx, c, procRelease, uint32(i), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	// Every call's record is released (the last one just after its reply
	// was sent); sync.Pool may drop some buffers (at random under -race,
	// and on every GC), but calls made one after another on one connection
	// must mostly find one.
	waitFor(t, "every record released", func() bool { return recordPoolStats.released.Load()-released >= calls })
	if got := recordPoolStats.reused.Load() - reused; got < calls/4 {
		t.Errorf("%d of %d calls reused a record buffer", got, calls)
	}
}

// TestRetainedArgsStayIntact: arguments of a handler that does not declare
// release are never recycled, however many released calls reuse buffers
// around them, concurrently. With poisoning on, a wrongly recycled buffer is
// overwritten at once.
func TestRetainedArgsStayIntact(t *testing.T) {
	checkLeaks(t)
	h := &reuseHandler{retained: make(map[uint32][]byte)}
	addr := startServer(t, &Server{Handler: h})
	ctx := testCtx(t)
	const retainedCalls, workers, perWorker = 8, 4, 25
	sizes := []int{minPooled, 300 << 10, 1 << 20}
	c := dial(t, addr, nil)
	for i := range retainedCalls {
		if err := callOK(ctx, c, procRetain, 1000+uint32(i), sizes[i%len(sizes)]); err != nil {
			t.Fatal(err)
		}
	}
	reused := recordPoolStats.reused.Load()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		conn := dial(t, addr, nil)
		wg.Go(func() {
			for i := range perWorker {
				seed := uint32(w*perWorker + i)
				proc := uint32(procRelease)
				if i%5 == 4 {
					proc = procRetain
					seed += 2000
				}
				if err := callOK(ctx, conn, proc, seed, sizes[i%len(sizes)]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if recordPoolStats.reused.Load() == reused {
		t.Fatal("no buffer was reused: the test exercised nothing")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.retained) != retainedCalls+workers*perWorker/5 {
		t.Fatalf("%d retained payloads", len(h.retained))
	}
	for seed, data := range h.retained {
		if !bytes.Equal(data, pattern(seed, len(data))) {
			t.Errorf("retained payload %d (%d bytes) was overwritten", seed, len(data))
		}
	}
}

// TestSplicedArgsAndKeptResults: a handler may splice its arguments into the
// reply and still declare release (the reply is written first), and results
// returned by Call are never recycled, so a caller may keep them.
func TestSplicedArgsAndKeptResults(t *testing.T) {
	checkLeaks(t)
	addr := startServer(t, &Server{Handler: &reuseHandler{}})
	c := dial(t, addr, nil)
	ctx := testCtx(t)
	kept := map[uint32][]byte{}
	for i := range 40 {
		seed := uint32(i)
		res, err := c.Call(ctx, testProg, testVers, procEcho, OpaqueAuth{}, seededArg{seed, pattern(seed, 1<<20)})
		if err != nil {
			t.Fatal(err)
		}
		d := xdr.NewDecoder(res)
		data := d.Opaque(0)
		if d.Err() != nil || !bytes.Equal(data, pattern(seed, 1<<20)) {
			t.Fatalf("call %d: echoed payload differs", i)
		}
		if i%8 == 0 {
			kept[seed] = data
		}
	}
	for seed, data := range kept {
		if !bytes.Equal(data, pattern(seed, len(data))) {
			t.Errorf("kept result %d was overwritten", seed)
		}
	}
}

// TestPanicKeepsBuffer: a handler that declared release and then panicked
// may have handed the arguments anywhere; its buffer is not recycled.
func TestPanicKeepsBuffer(t *testing.T) {
	checkLeaks(t)
	var mu sync.Mutex
	var kept []byte
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		mu.Lock()
		kept = call.Args
		mu.Unlock()
		call.ReleaseArgsAfterReply()
		panic("handler bug")
	})})
	c := dial(t, addr, nil)
	want := pattern(7, 1<<20)
	_, err := c.Call(testCtx(t), testProg, testVers, 1, OpaqueAuth{}, opaqueArg(want))
	if ae, ok := err.(*AcceptError); !ok || ae.Stat != SystemErr {
		t.Fatalf("err = %v, want SYSTEM_ERR", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if d := xdr.NewDecoder(kept); !bytes.Equal(d.Opaque(0), want) {
		t.Fatal("arguments of a panicked handler were recycled")
	}
}

// TestCallReleaseRecycles: results of CallRelease are recycled when the
// caller releases them, and only then; releasing twice is harmless.
func TestCallReleaseRecycles(t *testing.T) {
	checkLeaks(t)
	addr := startServer(t, &Server{Handler: &reuseHandler{}})
	c := dial(t, addr, nil)
	ctx := testCtx(t)
	const calls = 60
	released := recordPoolStats.released.Load()
	for i := range calls {
		seed := uint32(i)
		res, release, err := c.CallRelease(ctx, testProg, testVers, procEcho, OpaqueAuth{}, seededArg{seed, pattern(seed, 1<<20)})
		if err != nil {
			t.Fatal(err)
		}
		d := xdr.NewDecoder(res)
		if data := d.Opaque(0); d.Err() != nil || !bytes.Equal(data, pattern(seed, 1<<20)) {
			t.Fatalf("call %d: echoed payload differs", i)
		}
		release()
		release() // must not put the buffer in the pool twice
	}
	// Both the server's records and the client's replies were released.
	waitFor(t, "every record released", func() bool { return recordPoolStats.released.Load()-released >= 2*calls })
	if _, _, err := c.CallRelease(ctx, testProg, testVers, 99, OpaqueAuth{}, nil); err == nil {
		t.Fatal("call to a missing procedure succeeded")
	}
}

// TestPoison: poisoning fills a buffer, and a write into a poisoned buffer
// is detected wherever it lands.
func TestPoison(t *testing.T) {
	b := make([]byte, 3*len(poisonBlock)+5)
	poison(b)
	checkPoison(b) // must not panic
	for _, at := range []int{0, len(poisonBlock) - 1, len(poisonBlock), len(b) - 1} {
		t.Run(fmt.Sprint(at), func(t *testing.T) {
			c := bytes.Clone(b)
			c[at] = 0
			defer func() {
				msg, _ := recover().(string)
				if want := fmt.Sprintf("byte %d of", at); !strings.Contains(msg, want) {
					t.Fatalf("panic %q, want it to name %q", msg, want)
				}
			}()
			checkPoison(c)
		})
	}
}
