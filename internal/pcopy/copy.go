package pcopy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultChunk is the default chunk size: four stripe units of Shoal's
// default 1 MiB, so one chunk's ReadAt or WriteAt keeps four data servers
// busy at once.
const DefaultChunk = 4 << 20

// DefaultJobs is the default number of chunks in flight.
const DefaultJobs = 8

// ErrVerify is returned (wrapped) when --verify found files whose
// destination checksum differs from the source's.
var ErrVerify = errors.New("checksum mismatch")

// Endpoint is one side of a copy: a file system and a path in it.
type Endpoint struct {
	FS   FS
	Path string
}

// Options configures a copy. The zero value copies one file with the
// defaults.
type Options struct {
	// Recursive copies directory trees; without it a directory source
	// is an error.
	Recursive bool
	// Jobs is the number of chunks in flight (read, written or being
	// checksummed) across all files. Default DefaultJobs.
	Jobs int
	// Chunk is the chunk size in bytes, rounded up to a multiple of
	// 64 KiB. Default DefaultChunk. A resumed copy keeps the chunk size
	// of its journal.
	Chunk int64
	// Journal is where progress is recorded. Default: JournalName in the
	// destination directory (the tree root for a directory copy, the
	// parent of the target for a file).
	Journal *Endpoint
	// Resume continues the copy recorded in an existing journal. Without
	// it an existing journal is an error, so an interrupted copy is not
	// silently restarted from scratch.
	Resume bool
	// Verify computes the SHA-256 of every file while reading the
	// source, re-reads the destination and compares. A file that does
	// not match is not installed and makes Run return ErrVerify.
	Verify bool
	// Checkpoint is how many bytes of a file are written between syncs
	// that let the journal record its completed chunks. Default 16 MiB.
	Checkpoint int64
	// Archive keeps what a root file system needs besides contents,
	// modes and mtimes: numeric owners and groups, hard links (files of
	// the source with one ID become one file with several names) and
	// devices, FIFOs and sockets (created with MKNOD). It is what a copy
	// of an operating system tree wants, and needs a destination that
	// lets the caller set owners (root, without root squashing).
	Archive bool
	// Logger receives warnings (skipped special files). Default: discard.
	Logger *slog.Logger
}

// Progress is a snapshot of a running copy.
type Progress struct {
	Bytes, TotalBytes int64 // bytes done (copied or resumed), bytes in the source
	Copied            int64 // bytes written by this run (for the rate)
	Files, TotalFiles int64 // regular files done, regular files in the source
	Scanning          bool  // still walking the source
	Elapsed           time.Duration
}

// Mismatch is a file whose destination checksum differed from the source.
type Mismatch struct {
	Path      string // relative to the copy's root
	Src, Dest string // hex SHA-256
}

// Summary is what a finished (or failed) copy did.
type Summary struct {
	Files, Dirs, Symlinks int64 // objects created
	Links                 int64 // hard links made to files copied once (Archive)
	Specials              int64 // devices, FIFOs and sockets created (Archive)
	Skipped               int64 // special files not copied
	ResumedFiles          int64 // files completed by an earlier run, not recopied
	Bytes                 int64 // bytes copied by this run
	ResumedBytes          int64 // bytes an earlier run had copied
	Verified              int64 // files whose checksums matched
	Mismatches            []Mismatch
	Elapsed               time.Duration
	Target                string // the destination path the source was copied to
}

// Copier runs one copy, once. Progress may be called from any goroutine
// while Run runs.
type Copier struct {
	src, dst Endpoint
	opts     Options
	log      *slog.Logger

	start      time.Time // set by New, read-only after
	scanning   atomic.Bool
	bytes      atomic.Int64 // done, including resumed
	copied     atomic.Int64
	totalBytes atomic.Int64
	files      atomic.Int64
	totalFiles atomic.Int64

	mu  sync.Mutex
	sum Summary

	// run state
	target  string // destination path of the source root
	jrnl    *journal
	resumed *journalState
	pool    chan []byte
	vpool   sync.Pool
}

