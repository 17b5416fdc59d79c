package pcopy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"time"
)

// JournalName is the default journal file name, in the destination
// directory.
const JournalName = ".shoal-cp-journal"

const journalMagic = "shoal-cp-journal 1"

// journalHeader identifies the copy a journal belongs to. Target is the
// destination tree root relative to the journal's directory ("." when the
// journal is inside it), so a resumed copy lands where the first run
// decided, even though the destination directory now exists.
type journalHeader struct {
	Chunk  int64
	Src    string
	Target string
}

// fileKey identifies one version of a source file: a changed size or
// mtime invalidates everything recorded for it.
type fileKey struct {
	Size  int64
	Mtime int64 // ns
}

type journalFile struct {
	key    fileKey
	done   bool
	sum    string         // hex SHA-256 of a completed file, "" without --verify
	chunks map[int64]bool // offsets of completed chunks
}

// journalState is what a journal says was done.
type journalState struct {
	hdr   journalHeader
	files map[string]*journalFile
}

func (s *journalState) file(rel string, k fileKey) *journalFile {
	jf := s.files[rel]
	if jf == nil || jf.key != k {
		return nil
	}
	return jf
}

// parseJournal reads a journal. Lines that do not parse (the torn last
// line of a killed copy) are ignored: losing a record only means copying
// that chunk again.
func parseJournal(data []byte) (*journalState, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() {
		return nil, errors.New("empty journal")
	}
	st := &journalState{files: map[string]*journalFile{}}
	h, err := parseHeader(sc.Text())
	if err != nil {
		return nil, err
	}
	st.hdr = h
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasSuffix(line, "\"") || len(line) < 2 {
			continue
		}
		f := strings.SplitN(line, " ", 5)
		if len(f) < 4 {
			continue
		}
		size, err1 := strconv.ParseInt(f[1], 10, 64)
		mt, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || len(f) != 5 {
			continue
		}
		rel, err := strconv.Unquote(f[4])
		if err != nil {
			continue
		}
		k := fileKey{size, mt}
		jf := st.files[rel]
		if jf == nil || jf.key != k {
			jf = &journalFile{key: k, chunks: map[int64]bool{}}
			st.files[rel] = jf
		}
		switch f[0] {
		case "c":
			off, err := strconv.ParseInt(f[3], 10, 64)
			if err == nil {
				jf.chunks[off] = true
			}
		case "f":
			jf.done = true
			if f[3] != "-" {
				jf.sum = f[3]
			}
		}
	}
	return st, nil
}

func parseHeader(line string) (journalHeader, error) {
	var h journalHeader
	rest, ok := strings.CutPrefix(line, journalMagic+" ")
	if !ok {
		return h, errors.New("not a shoal cp journal")
	}
	f := strings.SplitN(rest, " ", 2)
	if len(f) != 2 {
		return h, errors.New("bad journal header")
	}
	c, err := strconv.ParseInt(strings.TrimPrefix(f[0], "chunk="), 10, 64)
	if err != nil || c <= 0 {
		return h, errors.New("bad journal header")
	}
	h.Chunk = c
	var src, target string
	if _, err := fmt.Sscanf(f[1], "%q %q", &src, &target); err != nil {
		return h, fmt.Errorf("bad journal header: %w", err)
	}
	h.Src, h.Target = src, target
	return h, nil
}

func (h journalHeader) String() string {
	return fmt.Sprintf("%s chunk=%d %q %q\n", journalMagic, h.Chunk, h.Src, h.Target)
}

// readJournal loads the journal at name, or returns (nil, nil) if there is
// none.
func readJournal(ctx context.Context, fsys FS, name string) (*journalState, error) {
	info, err := fsys.Lstat(ctx, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if info.Type != TypeFile {
		return nil, fmt.Errorf("journal %s is a %s", name, info.Type)
	}
	f, err := fsys.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data := make([]byte, info.Size)
	n, err := f.ReadAt(ctx, data, 0)
	if err != nil && !(err == io.EOF && int64(n) == info.Size) {
		return nil, err
	}
	st, err := parseJournal(data[:n])
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", name, err)
	}
	return st, nil
}

// journal appends records to the journal file. Records are buffered and
// written and synced at most once per flushEvery, and at Close: a record
// lost to a crash only costs recopying, while a record is never written
// before the data it describes was synced.
type journal struct {
	fsys FS
	name string

	mu    sync.Mutex
	w     WriteFile
	off   int64
	buf   bytes.Buffer
	err   error
	stop  chan struct{}
	wg    sync.WaitGroup
	flush time.Duration
}

func openJournal(ctx context.Context, fsys FS, name string, hdr journalHeader, resume *journalState, size int64) (*journal, error) {
	w, err := fsys.Create(ctx, name, resume == nil)
	if err != nil {
		return nil, err
	}
	j := &journal{fsys: fsys, name: name, w: w, stop: make(chan struct{}), flush: time.Second}
	if resume == nil {
		j.buf.WriteString(hdr.String())
		if err := j.flushLocked(ctx); err != nil {
			w.Close()
			return nil, err
		}
	} else {
		j.off = size
		// A torn last line would glue onto the next record.
		j.buf.WriteString("\n")
	}
	j.wg.Add(1)
	go j.loop()
	return j, nil
}

func (j *journal) loop() {
	defer j.wg.Done()
	t := time.NewTicker(j.flush)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-t.C:
			j.mu.Lock()
			if j.err == nil {
				j.err = j.flushLocked(context.Background())
			}
			j.mu.Unlock()
		}
	}
}

func (j *journal) flushLocked(ctx context.Context) error {
	if j.buf.Len() == 0 {
		return nil
	}
	n, err := j.w.WriteAt(ctx, j.buf.Bytes(), j.off)
	j.off += int64(n)
	j.buf.Reset()
	if err != nil {
		return fmt.Errorf("journal %s: %w", j.name, err)
	}
	if err := j.w.Sync(ctx); err != nil {
		return fmt.Errorf("journal %s: %w", j.name, err)
	}
	return nil
}

func (j *journal) chunk(rel string, k fileKey, off int64) {
	j.mu.Lock()
	fmt.Fprintf(&j.buf, "c %d %d %d %q\n", k.Size, k.Mtime, off, rel)
	j.mu.Unlock()
}

func (j *journal) fileDone(rel string, k fileKey, sum string) {
	if sum == "" {
		sum = "-"
	}
	j.mu.Lock()
	fmt.Fprintf(&j.buf, "f %d %d %s %q\n", k.Size, k.Mtime, sum, rel)
	j.mu.Unlock()
}

// Close flushes the journal; with remove, it then deletes it (the copy
// is complete and there is nothing to resume).
func (j *journal) Close(ctx context.Context, remove bool) error {
	close(j.stop)
	j.wg.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.err
	if err == nil && !remove {
		err = j.flushLocked(ctx)
	}
	if cerr := j.w.Close(); err == nil {
		err = cerr
	}
	if remove && err == nil {
		err = j.fsys.Remove(ctx, j.name)
	}
	return err
}
