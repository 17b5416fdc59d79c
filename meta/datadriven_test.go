package meta_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/meta/etcdtest"
	"github.com/shoalfs/shoal/meta/metatest"
)

// TestNamespace runs the scripts in testdata/. Commands take absolute paths,
// resolved with Lookup from the root:
//
//	create|mkdir|mknod|mkfifo PATH        symlink PATH TARGET
//	link EXISTING NEWPATH                 rm PATH
//	mv FROM TO                            ls PATH [max=N]
//	stat PATH                             readlink PATH
//	chmod PATH MODE                       truncate PATH SIZE
//	setpolicy PATH MIRRORS                policy PATH|ino=N
//	setxattr PATH NAME [VALUE] [mode=create|replace]
//	getxattr PATH|ino=N NAME              lsxattr PATH|ino=N [max=N]
//	rmxattr PATH NAME
//	freeorphan N                          reopen
//
// The scripts run against every engine and must give the same output.
func TestNamespace(t *testing.T) {
	t.Run("bolt", func(t *testing.T) { runNamespace(t, openBolt(meta.BoltOptions{NoSync: true})) })
	t.Run("bolt-wal", func(t *testing.T) {
		runNamespace(t, openBolt(meta.BoltOptions{WAL: true, NoSync: true, WALCheckpointBytes: 4 << 10}))
	})
	t.Run("etcd", func(t *testing.T) {
		runNamespace(t, openEtcd(etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})))
	})
}

func runNamespace(t *testing.T, opener metatest.Opener) {
	// testdata/fuzz holds the fuzz targets' corpus, not scripts.
	dirs, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if d.Name() == "fuzz" {
			continue
		}
		t.Run(d.Name(), func(t *testing.T) { runScripts(t, filepath.Join("testdata", d.Name()), opener) })
	}
}

func runScripts(t *testing.T, dir string, opener metatest.Opener) {
	datadriven.Walk(t, dir, func(t *testing.T, file string) {
		dir := t.TempDir()
		open := func() meta.Engine { return opener(t, dir) }
		e := open()
		defer func() { e.Close() }()
		h := &nsHarness{e: e, now: time.Unix(1000, 0)}
		datadriven.RunTest(t, file, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "reopen" {
				e.Close()
				e = open()
				h.e = e
				return "ok"
			}
			out, err := h.run(t, d)
			if err != nil {
				return "error: " + errName(err)
			}
			return out
		})
	})
}

type nsHarness struct {
	e   meta.Engine
	now time.Time
}