// New prepares a copy of src to dst. Like cp, if dst is an existing
// directory the source is copied into it under its own name; otherwise
// it is copied to dst itself.
func New(src, dst Endpoint, opts Options) *Copier {
	if opts.Jobs <= 0 {
		opts.Jobs = DefaultJobs
	}
	if opts.Chunk <= 0 {
		opts.Chunk = DefaultChunk
	}
	opts.Chunk = (opts.Chunk + 64<<10 - 1) &^ (64<<10 - 1)
	if opts.Checkpoint <= 0 {
		opts.Checkpoint = 16 << 20
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Copier{src: src, dst: dst, opts: opts, log: log, start: time.Now()}
	c.scanning.Store(true)
	return c
}

// Copy is New(src, dst, opts).Run(ctx).
func Copy(ctx context.Context, src, dst Endpoint, opts Options) (Summary, error) {
	return New(src, dst, opts).Run(ctx)
}

// Progress returns a snapshot of the copy's progress.
func (c *Copier) Progress() Progress {
	p := Progress{
		Bytes: c.bytes.Load(), TotalBytes: c.totalBytes.Load(), Copied: c.copied.Load(),
		Files: c.files.Load(), TotalFiles: c.totalFiles.Load(), Scanning: c.scanning.Load(),
	}
	p.Elapsed = time.Since(c.start)
	return p
}

// entry is one object of the source tree.
type entry struct {
	rel  string // slash path relative to the source root; "." for the root
	info Info
	// linkTo, with Archive, is the rel of the first name of a regular
	// file with several names: this one becomes a hard link to it.
	linkTo string
}

func (c *Copier) srcPath(rel string) string { return path.Join(c.src.Path, rel) }
func (c *Copier) dstPath(rel string) string { return path.Join(c.target, rel) }

// tmpPath is where a file is written before it is renamed into place:
// in the same directory (so the rename is atomic) under a name derived
// from the final one (so a resumed copy finds it).
func tmpPath(p string) string {
	return path.Join(path.Dir(p), "."+path.Base(p)+".shoal-cp.tmp")
}

// Run performs the copy. On error (including a cancelled ctx) the files
// completed so far are in place, files being copied are left under their
// temporary names, and the journal records both, for Options.Resume.
func (c *Copier) Run(ctx context.Context) (sum Summary, err error) {
	defer func() {
		c.mu.Lock()
		sum = c.sum
		c.mu.Unlock()
		sum.Bytes = c.copied.Load()
		sum.Elapsed = time.Since(c.start)
		sum.Target = c.target
	}()
	root, err := c.src.FS.Lstat(ctx, c.src.Path)
	if err != nil {
		return sum, fmt.Errorf("source: %w", err)
	}
	if root.Type == TypeDir && !c.opts.Recursive {
		return sum, fmt.Errorf("source %s is a directory (use -r)", c.src.Path)
	}
	if root.Type == TypeOther {
		return sum, fmt.Errorf("source %s is a special file", c.src.Path)
	}
	if err := c.prepare(ctx, root); err != nil {
		return sum, err
	}
	completed := false
	defer func() {
		if c.jrnl == nil {
			return
		}
		// The journal goes only when there is nothing left to resume.
		cerr := c.jrnl.Close(context.WithoutCancel(ctx), completed)
		if err == nil && cerr != nil {
			err = cerr
		}
	}()

	entries, err := c.walk(ctx, root)
	c.scanning.Store(false)
	if err != nil {
		return sum, err
	}
	if err := c.makeDirsAndLinks(ctx, entries); err != nil {
		return sum, err
	}
	if err := c.copyFiles(ctx, entries); err != nil {
		return sum, err
	}
	c.mu.Lock()
	mism := len(c.sum.Mismatches)
	c.mu.Unlock()
	// Hard links once their files are in place; a file that failed
	// verification is not, and its links wait for the resumed copy.
	if mism == 0 {
		if err := c.makeHardLinks(ctx, entries); err != nil {
			return sum, err
		}
	}
	// Directory attributes last, deepest first: writing into a directory
	// changes its mtime, and a read-only mode would stop the writes.
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.info.Type != TypeDir {
			continue
		}
		if err := c.setAttrs(ctx, c.dstPath(e.rel), e.info); err != nil {
			return sum, err
		}
	}
	if mism > 0 {
		return sum, fmt.Errorf("%d file(s) differ after copying: %w", mism, ErrVerify)
	}
	completed = true
	return sum, nil
}

