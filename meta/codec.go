package meta

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Key prefixes. See the package documentation for the layout.
const (
	pInode   = 'A'
	pDentry  = 'D'
	pSeq     = 'S'
	pSymlink = 'L'
	pCounter = 'K'
	pConfig  = 'C'
	pClient  = 'c'
)

var (
	keyNextIno = []byte{pCounter, 'i'}
	keyFiles   = []byte{pCounter, 'f'}
)

var be = binary.BigEndian

func inodeKey(ino Ino) []byte {
	k := make([]byte, 9)
	k[0] = pInode
	be.PutUint64(k[1:], uint64(ino))
	return k
}

func symlinkKey(ino Ino) []byte {
	k := inodeKey(ino)
	k[0] = pSymlink
	return k
}

func dentryPrefix(parent Ino) []byte {
	k := make([]byte, 9, 9+MaxNameLen)
	k[0] = pDentry
	be.PutUint64(k[1:], uint64(parent))
	return k
}

func dentryKey(parent Ino, name string) []byte {
	return append(dentryPrefix(parent), name...)
}

func seqPrefix(dir Ino) []byte {
	k := make([]byte, 9, 17)
	k[0] = pSeq
	be.PutUint64(k[1:], uint64(dir))
	return k
}

func seqKey(dir Ino, seq uint64) []byte {
	return be.AppendUint64(seqPrefix(dir), seq)
}

// inode is the stored form of an inode: the public attributes plus the
// directory's next readdir sequence number.
type inode struct {
	Attr
	nextSeq uint64
}

const (
	inodeV1    = 1
	inodeV1Len = 1 + 1 + 4*7 + 8 + 4*12 + 8 + 8 + 8 + 8
)

func putTime(b []byte, t time.Time) []byte {
	b = be.AppendUint64(b, uint64(t.Unix()))
	return be.AppendUint32(b, uint32(t.Nanosecond()))
}

func getTime(b []byte) time.Time {
	return time.Unix(int64(be.Uint64(b)), int64(be.Uint32(b[8:])))
}

// encode lays the inode out as fixed-width big-endian fields after a
// version byte. Decoders accept longer records so later versions can append
// fields.
func (n *inode) encode() []byte {
	b := make([]byte, 0, inodeV1Len)
	b = append(b, inodeV1, byte(n.Type))
	b = be.AppendUint32(b, n.Mode)
	b = be.AppendUint32(b, n.Nlink)
	b = be.AppendUint32(b, n.UID)
	b = be.AppendUint32(b, n.GID)
	b = be.AppendUint32(b, n.RdevMajor)
	b = be.AppendUint32(b, n.RdevMinor)
	b = be.AppendUint32(b, 0) // reserved flags
	b = be.AppendUint64(b, n.Size)
	b = putTime(b, n.Atime)
	b = putTime(b, n.Mtime)
	b = putTime(b, n.Ctime)
	b = putTime(b, n.Btime)
	b = be.AppendUint64(b, n.Change)
	b = be.AppendUint64(b, uint64(n.Parent))
	b = append(b, n.Verifier[:]...)
	b = be.AppendUint64(b, n.nextSeq)
	return b
}

func decodeInode(b []byte) (*inode, error) {
	if len(b) < 1 || b[0] != inodeV1 || len(b) < inodeV1Len {
		return nil, fmt.Errorf("meta: corrupt inode record (len %d)", len(b))
	}
	n := &inode{}
	n.Type = FileType(b[1])
	p := b[2:]
	n.Mode = be.Uint32(p[0:])
	n.Nlink = be.Uint32(p[4:])
	n.UID = be.Uint32(p[8:])
	n.GID = be.Uint32(p[12:])
	n.RdevMajor = be.Uint32(p[16:])
	n.RdevMinor = be.Uint32(p[20:])
	p = p[28:]
	n.Size = be.Uint64(p)
	p = p[8:]
	n.Atime = getTime(p)
	n.Mtime = getTime(p[12:])
	n.Ctime = getTime(p[24:])
	n.Btime = getTime(p[36:])
	p = p[48:]
	n.Change = be.Uint64(p)
	n.Parent = Ino(be.Uint64(p[8:]))
	copy(n.Verifier[:], p[16:24])
	n.nextSeq = be.Uint64(p[24:])
	return n, nil
}

// dentry is the stored form of a directory entry.
type dentry struct {
	ino Ino
	typ FileType
	seq uint64
}

const dentryV1Len = 1 + 8 + 1 + 8

func (d dentry) encode() []byte {
	b := make([]byte, 0, dentryV1Len)
	b = append(b, 1)
	b = be.AppendUint64(b, uint64(d.ino))
	b = append(b, byte(d.typ))
	return be.AppendUint64(b, d.seq)
}

func decodeDentry(b []byte) (dentry, error) {
	if len(b) < dentryV1Len || b[0] != 1 {
		return dentry{}, fmt.Errorf("meta: corrupt dentry record (len %d)", len(b))
	}
	return dentry{ino: Ino(be.Uint64(b[1:])), typ: FileType(b[9]), seq: be.Uint64(b[10:])}, nil
}
