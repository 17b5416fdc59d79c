package meta

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The write-ahead log's on-disk format. A log file starts with a header,
// then holds records back to back, each padded to a multiple of 8 bytes,
// and then zeros up to its preallocated size:
//
//	header: magic "shoalWAL"(8) version(4) crc(4) generation(8)
//	record: len(4) crc(4) seq(8) payload(len) zero padding to 8
//	payload: 'M'(1) uvarint(durable) then
//	         op('P' or 'D')(1) uvarint(len(key)) key [uvarint(len(val)) val] ...
//
// All integers are little-endian. The header's crc is CRC32C of its
// version and generation; a record's crc is CRC32C of its len, seq and
// payload, so a torn or misread length cannot pass for a record. Sequence
// numbers rise by one per record, across files too; a payload holds at
// least one operation, so an all-zero header marks the end of the log.
//
// Since version 2 a payload starts with a mark: the sequence number of
// the last record known durable when this one was written. Records are
// written before they are synced, several at a time, so after a machine
// crash a later record may have reached the disk while an earlier one did
// not; the mark tells such a torn tail (the later record was written
// before the missing one was durable) from a durable record damaged since
// (the later record's mark covers it). Version 1 files, which have no
// marks, are still read, with the stricter rule.
const (
	walMagic      = "shoalWAL"
	walVersion    = 2
	walVersion1   = 1
	walHeaderLen  = 24
	walRecHdrLen  = 16
	walMaxPayload = 1 << 30 // a round is at most MaxBatch transactions of a few hundred KiB
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errWALTorn reports a record that does not decode: a crash during its
// append, or corruption; the reader decides which from what follows.
var errWALTorn = errors.New("meta: torn or corrupt WAL record")

// walOp is one write of a round: a put, or a delete when del is set.
type walOp struct {
	key, val []byte
	del      bool
}

// walRecord is one decoded record: the writes of one commit round.
type walRecord struct {
	seq uint64
	// mark (if hasMark) is the last sequence number known durable when
	// the record was written.
	mark    uint64
	hasMark bool
	ops     []walOp
}

func walPad(n int) int { return (n + 7) &^ 7 }

// appendWALRecord appends the encoding of a record with ops to b; mark
// is the last sequence number known durable.
func appendWALRecord(b []byte, seq, mark uint64, ops []walOp) []byte {
	return encodeWALRecord(b, seq, mark, true, ops)
}

// encodeWALRecord is appendWALRecord that can leave out the mark, as
// version 1 did.
func encodeWALRecord(b []byte, seq, mark uint64, hasMark bool, ops []walOp) []byte {
	start := len(b)
	b = append(b, make([]byte, walRecHdrLen)...)
	if hasMark {
		b = append(b, 'M')
		b = binary.AppendUvarint(b, mark)
	}
	for _, op := range ops {
		if op.del {
			b = append(b, 'D')
			b = binary.AppendUvarint(b, uint64(len(op.key)))
			b = append(b, op.key...)
			continue
		}
		b = append(b, 'P')
		b = binary.AppendUvarint(b, uint64(len(op.key)))
		b = append(b, op.key...)
		b = binary.AppendUvarint(b, uint64(len(op.val)))
		b = append(b, op.val...)
	}
	plen := len(b) - start - walRecHdrLen
	h := b[start:]
	binary.LittleEndian.PutUint32(h[0:], uint32(plen))
	binary.LittleEndian.PutUint64(h[8:], seq)
	binary.LittleEndian.PutUint32(h[4:], walRecordCRC(h[:walRecHdrLen], h[walRecHdrLen:]))
	return append(b, make([]byte, walPad(len(b)-start)-(len(b)-start))...)
}

func walRecordCRC(hdr, payload []byte) uint32 {
	c := crc32.Update(0, castagnoli, hdr[0:4])
	c = crc32.Update(c, castagnoli, hdr[8:16])
	return crc32.Update(c, castagnoli, payload)
}

// decodeWALRecord decodes the record at the start of b and returns it
// with its padded length. It returns io.EOF at an all-zero header (the
// end of the log) and errWALTorn for anything that is not a whole,
// checksummed, well-formed record. Keys and values alias b.
func decodeWALRecord(b []byte) (walRecord, int, error) {
	if len(b) < walRecHdrLen {
		if allZero(b) {
			return walRecord{}, 0, io.EOF
		}
		return walRecord{}, 0, errWALTorn
	}
	h := b[:walRecHdrLen]
	if allZero(h) {
		return walRecord{}, 0, io.EOF
	}
	plen := uint64(binary.LittleEndian.Uint32(h[0:]))
	if plen == 0 || plen > walMaxPayload || plen > uint64(len(b)-walRecHdrLen) {
		return walRecord{}, 0, errWALTorn
	}
	payload := b[walRecHdrLen : walRecHdrLen+int(plen)]
	if walRecordCRC(h, payload) != binary.LittleEndian.Uint32(h[4:]) {
		return walRecord{}, 0, errWALTorn
	}
	rec := walRecord{seq: binary.LittleEndian.Uint64(h[8:])}
	if payload[0] == 'M' {
		m, w := binary.Uvarint(payload[1:])
		if w <= 0 {
			return walRecord{}, 0, fmt.Errorf("%w: bad mark", errWALTorn)
		}
		rec.mark, rec.hasMark = m, true
		payload = payload[1+w:]
	}
	ops, err := decodeWALPayload(payload)
	if err != nil {
		return walRecord{}, 0, err
	}
	rec.ops = ops
	n := min(walPad(walRecHdrLen+int(plen)), len(b))
	return rec, n, nil
}

func decodeWALPayload(p []byte) ([]walOp, error) {
	var ops []walOp
	field := func() ([]byte, bool) {
		n, w := binary.Uvarint(p)
		if w <= 0 || n > uint64(len(p)-w) {
			return nil, false
		}
		f := p[w : w+int(n) : w+int(n)]
		p = p[w+int(n):]
		return f, true
	}
	for len(p) > 0 {
		op := p[0]
		p = p[1:]
		if op != 'P' && op != 'D' {
			return nil, fmt.Errorf("%w: op %#x", errWALTorn, op)
		}
		k, ok := field()
		if !ok {
			return nil, fmt.Errorf("%w: short key", errWALTorn)
		}
		o := walOp{key: k, del: op == 'D'}
		if !o.del {
			if o.val, ok = field(); !ok {
				return nil, fmt.Errorf("%w: short value", errWALTorn)
			}
		}
		ops = append(ops, o)
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("%w: empty record", errWALTorn)
	}
	return ops, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func encodeWALHeader(gen uint64) []byte {
	h := make([]byte, walHeaderLen)
	copy(h, walMagic)
	binary.LittleEndian.PutUint32(h[8:], walVersion)
	binary.LittleEndian.PutUint64(h[16:], gen)
	binary.LittleEndian.PutUint32(h[12:], walHeaderCRC(h))
	return h
}

func walHeaderCRC(h []byte) uint32 {
	c := crc32.Update(0, castagnoli, h[8:12])
	return crc32.Update(c, castagnoli, h[16:24])
}

// walLog is the content of the log files found at open, in order.
type walLog struct {
	records []walRecord
	lastSeq uint64 // of the last record, or 0
	lastGen uint64 // of the last file, or 0
}

// parseWALFile decodes the records of one log file. It stops at the end of
// the log or at a record that does not decode; that is a torn tail (torn
// is set) only if no valid record with a later sequence number follows
// anywhere in the rest of the file, and an error otherwise: a damaged
// record in the middle of the log means acknowledged changes are lost,
// which recovery must not paper over.
func parseWALFile(data []byte, gen uint64) (recs []walRecord, torn bool, err error) {
	if len(data) < walHeaderLen || string(data[:8]) != walMagic ||
		binary.LittleEndian.Uint32(data[12:]) != walHeaderCRC(data) {
		return nil, false, fmt.Errorf("bad header")
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != walVersion && v != walVersion1 {
		return nil, false, fmt.Errorf("version %d, want %d or %d", v, walVersion1, walVersion)
	}
	if g := binary.LittleEndian.Uint64(data[16:]); g != gen {
		return nil, false, fmt.Errorf("header names generation %d", g)
	}
	off := walHeaderLen
	var last uint64
	for off < len(data) {
		rec, n, err := decodeWALRecord(data[off:])
		if err == io.EOF {
			break
		}
		if err != nil {
			torn = true
			break
		}
		if last != 0 && rec.seq != last+1 {
			return nil, false, fmt.Errorf("record at offset %d has sequence %d after %d", off, rec.seq, last)
		}
		recs = append(recs, rec)
		last = rec.seq
		off += n
	}
	// Whatever stopped the reading, nothing valid may follow it, unless
	// it was written before the record missing at off was durable: then
	// the missing record and everything after it were never synced, and
	// a machine crash let some later pages reach the disk but not that
	// one. The first record of a file is synced before any other is
	// written (walKV.commitRound), so last is known here when that
	// applies.
	for o := walPad(off + 1); o+walRecHdrLen <= len(data); o += 8 {
		if binary.LittleEndian.Uint64(data[o+8:]) <= last {
			continue
		}
		rec, _, err := decodeWALRecord(data[o:])
		if err != nil {
			continue
		}
		if last != 0 && rec.hasMark && rec.mark <= last {
			torn = true
			continue
		}
		return nil, false, fmt.Errorf("damaged record at offset %d followed by valid record %d at offset %d", off, rec.seq, o)
	}
	return recs, torn, nil
}

// walFileName is the name of log file gen of the database at dbPath.
func walFileName(dbPath string, gen uint64) string {
	return fmt.Sprintf("%s-wal-%016x", dbPath, gen)
}

// listWALFiles returns the generations of dbPath's log files in ascending
// order, and removes a log file or a spare (wal_spare.go) left half-created
// by a crash.
func listWALFiles(dbPath string) ([]uint64, error) {
	dir, base := filepath.Split(dbPath)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var gens []uint64
	for _, e := range ents {
		name := e.Name()
		if name == base+"-wal.tmp" || name == base+"-wal.spare.tmp" {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, err
			}
			continue
		}
		hex, ok := strings.CutPrefix(name, base+"-wal-")
		if !ok || len(hex) != 16 {
			continue
		}
		g, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		gens = append(gens, g)
	}
	slices.Sort(gens)
	return gens, nil
}

// readWAL reads all log files of dbPath, checking that their records form
// one unbroken sequence.
func readWAL(dbPath string, gens []uint64) (walLog, error) {
	var l walLog
	tornIn := uint64(0)
	for _, g := range gens {
		name := walFileName(dbPath, g)
		data, err := os.ReadFile(name)
		if err != nil {
			return walLog{}, fmt.Errorf("meta: read WAL: %w", err)
		}
		recs, torn, err := parseWALFile(data, g)
		if err != nil {
			return walLog{}, fmt.Errorf("meta: WAL %s: %w", name, err)
		}
		if len(recs) > 0 {
			if tornIn != 0 {
				return walLog{}, fmt.Errorf("meta: WAL %s has records after the damaged tail of generation %d", name, tornIn)
			}
			if l.lastSeq != 0 && recs[0].seq != l.lastSeq+1 {
				return walLog{}, fmt.Errorf("meta: WAL %s starts at sequence %d after %d", name, recs[0].seq, l.lastSeq)
			}
			l.lastSeq = recs[len(recs)-1].seq
		}
		if torn {
			tornIn = g
		}
		l.records = append(l.records, recs...)
		l.lastGen = g
	}
	return l, nil
}

// walFile is the log file being appended to.
type walFile struct {
	f       *os.File
	gen     uint64
	off     int64 // where the next record goes
	records int   // appended so far
	sync    bool
	buf     []byte
}

// createWALFile makes log file gen durable before it is used: written
// under a temporary name, given its size up front so that appends do not
// change it (prewrite: written full of zeros, so that an fdatasync of a
// record overwrites and writes only the data, see wal_spare.go; else
// fallocate'd, which spares the writing but makes the first sync of
// each extent a journal commit), synced, renamed, and the directory
// synced, so a log file under its real name is always whole.
func createWALFile(dbPath string, gen uint64, prealloc int64, sync, prewrite bool) (*walFile, error) {
	tmp := dbPath + "-wal.tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("meta: create WAL: %w", err)
	}
	fail := func(err error) (*walFile, error) {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("meta: create WAL %s: %w", tmp, err)
	}
	if _, err := f.Write(encodeWALHeader(gen)); err != nil {
		return fail(err)
	}
	if prewrite {
		if err := writeZeros(f, walHeaderLen, prealloc, nil); err != nil {
			return fail(err)
		}
	} else if prealloc > walHeaderLen {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, prealloc); err != nil {
			// Not every file system preallocates; appends then
			// also write the file size, which is slower but safe.
			if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
				return fail(err)
			}
		}
	}
	if sync {
		if err := f.Sync(); err != nil {
			return fail(err)
		}
	}
	return publishWALFile(f, tmp, dbPath, gen, sync, fail)
}