// prepare decides the target path and opens (or resumes) the journal.
func (c *Copier) prepare(ctx context.Context, root Info) error {
	dfs := c.dst.FS
	dst := path.Clean(c.dst.Path)
	dinfo, derr := dfs.Lstat(ctx, dst)
	dstIsDir := derr == nil && dinfo.Type == TypeDir
	if derr != nil && !errors.Is(derr, fs.ErrNotExist) {
		return fmt.Errorf("destination: %w", derr)
	}
	if derr == nil && !dstIsDir && root.Type == TypeDir {
		return fmt.Errorf("cannot copy directory %s over %s %s", c.src.Path, dinfo.Type, dst)
	}
	var jdir string // directory of the default journal
	switch {
	case dstIsDir:
		c.target = path.Join(dst, path.Base(path.Clean(c.src.Path)))
		jdir = dst
	case root.Type == TypeDir:
		c.target = dst
		jdir = dst
	default:
		c.target = dst
		jdir = path.Dir(dst)
	}
	jep := Endpoint{FS: dfs, Path: path.Join(jdir, JournalName)}
	if c.opts.Journal != nil {
		jep = *c.opts.Journal
	}
	st, err := readJournal(ctx, jep.FS, jep.Path)
	if err != nil {
		return err
	}
	if st != nil && !c.opts.Resume {
		return fmt.Errorf("journal %s exists (an interrupted copy, or one still running): use --resume to continue it, or remove it", jep.Path)
	}
	var size int64
	if st != nil {
		if st.hdr.Src != path.Clean(c.src.Path) {
			return fmt.Errorf("journal %s is of a copy of %s, not %s", jep.Path, st.hdr.Src, c.src.Path)
		}
		c.target = path.Join(path.Dir(jep.Path), st.hdr.Target)
		if c.opts.Journal != nil {
			c.target = st.hdr.Target
		}
		c.opts.Chunk = st.hdr.Chunk
		c.resumed = st
		info, err := jep.FS.Lstat(ctx, jep.Path)
		if err != nil {
			return err
		}
		size = info.Size
	}
	if root.Type == TypeDir {
		if err := dfs.MkdirAll(ctx, c.target, root.Perm|0o700); err != nil {
			return fmt.Errorf("create %s: %w", c.target, err)
		}
	}
	hdr := journalHeader{Chunk: c.opts.Chunk, Src: path.Clean(c.src.Path), Target: c.target}
	if c.opts.Journal == nil {
		rel, ok := relPath(path.Dir(jep.Path), c.target)
		if !ok {
			return fmt.Errorf("internal error: target %s not under %s", c.target, path.Dir(jep.Path))
		}
		hdr.Target = rel
	}
	j, err := openJournal(ctx, jep.FS, jep.Path, hdr, st, size)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	c.jrnl = j
	return nil
}

func relPath(base, p string) (string, bool) {
	base, p = path.Clean(base), path.Clean(p)
	if base == p {
		return ".", true
	}
	prefix := base + "/"
	if base == "/" {
		prefix = "/"
	}
	return strings.CutPrefix(p, prefix)
}

// setAttrs gives name the source's attributes: with Archive first its
// owner (a change of owner may clear setuid and setgid bits), then its
// mode and mtime.
func (c *Copier) setAttrs(ctx context.Context, name string, in Info) error {
	if c.opts.Archive {
		if err := c.dst.FS.Chown(ctx, name, in.UID, in.GID); err != nil {
			return fmt.Errorf("set owner of %s to %d:%d: %w", name, in.UID, in.GID, err)
		}
	}
	if err := c.dst.FS.SetAttr(ctx, name, in.Type, in.Perm, in.Mtime); err != nil {
		return fmt.Errorf("set attributes of %s: %w", name, err)
	}
	return nil
}

