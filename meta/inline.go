package meta

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
)

// Inline data: the bytes of a small regular file kept in the engine, next
// to its inode, instead of in objects on data servers. A file of a few
// KiB then costs one transaction to write (data, size and mtime
// together) and nothing on any data server to create, sync or remove.
//
// A file's data is inline exactly when it has an inline record; bytes
// past the record's data, up to the file's size, are zeros. The rules
// that keep one place authoritative:
//
//   - WriteInline only writes a file that has no stripe map, and only
//     while its data fits the caller's bound; otherwise it fails with
//     ErrNotInline and changes nothing. Once a map is placed the file
//     never becomes inline again.
//   - A file may have both a record and a map after its data was being
//     moved out (the caller places the map, copies the bytes, then calls
//     DropInline) and the server stopped in between: the record still
//     wins, and the move is redone from the start.
//   - The record goes with the inode (FreeOrphan).
//
// Record format: CRC-32C (Castagnoli) of the data, big-endian, then the
// data. Reads verify it and fail with ErrCorrupt rather than return
// bytes the engine cannot vouch for.
const pInline = 'B'

func inlineKey(ino Ino) []byte { return be.AppendUint64([]byte{pInline}, uint64(ino)) }

var inlineCRC = crc32.MakeTable(crc32.Castagnoli)

// ErrNotInline is returned by WriteInline when the write cannot be kept
// inline: the file has a stripe map, or its data would grow past the
// bound.
var ErrNotInline = errors.New("meta: file data is not inline")

// ErrCorrupt is returned (wrapped) when a stored record fails its
// checksum (NFS4ERR_IO).
var ErrCorrupt = errors.New("meta: checksum mismatch")

func encodeInline(data []byte) []byte {
	v := make([]byte, 4, 4+len(data))
	binary.BigEndian.PutUint32(v, crc32.Checksum(data, inlineCRC))
	return append(v, data...)
}

func decodeInline(ino Ino, v []byte) ([]byte, error) {
	if len(v) < 4 || binary.BigEndian.Uint32(v) != crc32.Checksum(v[4:], inlineCRC) {
		return nil, fmt.Errorf("inline data of inode %d: %w", ino, ErrCorrupt)
	}
	return v[4:], nil
}

// inline reads ino's inline data in x (a copy the caller owns).
func (x *tx) inline(ino Ino) ([]byte, bool, error) {
	v, err := x.t.Get(inlineKey(ino))
	if err != nil || v == nil {
		return nil, false, err
	}
	d, err := decodeInline(ino, v)
	if err != nil {
		return nil, false, err
	}
	return append([]byte(nil), d...), true, nil
}

func (e *kvEngine) InlineData(ctx context.Context, ino Ino) ([]byte, bool, error) {
	var (
		data []byte
		ok   bool
	)
	err := e.view(ctx, func(x *tx) (err error) {
		if err := x.regular(ino); err != nil {
			return err
		}
		data, ok, err = x.inline(ino)
		return err
	})
	return data, ok, err
}

func (e *kvEngine) WriteInline(ctx context.Context, ino Ino, off uint64, p []byte, limit int, now time.Time) (Attr, error) {
	now = nowOr(now)
	end := off + uint64(len(p))
	if end < off || end > uint64(max(limit, 0)) {
		return Attr{}, ErrNotInline
	}
	var a Attr
	err := e.update(ctx, func(x *tx) error {
		n, err := x.writeTarget(ino)
		if err != nil {
			return err
		}
		if _, placed, err := x.stripeMap(ino); err != nil || placed {
			if err == nil {
				err = ErrNotInline
			}
			return err
		}
		data, _, err := x.inline(ino)
		if err != nil {
			return err
		}
		// Bytes between the data and the size are zeros; a write past
		// the size leaves zeros before it too.
		if uint64(len(data)) < end {
			data = append(data, make([]byte, end-uint64(len(data)))...)
		}
		copy(data[off:], p)
		if err := x.t.Put(inlineKey(ino), encodeInline(data)); err != nil {
			return err
		}
		a = x.wrote(ino, n, end, now)
		return nil
	})
	return a, err
}

func (e *kvEngine) TruncateInline(ctx context.Context, ino Ino, size uint64) error {
	return e.update(ctx, func(x *tx) error {
		data, ok, err := x.inline(ino)
		if err != nil || !ok || uint64(len(data)) <= size {
			return err
		}
		return x.t.Put(inlineKey(ino), encodeInline(data[:size]))
	})
}

func (e *kvEngine) DropInline(ctx context.Context, ino Ino) error {
	return e.update(ctx, func(x *tx) error {
		if err := x.regular(ino); err != nil {
			return err
		}
		data, ok, err := x.inline(ino)
		if err != nil || !ok {
			return err
		}
		if _, placed, err := x.stripeMap(ino); err != nil || (!placed && len(data) > 0) {
			if err == nil {
				// Without a map the bytes would have nowhere to be.
				err = fmt.Errorf("drop inline data of %d: no stripe map: %w", ino, ErrInval)
			}
			return err
		}
		return x.t.Delete(inlineKey(ino))
	})
}