func errName(err error) string {
	for _, s := range []struct {
		err  error
		name string
	}{
		{meta.ErrNotFound, "ErrNotFound"}, {meta.ErrStale, "ErrStale"}, {meta.ErrExist, "ErrExist"},
		{meta.ErrNotDir, "ErrNotDir"}, {meta.ErrIsDir, "ErrIsDir"}, {meta.ErrNotEmpty, "ErrNotEmpty"},
		{meta.ErrInval, "ErrInval"}, {meta.ErrNameTooLong, "ErrNameTooLong"}, {meta.ErrNotSymlink, "ErrNotSymlink"},
		{meta.ErrNoXattr, "ErrNoXattr"}, {meta.ErrXattrTooBig, "ErrXattrTooBig"}, {meta.ErrNoSpace, "ErrNoSpace"},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return err.Error()
}

func (h *nsHarness) tick() time.Time {
	h.now = h.now.Add(time.Second)
	return h.now
}

func (h *nsHarness) resolve(p string) (meta.Ino, error) {
	ino := meta.RootIno
	for _, part := range strings.Split(strings.Trim(p, "/"), "/") {
		if part == "" {
			continue
		}
		n, err := h.e.Lookup(context.Background(), ino, part)
		if err != nil {
			return 0, err
		}
		ino = n.Ino
	}
	return ino, nil
}

func (h *nsHarness) parent(p string) (meta.Ino, string, error) {
	ino, err := h.resolve(path.Dir(p))
	return ino, path.Base(p), err
}

func fmtAttr(ino meta.Ino, a meta.Attr) string {
	s := fmt.Sprintf("ino=%d %s mode=%04o nlink=%d size=%d change=%d", ino, a.Type, a.Mode, a.Nlink, a.Size, a.Change)
	if ino != meta.RootIno { // the root's times come from the wall clock
		s += fmt.Sprintf(" mtime=%d", a.Mtime.Unix())
	}
	if a.Type == meta.TypeDirectory {
		s += fmt.Sprintf(" parent=%d", a.Parent)
	}
	return s
}

func (h *nsHarness) run(t *testing.T, d *datadriven.TestData) (string, error) {
	ctx := context.Background()
	arg := func(i int) string {
		if i < len(d.CmdArgs) {
			return d.CmdArgs[i].Key
		}
		t.Fatalf("%s: missing argument %d", d.Cmd, i)
		return ""
	}
	now := h.tick()
	switch d.Cmd {
	case "create", "mkdir", "mknod", "mkfifo", "symlink":
		parent, name, err := h.parent(arg(0))
		if err != nil {
			return "", err
		}
		args := meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}
		switch d.Cmd {
		case "mkdir":
			args = meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}
		case "mknod":
			args = meta.CreateArgs{Type: meta.TypeChar, Mode: 0o600, RdevMajor: 1, RdevMinor: 3}
		case "mkfifo":
			args.Type = meta.TypeFIFO
		case "symlink":
			args = meta.CreateArgs{Type: meta.TypeSymlink, Mode: 0o777, Target: arg(1)}
		}
		n, ci, err := h.e.Create(ctx, parent, name, args, now)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s\ndir change %d -> %d", fmtAttr(n.Ino, n.Attr), ci.Before, ci.After), nil
	case "link":
		ino, err := h.resolve(arg(0))
		if err != nil {
			return "", err
		}
		parent, name, err := h.parent(arg(1))
		if err != nil {
			return "", err
		}
		a, _, err := h.e.Link(ctx, ino, parent, name, now)
		if err != nil {
			return "", err
		}
		return fmtAttr(ino, a), nil
	case "rm":
		parent, name, err := h.parent(arg(0))
		if err != nil {
			return "", err
		}
		n, _, err := h.e.Remove(ctx, parent, name, now)
		if err != nil {
			return "", err
		}
		return fmtAttr(n.Ino, n.Attr), nil
	case "mv":
		sp, sn, err := h.parent(arg(0))
		if err != nil {
			return "", err
		}
		dp, dn, err := h.parent(arg(1))
		if err != nil {
			return "", err
		}
		res, err := h.e.Rename(ctx, sp, sn, dp, dn, now)
		if err != nil {
			return "", err
		}
		out := fmt.Sprintf("src change %d -> %d, dst change %d -> %d", res.Src.Before, res.Src.After, res.Dst.Before, res.Dst.After)
		if res.Replaced.Ino != 0 {
			out += "\nreplaced " + fmtAttr(res.Replaced.Ino, res.Replaced.Attr)
		}
		return out, nil
	case "ls":
		ino, err := h.resolve(arg(0))
		if err != nil {
			return "", err
		}
		max := 1000
		d.MaybeScanArgs(t, "max", &max)
		var b strings.Builder
		cookie := uint64(0)
		for page := 0; page < 100; page++ {
			ents, eof, err := h.e.ReadDir(ctx, ino, cookie, max)
			if err != nil {
				return "", err
			}
			if max < 1000 {
				fmt.Fprintf(&b, "page %d:\n", page)
			}
			for _, en := range ents {
				fmt.Fprintf(&b, "  %d %s %s\n", en.Cookie, en.Name, fmtAttr(en.Ino, en.Attr))
				cookie = en.Cookie
			}
			if eof {
				break
			}
		}
		return b.String(), nil
	case "stat":
		ino, err := h.resolve(arg(0))
		if err != nil {
			return "", err
		}
		a, err := h.e.GetAttr(ctx, ino)
		if err != nil {
			return "", err
		}
		return fmtAttr(ino, a), nil
	case "readlink":
		ino, err := h.resolve(arg(0))
		if err != nil {
			return "", err
		}
		return h.e.Readlink(ctx, ino)
	case "setpolicy":
		ino, err := h.resolve(arg(0))
		if err != nil {
			return "", err
		}
		m, err := strconv.Atoi(arg(1))
		if err != nil {
			t.Fatalf("bad number %q", arg(1))
		}
		if err := h.e.SetPolicy(ctx, ino, meta.Policy{Mirrors: m}); err != nil {
			return "", err
		}
		return "ok", nil
	case "policy":
		var ino meta.Ino
		var err error
		if d.HasArg("ino") {
			var n uint64
			d.ScanArgs(t, "ino", &n)
			ino = meta.Ino(n)
		} else if ino, err = h.resolve(arg(0)); err != nil {
			return "", err
		}
		p, err := h.e.Policy(ctx, ino)
		if err != nil {
			return "", err
		}
		if p.Mirrors == 0 {
			return fmt.Sprintf("ino=%d none", ino), nil
		}
		return fmt.Sprintf("ino=%d mirrors=%d", ino, p.Mirrors), nil
	case "setxattr", "rmxattr":
		ino, err := h.resolve(arg(0))
		if err != nil {
			return "", err
		}
		var ci meta.ChangeInfo
		if d.Cmd == "rmxattr" {
			ci, err = h.e.RemoveXattr(ctx, ino, arg(1), now)
		} else {
			var value string
			if len(d.CmdArgs) > 2 && d.CmdArgs[2].Vals == nil {
				value = arg(2)
			}
			mode := meta.XattrEither
			if d.HasArg("mode") {
				var m string
				d.ScanArgs(t, "mode", &m)
				mode = map[string]meta.XattrMode{"create": meta.XattrCreate, "replace": meta.XattrReplace}[m]
			}
			ci, err = h.e.SetXattr(ctx, ino, arg(1), []byte(value), mode, now)
		}
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("change %d -> %d", ci.Before, ci.After), nil
	case "getxattr", "lsxattr":
		var pos []string // arguments without a value
		for _, a := range d.CmdArgs {
			if a.Vals == nil {
				pos = append(pos, a.Key)
			}
		}
		var ino meta.Ino
		var err error
		if d.HasArg("ino") {
			var n uint64
			d.ScanArgs(t, "ino", &n)
			ino = meta.Ino(n)
		} else if len(pos) == 0 {
			t.Fatalf("%s: no path", d.Cmd)
		} else if ino, err = h.resolve(pos[0]); err != nil {
			return "", err
		} else {
			pos = pos[1:]
		}
		if d.Cmd == "getxattr" {
			if len(pos) == 0 {
				t.Fatalf("getxattr: no name")
			}
			v, err := h.e.GetXattr(ctx, ino, pos[0])
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%q", v), nil
		}
		max := 1000
		d.MaybeScanArgs(t, "max", &max)
		var b strings.Builder
		cookie := uint64(0)
		for page := 0; page < 100; page++ {
			names, eof, err := h.e.ListXattrs(ctx, ino, cookie, max)
			if err != nil {
				return "", err
			}
			if max < 1000 {
				fmt.Fprintf(&b, "page %d:\n", page)
			}
			for _, n := range names {
				fmt.Fprintf(&b, "  %d %s\n", n.Cookie, n.Name)
				cookie = n.Cookie
			}
			if eof {
				break
			}
		}
		return b.String(), nil
	case "freeorphan":
		n, err := strconv.ParseUint(arg(0), 10, 64)
		if err != nil {
			t.Fatalf("bad number %q", arg(0))
		}
		a, err := h.e.FreeOrphan(ctx, meta.Ino(n))
		if err != nil {
			return "", err
		}
		return fmtAttr(meta.Ino(n), a), nil
	case "chmod", "truncate":
		ino, err := h.resolve(arg(0))
		if err != nil {
			return "", err
		}
		var v uint64
		base := 10
		if d.Cmd == "chmod" {
			base = 8
		}
		if _, err := fmt.Sscan(prefixBase(arg(1), base), &v); err != nil {
			t.Fatalf("bad number %q", arg(1))
		}
		sa := meta.SetAttr{Mask: meta.SetSize, Size: v}
		if d.Cmd == "chmod" {
			sa = meta.SetAttr{Mask: meta.SetMode, Mode: uint32(v)}
		}
		a, err := h.e.SetAttr(ctx, ino, sa, now)
		if err != nil {
			return "", err
		}
		return fmtAttr(ino, a), nil
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return "", nil
}

func prefixBase(s string, base int) string {
	if base == 8 && !strings.HasPrefix(s, "0") {
		return "0" + s
	}
	return s
}