// walk lists the source tree depth-first, parents before children. With
// Archive, the second and later names of a regular file with several
// links get linkTo set and are not counted as files to copy.
func (c *Copier) walk(ctx context.Context, root Info) ([]entry, error) {
	out := []entry{{rel: ".", info: root}}
	c.count(root)
	firstName := map[FileID]string{}
	if root.Type != TypeDir {
		return out, nil
	}
	var rec func(rel string) error
	rec = func(rel string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		ents, err := c.src.FS.ReadDir(ctx, c.srcPath(rel))
		if err != nil {
			return fmt.Errorf("read directory %s: %w", c.srcPath(rel), err)
		}
		for _, in := range ents {
			r := path.Join(rel, in.Name)
			e := entry{rel: r, info: in}
			if c.opts.Archive && in.Type == TypeFile && in.Nlink > 1 {
				if first, ok := firstName[in.ID]; ok {
					e.linkTo = first
				} else {
					firstName[in.ID] = r
				}
			}
			out = append(out, e)
			if e.linkTo == "" {
				c.count(in)
			}
			if in.Type == TypeDir {
				if err := rec(r); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, rec(".")
}

func (c *Copier) count(in Info) {
	if in.Type == TypeFile {
		c.totalFiles.Add(1)
		c.totalBytes.Add(in.Size)
	}
}

func (c *Copier) makeDirsAndLinks(ctx context.Context, entries []entry) error {
	dfs := c.dst.FS
	for _, e := range entries {
		d := c.dstPath(e.rel)
		switch e.info.Type {
		case TypeDir:
			if e.rel != "." {
				if err := dfs.MkdirAll(ctx, d, e.info.Perm|0o700); err != nil {
					return fmt.Errorf("create %s: %w", d, err)
				}
			}
			c.note(func(s *Summary) { s.Dirs++ })
		case TypeSymlink:
			target, err := c.src.FS.Readlink(ctx, c.srcPath(e.rel))
			if err != nil {
				return fmt.Errorf("read link %s: %w", c.srcPath(e.rel), err)
			}
			if old, err := dfs.Lstat(ctx, d); err == nil && old.Type != TypeDir {
				if err := dfs.Remove(ctx, d); err != nil {
					return fmt.Errorf("replace %s: %w", d, err)
				}
			}
			if err := dfs.Symlink(ctx, target, d); err != nil {
				return fmt.Errorf("create symlink %s: %w", d, err)
			}
			if c.opts.Archive {
				if err := dfs.Chown(ctx, d, e.info.UID, e.info.GID); err != nil {
					return fmt.Errorf("set owner of %s to %d:%d: %w", d, e.info.UID, e.info.GID, err)
				}
			}
			// Not every server lets a symlink's mtime be set; the link
			// itself is what matters.
			if err := dfs.SetAttr(ctx, d, TypeSymlink, 0, e.info.Mtime); err != nil {
				c.log.Debug("cannot set symlink mtime", "path", d, "err", err)
			}
			c.note(func(s *Summary) { s.Symlinks++ })
		case TypeOther:
			if c.opts.Archive && e.info.Special != 0 {
				if err := c.makeSpecial(ctx, d, e.info); err != nil {
					return err
				}
				c.note(func(s *Summary) { s.Specials++ })
				continue
			}
			c.log.Warn("skipping special file", "path", c.srcPath(e.rel))
			c.note(func(s *Summary) { s.Skipped++ })
		}
	}
	return nil
}

// makeSpecial creates a device, FIFO or socket at d (replacing what a
// resumed copy left there) with the source's attributes.
func (c *Copier) makeSpecial(ctx context.Context, d string, in Info) error {
	dfs := c.dst.FS
	if old, err := dfs.Lstat(ctx, d); err == nil && old.Type != TypeDir {
		if err := dfs.Remove(ctx, d); err != nil {
			return fmt.Errorf("replace %s: %w", d, err)
		}
	}
	if err := dfs.Mknod(ctx, d, in.Special|in.Perm, in.RdevMajor, in.RdevMinor); err != nil {
		return fmt.Errorf("create special file %s: %w", d, err)
	}
	return c.setAttrs(ctx, d, in)
}

// makeHardLinks links the later names of multiply linked files to their
// first name, which copyFiles installed. A name already there (a resumed
// copy) is replaced, so the link is right even if the source changed.
func (c *Copier) makeHardLinks(ctx context.Context, entries []entry) error {
	dfs := c.dst.FS
	for _, e := range entries {
		if e.linkTo == "" {
			continue
		}
		d, first := c.dstPath(e.rel), c.dstPath(e.linkTo)
		if old, err := dfs.Lstat(ctx, d); err == nil && old.Type != TypeDir {
			if err := dfs.Remove(ctx, d); err != nil {
				return fmt.Errorf("replace %s: %w", d, err)
			}
		}
		if err := dfs.Link(ctx, first, d); err != nil {
			return fmt.Errorf("hard link %s to %s: %w", d, first, err)
		}
		c.note(func(s *Summary) { s.Links++ })
	}
	return nil
}

func (c *Copier) note(f func(*Summary)) {
	c.mu.Lock()
	f(&c.sum)
	c.mu.Unlock()
}

// fileJob is one regular file being copied.
type fileJob struct {
	rel      string
	info     Info
	key      fileKey
	src, dst string // source path, final destination path
	tmp      string
	resume   bool // the temp file holds chunks of an earlier run
	tasks    atomic.Int64

	openOnce sync.Once
	openErr  error
	r        ReadFile
	w        WriteFile

	mu       sync.Mutex
	hash     hash.Hash // nil without Verify
	hashed   int64     // bytes hashed so far (in order)
	pending  map[int64][]byte
	unsynced []int64
	unsyncN  int64
}

// task is one chunk of a file; n == 0 marks the single task of an empty
// file or of a file whose chunks were all copied by an earlier run.
type task struct {
	f         *fileJob
	off, n    int64
	skipWrite bool // copied by an earlier run; read only for the checksum
	buf       []byte
}

func (c *Copier) copyFiles(ctx context.Context, entries []entry) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c.pool = make(chan []byte, c.opts.Jobs)
	for range c.opts.Jobs {
		c.pool <- nil // allocated on first use
	}
	tasks := make(chan task)
	var wg sync.WaitGroup
	for range c.opts.Jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range tasks {
				if err := c.runTask(ctx, t); err != nil {
					cancel(err)
				}
			}
		}()
	}
	var opened []*fileJob
	dispatch := func() error {
		for _, e := range entries {
			if e.info.Type != TypeFile || e.linkTo != "" {
				continue
			}
			f, ts, err := c.plan(ctx, e)
			if err != nil {
				return err
			}
			if f == nil {
				continue
			}
			opened = append(opened, f)
			f.tasks.Store(int64(len(ts)))
			for _, t := range ts {
				var buf []byte
				select {
				case buf = <-c.pool:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
				if int64(cap(buf)) < c.opts.Chunk {
					buf = make([]byte, c.opts.Chunk)
				}
				t.buf = buf
				select {
				case tasks <- t:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
		}
		return nil
	}
	derr := dispatch()
	close(tasks)
	wg.Wait()
	if derr != nil {
		cancel(derr)
	}
	// Files a failure left open: close them so their data is committed
	// and the temp file can be resumed.
	for _, f := range opened {
		f.closeFiles()
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// plan decides what is left to do for a file: nothing (completed by an
// earlier run), or a list of chunk tasks.
func (c *Copier) plan(ctx context.Context, e entry) (*fileJob, []task, error) {
	k := fileKey{e.info.Size, e.info.Mtime.UnixNano()}
	f := &fileJob{rel: e.rel, info: e.info, key: k, src: c.srcPath(e.rel), dst: c.dstPath(e.rel)}
	f.tmp = tmpPath(f.dst)
	var done map[int64]bool
	if c.resumed != nil {
		jf := c.resumed.file(e.rel, k)
		// A file is complete if the journal says so, or (without Verify,
		// which wants the journal's checksum) if it is in place with the
		// source's size and mtime: the journal lags by up to a second,
		// and a killed copy may have installed files it did not record.
		if in, err := c.dst.FS.Lstat(ctx, f.dst); err == nil && in.Type == TypeFile && in.Size == e.info.Size &&
			((jf != nil && jf.done) || (!c.opts.Verify && in.Mtime.Equal(e.info.Mtime))) {
			c.bytes.Add(e.info.Size)
			c.files.Add(1)
			c.note(func(s *Summary) { s.ResumedFiles++; s.ResumedBytes += e.info.Size })
			return nil, nil, nil
		}
		if jf != nil && !jf.done && len(jf.chunks) > 0 {
			var end int64
			for off := range jf.chunks {
				end = max(end, min(off+c.opts.Chunk, e.info.Size))
			}
			if in, err := c.dst.FS.Lstat(ctx, f.tmp); err == nil && in.Type == TypeFile && in.Size >= end {
				done = jf.chunks
				f.resume = true
			}
		}
	}
	if c.opts.Verify {
		f.hash = sha256.New()
		f.pending = map[int64][]byte{}
	}
	var ts []task
	for off := int64(0); off < e.info.Size; off += c.opts.Chunk {
		n := min(c.opts.Chunk, e.info.Size-off)
		if done[off] {
			c.bytes.Add(n)
			c.note(func(s *Summary) { s.ResumedBytes += n })
			if !c.opts.Verify {
				continue
			}
		}
		ts = append(ts, task{f: f, off: off, n: n, skipWrite: done[off]})
	}
	if len(ts) == 0 {
		ts = append(ts, task{f: f})
	}
	return f, ts, nil
}

func (f *fileJob) open(ctx context.Context, c *Copier) error {
	f.openOnce.Do(func() {
		r, err := c.src.FS.Open(ctx, f.src)
		if err != nil {
			f.openErr = fmt.Errorf("open %s: %w", f.src, err)
			return
		}
		w, err := c.dst.FS.Create(ctx, f.tmp, !f.resume)
		if err != nil {
			r.Close()
			f.openErr = fmt.Errorf("create %s: %w", f.tmp, err)
			return
		}
		f.r, f.w = r, w
	})
	return f.openErr
}

// closeFiles closes whatever of the file is still open (after a failure).
func (f *fileJob) closeFiles() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.r != nil {
		f.r.Close()
		f.r = nil
	}
	if f.w != nil {
		f.w.Close()
		f.w = nil
	}
}

func (c *Copier) runTask(ctx context.Context, t task) error {
	f := t.f
	if ctx.Err() != nil {
		c.pool <- t.buf // never used
		return nil
	}
	if err := c.copyChunk(ctx, t); err != nil {
		return err
	}
	if f.tasks.Add(-1) == 0 {
		return c.finish(ctx, f)
	}
	return nil
}

// copyChunk reads one chunk from the source and writes it to the temp
// file, hands it to the checksum, and syncs and journals completed
// chunks every Checkpoint bytes. It returns t.buf to the pool, or, if
// the chunk fails, a nil buffer in its place: a WRITE abandoned by a
// cancelled context may still read the buffer, so it is never reused.
func (c *Copier) copyChunk(ctx context.Context, t task) error {
	f := t.f
	if err := c.copyChunkData(ctx, t); err != nil {
		c.pool <- nil
		return err
	}
	if t.n == 0 {
		c.pool <- t.buf
		return nil
	}
	var sync []int64
	f.mu.Lock()
	if !t.skipWrite {
		f.unsynced = append(f.unsynced, t.off)
		f.unsyncN += t.n
		if f.unsyncN >= c.opts.Checkpoint && f.tasks.Load() > 1 {
			sync, f.unsynced, f.unsyncN = f.unsynced, nil, 0
		}
	}
	if f.hash != nil {
		// Chunks complete out of order but SHA-256 is sequential: park
		// them until their turn. Chunks are dispatched in order, each
		// holding a buffer, so the one awaited always has its buffer
		// and the wait is bounded by Jobs.
		f.pending[t.off] = t.buf[:t.n]
		for {
			b, ok := f.pending[f.hashed]
			if !ok {
				break
			}
			delete(f.pending, f.hashed)
			f.hash.Write(b)
			f.hashed += int64(len(b))
			c.pool <- b[:cap(b)]
		}
	} else {
		c.pool <- t.buf
	}
	f.mu.Unlock()
	if len(sync) > 0 {
		if err := f.w.Sync(ctx); err != nil {
			return fmt.Errorf("sync %s: %w", f.tmp, err)
		}
		for _, off := range sync {
			c.jrnl.chunk(f.rel, f.key, off)
		}
	}
	return nil
}

func (c *Copier) copyChunkData(ctx context.Context, t task) error {
	f := t.f
	if err := f.open(ctx, c); err != nil {
		return err
	}
	if t.n == 0 {
		return nil
	}
	buf := t.buf[:t.n]
	n, err := f.r.ReadAt(ctx, buf, t.off)
	if int64(n) < t.n {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("file shrank during the copy (%d bytes at %d, want %d)", n, t.off, t.n)
		}
		return fmt.Errorf("read %s: %w", f.src, err)
	}
	if t.skipWrite {
		return nil
	}
	if _, err := f.w.WriteAt(ctx, buf, t.off); err != nil {
		return fmt.Errorf("write %s: %w", f.tmp, err)
	}
	c.bytes.Add(t.n)
	c.copied.Add(t.n)
	return nil
}

// finish installs a fully written file: close (commit), verify, set mode
// and mtime, rename into place, journal.
func (c *Copier) finish(ctx context.Context, f *fileJob) error {
	f.mu.Lock()
	r, w := f.r, f.w
	f.r, f.w = nil, nil
	f.mu.Unlock()
	if r != nil {
		r.Close()
	}
	if w != nil {
		if err := w.Close(); err != nil {
			return fmt.Errorf("write %s: %w", f.tmp, err)
		}
	}
	var sum string
	if f.hash != nil {
		sum = hex.EncodeToString(f.hash.Sum(nil))
		got, err := c.checksum(ctx, f)
		if err != nil {
			return err
		}
		if got != sum {
			c.note(func(s *Summary) { s.Mismatches = append(s.Mismatches, Mismatch{Path: f.rel, Src: sum, Dest: got}) })
			if err := c.dst.FS.Remove(ctx, f.tmp); err != nil {
				return fmt.Errorf("remove %s: %w", f.tmp, err)
			}
			return nil
		}
		c.note(func(s *Summary) { s.Verified++ })
	}
	if err := c.setAttrs(ctx, f.tmp, f.info); err != nil {
		return err
	}
	if err := c.dst.FS.Rename(ctx, f.tmp, f.dst); err != nil {
		return fmt.Errorf("rename %s: %w", f.dst, err)
	}
	c.jrnl.fileDone(f.rel, f.key, sum)
	c.files.Add(1)
	c.note(func(s *Summary) { s.Files++ })
	return nil
}

// checksum re-reads the written temp file and returns its SHA-256.
func (c *Copier) checksum(ctx context.Context, f *fileJob) (string, error) {
	r, err := c.dst.FS.Open(ctx, f.tmp)
	if err != nil {
		return "", fmt.Errorf("verify %s: %w", f.tmp, err)
	}
	defer r.Close()
	bp, _ := c.vpool.Get().(*[]byte)
	if bp == nil || int64(len(*bp)) < c.opts.Chunk {
		b := make([]byte, c.opts.Chunk)
		bp = &b
	}
	defer c.vpool.Put(bp)
	h := sha256.New()
	for off := int64(0); off < f.info.Size; {
		n := min(c.opts.Chunk, f.info.Size-off)
		got, err := r.ReadAt(ctx, (*bp)[:n], off)
		if int64(got) < n && err == nil {
			err = io.ErrUnexpectedEOF
		}
		if int64(got) < n {
			return "", fmt.Errorf("verify %s: %w", f.tmp, err)
		}
		h.Write((*bp)[:n])
		off += n
	}
	// Nothing may follow the data either.
	var one [1]byte
	if n, _ := r.ReadAt(ctx, one[:], f.info.Size); n > 0 {
		h.Write([]byte("trailing data"))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
