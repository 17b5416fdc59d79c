package fusemount

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shoalfs/shoal/client"
)

// dirHandle is an open directory. Its listing is read from the server
// once, at the first READDIR(PLUS), with every entry's attributes and
// file handle (client.ReadDirHandle), so that the kernel's READDIRPLUS
// (ls -l, find -ls, rm -r) costs the READDIRs alone: go-fuse asks the
// handle's Lookup for each entry, and Lookup answers from the listing
// instead of sending a LOOKUP per name.
type dirHandle struct {
	n *node

	mu   sync.Mutex
	ents []client.DirEntry // nil until read
	read bool
	pos  int // index of the next entry
}

var (
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.FileReaddirenter   = (*dirHandle)(nil)
	_ fs.FileLookuper       = (*dirHandle)(nil)
	_ fs.FileSeekdirer      = (*dirHandle)(nil)
	_ fs.FileReleasedirer   = (*dirHandle)(nil)
)

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{n: n}, 0, 0
}

// list reads the listing if it has not been read yet.
func (d *dirHandle) list(ctx context.Context) syscall.Errno {
	if d.read {
		return 0
	}
	c, errno := d.n.fsys.client(ctx)
	if errno != 0 {
		return errno
	}
	ec := d.n.fsys.entries
	gen, at := ec.mark(), time.Now()
	var ents []client.DirEntry
	if errno := d.n.withFH(ctx, c, func(fh []byte) (err error) {
		ents, err = c.ReadDirHandle(ctx, fh)
		return err
	}); errno != 0 {
		return errno
	}
	d.ents, d.read = ents, true
	ec.listed(d.n.StableAttr().Ino, ents, at, gen)
	return 0
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if errno := d.list(ctx); errno != 0 {
		return nil, errno
	}
	if d.pos >= len(d.ents) {
		return nil, 0
	}
	e := &d.ents[d.pos]
	d.pos++
	return &fuse.DirEntry{Name: e.Name, Ino: e.Attr.Fileid, Mode: typeBits(e.Attr.Type), Off: uint64(d.pos)}, 0
}

// Seekdir positions the stream at off, the Off of the entry before
// (0: the start). Offsets index the listing read at the first READDIR.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off == 0 {
		// rewinddir(3): the next READDIR reads the directory again.
		d.ents, d.read, d.pos = nil, false, 0
		return 0
	}
	if errno := d.list(ctx); errno != 0 {
		return errno
	}
	d.pos = min(int(off), len(d.ents))
	return 0
}

// Lookup gives READDIRPLUS the entry last returned by Readdirent, from
// the listing when the server sent its handle along, else with a LOOKUP.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	d.mu.Lock()
	var e *client.DirEntry
	if i := d.pos - 1; i >= 0 && i < len(d.ents) && d.ents[i].Name == name {
		e = &d.ents[i]
	}
	d.mu.Unlock()
	if e == nil || e.Handle == nil {
		return d.n.Lookup(ctx, name, out)
	}
	return d.n.child(ctx, e.Handle, &e.Attr, out), 0
}

func (d *dirHandle) Releasedir(ctx context.Context, releaseFlags uint32) {}
