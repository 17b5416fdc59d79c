package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// TestMembershipScripts replays testdata/*.txt: membership and stripe-map
// state, step by step, on a real registry and real agents over loopback.
// Data servers are named in the scripts; the MDS's clock is the script's.
//
//	join NAME...           start (or restart) agents; wait until in service
//	stop NAME...           stop agents; wait until out of service
//	clock +DURATION        advance the registry's clock
//	restart-mds            close the registry, open a new one on the same record and metadata
//	members                every data server: name, state, up
//	place ino=N            the file's map, placing it if it has none
//	layout ino=N           the file's files layout, or why it has none
//	write ino=N off=O len=L / read ino=N off=O len=L   through Striped (bytes are a function of ino and offset)
//	drain NAME / rebalance / remove NAME [force]       admin jobs, run to the end
//	du NAME                KiB allocated by a data server's objects
func TestMembershipScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		w := newDDWorld(t)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := w.run(d)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			return out
		})
	})
}

type ddWorld struct {
	t      *testing.T
	dir    string
	secret []byte
	store  *memStore
	maps   meta.Engine
	addr   string

	mu  sync.Mutex
	now time.Time

	reg    *Registry
	s      *Striped
	admin  *Admin
	ln     net.Listener
	agents map[string]*Agent
	ids    map[string]string // name -> id
	names  map[string]string // id -> name
	stores map[string]*store.Local
	files  map[uint64]uint64 // script's file number -> inode
}

// file returns the inode of the script's file n, creating it first.
func (w *ddWorld) file(n uint64) uint64 {
	if ino, ok := w.files[n]; ok {
		return ino
	}
	node, _, err := w.maps.Create(context.Background(), meta.RootIno, fmt.Sprintf("f%d", n),
		meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{})
	if err != nil {
		w.t.Fatal(err)
	}
	w.files[n] = uint64(node.Ino)
	return uint64(node.Ino)
}