// publishWALFile ends the making of log file gen from the whole, synced
// file f under the name from: renamed to its real name and the directory
// synced, so that a log file under its real name is always whole. A
// failed rename goes to fail.
func publishWALFile(f *os.File, from, dbPath string, gen uint64, sync bool, fail func(error) (*walFile, error)) (*walFile, error) {
	if err := os.Rename(from, walFileName(dbPath, gen)); err != nil {
		return fail(err)
	}
	if sync {
		if err := syncDir(dbPath); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &walFile{f: f, gen: gen, off: walHeaderLen, sync: sync}, nil
}

// append writes one record (one write(2); sync makes it durable). Only
// the commit loop calls it.
func (w *walFile) append(seq, mark uint64, ops []walOp) error {
	w.buf = appendWALRecord(w.buf[:0], seq, mark, ops)
	if _, err := w.f.WriteAt(w.buf, w.off); err != nil {
		return fmt.Errorf("meta: WAL append: %w", err)
	}
	w.off += int64(len(w.buf))
	w.records++
	if cap(w.buf) > 1<<20 {
		w.buf = nil // do not pin a large round's buffer
	}
	return nil
}

// datasync makes every record appended so far durable: one fdatasync. It may
// run while append writes the next record; that one may or may not be
// covered.
func (w *walFile) datasync() error {
	if !w.sync || skipWALSync {
		return nil
	}
	if err := unix.Fdatasync(int(w.f.Fd())); err != nil {
		return fmt.Errorf("meta: WAL fdatasync: %w", err)
	}
	return nil
}

func syncDir(dbPath string) error {
	d, err := os.Open(filepath.Dir(dbPath))
	if err != nil {
		return fmt.Errorf("meta: sync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("meta: sync dir %s: %w", d.Name(), err)
	}
	return nil
}

// removeWALFiles removes log files gens (oldest first, so a crash leaves
// a suffix of the log) and syncs the directory.
func removeWALFiles(dbPath string, gens []uint64, sync bool) error {
	for _, g := range gens {
		if err := os.Remove(walFileName(dbPath, g)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("meta: remove WAL: %w", err)
		}
	}
	if sync && len(gens) > 0 {
		return syncDir(dbPath)
	}
	return nil
}