func newDDWorld(t *testing.T) *ddWorld {
	w := &ddWorld{t: t, dir: t.TempDir(), secret: []byte("dd-join-secret-0123456789"), store: &memStore{},
		now: time.Unix(1_700_000_000, 0), agents: map[string]*Agent{}, ids: map[string]string{},
		names: map[string]string{}, stores: map[string]*store.Local{}, files: map[uint64]uint64{}}
	var err error
	if w.maps, err = meta.OpenBolt(filepath.Join(w.dir, "meta.db"), meta.BoltOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.maps.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.startMDS()
	t.Cleanup(func() {
		for _, a := range w.agents {
			a.Close()
		}
		w.stopMDS()
		for _, s := range w.stores {
			s.Close()
		}
		w.maps.Close()
	})
	return w
}

func (w *ddWorld) clock() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

func (w *ddWorld) startMDS() {
	t := w.t
	var err error
	w.reg, err = NewRegistry(context.Background(), RegistryConfig{
		DataKey: []byte("dd-data-key"), JoinSecret: w.secret, Store: w.store,
		HeartbeatInterval: 100 * time.Millisecond, MissedBeats: 50, DownAfter: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler), now: w.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	addr := w.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	for i := 0; ; i++ {
		w.ln, err = net.Listen("tcp", addr)
		if err == nil || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond) // the old listener's port
	}
	if err != nil {
		t.Fatal(err)
	}
	w.addr = w.ln.Addr().String()
	go w.reg.Serve(w.ln)
	w.s = NewStriped(w.reg, w.maps, 1<<20)
	w.admin = NewAdmin(AdminConfig{Registry: w.reg, Striped: w.s, FileSize: func(_ context.Context, ino uint64) (uint64, error) {
		// The script writes through Striped alone: the largest object is
		// the file's size.
		f, _ := w.s.Open(ino, false)
		defer f.Close()
		n, err := f.Size()
		return uint64(n), err
	}})
	w.reg.SetAdmin(w.admin)
}

func (w *ddWorld) stopMDS() {
	w.admin.Close()
	w.reg.Close()
}

// waitUp waits until the registry sees name in service (or not).
func (w *ddWorld) waitUp(name string, up bool) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if d, ok := w.reg.DataServer(w.ids[name]); ok && d.Up == up {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s not up=%v in time", name, up)
}

func (w *ddWorld) join(name string) error {
	if a := w.agents[name]; a != nil {
		return fmt.Errorf("%s is running", name)
	}
	st := w.stores[name]
	if st == nil {
		var err error
		if st, err = store.NewLocal(filepath.Join(w.dir, name), store.LocalOptions{}); err != nil {
			return err
		}
		w.stores[name] = st
		w.ids[name] = "ds-" + name
		w.names["ds-"+name] = name
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := StartAgent(ctx, AgentConfig{MDS: []string{w.addr}, ID: w.ids[name], Addrs: []string{name + ":2049"},
		Store: st, JoinSecret: w.secret, Capacity: func() (uint64, uint64) { return 1 << 40, 1 << 39 }})
	if err != nil {
		// The MDS's port differs from run to run.
		return errors.New(strings.ReplaceAll(err.Error(), w.addr, "MDS"))
	}
	w.agents[name] = a
	return w.waitUp(name, true)
}

func (w *ddWorld) stop(name string) error {
	a := w.agents[name]
	if a == nil {
		return fmt.Errorf("%s is not running", name)
	}
	a.Close()
	delete(w.agents, name)
	return w.waitUp(name, false)
}

func (w *ddWorld) dsNames(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = w.names[id]
	}
	return "[" + strings.Join(out, " ") + "]"
}

func (w *ddWorld) fmtMap(m meta.StripeMap) string {
	return fmt.Sprintf("first=%d ds=%s gen=%d\n", m.First, w.dsNames(m.DataServers), m.Gen)
}

// errClass names an error the way scripts compare it.
func errClass(err error) string {
	switch {
	case errors.Is(err, pnfs.ErrDataServerDown):
		return "down"
	case errors.Is(err, pnfs.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, pnfs.ErrNoDataServers):
		return "no data servers"
	case errors.Is(err, ErrBusy):
		return "busy"
	case errors.Is(err, ErrUnknownDataServer):
		return "unknown data server"
	}
	return err.Error()
}

// ddByte is the byte a script's file ino holds at offset off.
func ddByte(ino, off uint64) byte { return byte((off/4096)*31 + ino*7 + off%251) }

func (w *ddWorld) run(d *datadriven.TestData) (string, error) {
	ino := func() uint64 {
		var v uint64
		if d.HasArg("ino") {
			d.ScanArgs(w.t, "ino", &v)
		}
		return w.file(v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	switch d.Cmd {
	case "join", "stop":
		for _, a := range d.CmdArgs {
			f := w.join
			if d.Cmd == "stop" {
				f = w.stop
			}
			if err := f(a.Key); err != nil {
				return "", err
			}
		}
		return "ok\n", nil
	case "clock":
		dur, err := time.ParseDuration(strings.TrimPrefix(d.CmdArgs[0].Key, "+"))
		if err != nil {
			return "", err
		}
		w.mu.Lock()
		w.now = w.now.Add(dur)
		w.mu.Unlock()
		return "ok\n", nil
	case "restart-mds":
		w.stopMDS()
		w.mu.Lock()
		w.now = w.now.Add(time.Second)
		w.mu.Unlock()
		w.startMDS()
		for name := range w.agents {
			if err := w.waitUp(name, true); err != nil {
				return "", err
			}
		}
		return "ok\n", nil
	case "members":
		var b strings.Builder
		for _, ds := range w.reg.DataServers() {
			fmt.Fprintf(&b, "%s %s up=%v\n", w.names[ds.ID], ds.State, ds.Up)
		}
		return b.String(), nil
	case "place":
		m, err := w.s.Place(ctx, ino())
		if err != nil {
			return "", errors.New(errClass(err))
		}
		return w.fmtMap(m), nil
	case "layout":
		l, err := w.s.Layout(ctx, ino())
		if err != nil {
			return "", errors.New(errClass(err))
		}
		addrs, ok := w.s.Device(l.Device)
		if !ok {
			return "", errors.New("device unknown")
		}
		return fmt.Sprintf("first=%d unit=%d device=%v\n", l.First, l.Unit, addrs), nil
	case "write", "read":
		var off, n uint64
		d.ScanArgs(w.t, "off", &off)
		d.ScanArgs(w.t, "len", &n)
		f, _ := w.s.Open(ino(), d.Cmd == "write")
		defer f.Close()
		buf := make([]byte, n)
		if d.Cmd == "write" {
			for i := range buf {
				buf[i] = ddByte(ino(), off+uint64(i))
			}
			if _, err := f.WriteAt(buf, int64(off)); err != nil {
				w.t.Logf("write: %v", err)
				return "", errors.New(errClass(err))
			}
			if err := w.s.Sync(ino()); err != nil {
				return "", errors.New(errClass(err))
			}
			return "ok\n", nil
		}
		got, err := f.ReadAt(buf, int64(off))
		if err != nil && got == 0 && !errors.Is(err, errEOF) {
			return "", errors.New(errClass(err))
		}
		for i := range got {
			if buf[i] != ddByte(ino(), off+uint64(i)) {
				return fmt.Sprintf("%d bytes, WRONG at %d\n", got, off+uint64(i)), nil
			}
		}
		return fmt.Sprintf("%d bytes ok\n", got), nil
	case "drain", "rebalance":
		req := AdminRequest{}
		if d.Cmd == "drain" {
			req.DS = w.ids[d.CmdArgs[0].Key]
		}
		if _, err := w.admin.Admin(ctx, d.Cmd, mustJSON(req)); err != nil {
			return "", errors.New(errClass(err))
		}
		w.admin.mu.Lock()
		j := w.admin.job
		w.admin.mu.Unlock()
		if j != nil && j.done != nil {
			<-j.done
		}
		st, err := w.admin.Status(ctx)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s: files=%d moved=%d failed=%d\n", d.Cmd, st.Job.Files, st.Job.Moved, st.Job.Failed)
		if st.Job.Err != "" {
			w.t.Logf("%s: %s", d.Cmd, st.Job.Err)
		}
		for _, ds := range st.DataServers {
			fmt.Fprintf(&b, "%s %s files=%d\n", w.names[ds.ID], ds.State, ds.Files)
		}
		return b.String(), nil
	case "du":
		// Bytes allocated by a data server's objects: what a move left
		// behind shows here.
		var total int64
		err := filepath.WalkDir(filepath.Join(w.dir, d.CmdArgs[0].Key), func(path string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return err
			}
			var st syscall.Stat_t
			if err := syscall.Stat(path, &st); err != nil {
				return err
			}
			total += st.Blocks * 512
			return nil
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: %d KiB\n", d.CmdArgs[0].Key, total>>10), nil
	case "remove":
		force := d.HasArg("force")
		res, err := w.admin.Remove(ctx, w.ids[d.CmdArgs[0].Key], force)
		if err != nil {
			msg := err.Error()
			if i := strings.Index(msg, ": invalid request"); i >= 0 {
				msg = msg[:i]
			}
			return "", errors.New(strings.TrimPrefix(msg, "cluster: "))
		}
		if a := w.agents[d.CmdArgs[0].Key]; a != nil {
			<-a.Removed() // told to go
			a.Close()
			delete(w.agents, d.CmdArgs[0].Key)
		}
		return fmt.Sprintf("removed %s, files lost=%d\n", d.CmdArgs[0].Key, res.FilesLost), nil
	}
	return "", fmt.Errorf("unknown command %q", d.Cmd)
}

var errEOF = io.EOF

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
