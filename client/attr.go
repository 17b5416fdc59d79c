package client

import (
	"fmt"
	"io/fs"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

// FileType is the type of a file system object.
type FileType uint32

// File types, numbered as nfs_ftype4.
const (
	TypeRegular   FileType = FileType(nfs4.NF4REG)
	TypeDir       FileType = FileType(nfs4.NF4DIR)
	TypeBlock     FileType = FileType(nfs4.NF4BLK)
	TypeChar      FileType = FileType(nfs4.NF4CHR)
	TypeSymlink   FileType = FileType(nfs4.NF4LNK)
	TypeSocket    FileType = FileType(nfs4.NF4SOCK)
	TypeFIFO      FileType = FileType(nfs4.NF4FIFO)
	TypeAttrDir   FileType = FileType(nfs4.NF4ATTRDIR)
	TypeNamedAttr FileType = FileType(nfs4.NF4NAMEDATTR)
)

func (t FileType) String() string {
	switch t {
	case TypeRegular:
		return "file"
	case TypeDir:
		return "directory"
	case TypeBlock:
		return "block device"
	case TypeChar:
		return "character device"
	case TypeSymlink:
		return "symlink"
	case TypeSocket:
		return "socket"
	case TypeFIFO:
		return "fifo"
	case TypeAttrDir:
		return "attribute directory"
	case TypeNamedAttr:
		return "named attribute"
	}
	return "FileType(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// Attr holds the attributes of a file as the server reported them. Fields
// the server does not support are left zero.
type Attr struct {
	Type      FileType
	Mode      uint32 // permission bits and setuid/setgid/sticky (07777)
	Nlink     uint32
	UID, GID  uint32 // parsed from numeric owner strings; 65534 if not numeric
	Size      uint64
	Used      uint64 // bytes of storage used
	Fileid    uint64
	Change    uint64 // change attribute: differs whenever the file changed
	Atime     time.Time
	Mtime     time.Time
	Ctime     time.Time
	RdevMajor uint32
	RdevMinor uint32
}

// FileMode returns the attributes as an fs.FileMode (type and permissions).
func (a *Attr) FileMode() fs.FileMode {
	m := fs.FileMode(a.Mode & 0o777)
	if a.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if a.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if a.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch a.Type {
	case TypeDir, TypeAttrDir:
		m |= fs.ModeDir
	case TypeSymlink:
		m |= fs.ModeSymlink
	case TypeBlock:
		m |= fs.ModeDevice
	case TypeChar:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case TypeSocket:
		m |= fs.ModeSocket
	case TypeFIFO:
		m |= fs.ModeNamedPipe
	}
	return m
}

// IsDir reports whether the object is a directory.
func (a *Attr) IsDir() bool { return a.Type == TypeDir }

// nobody is the id used for owners that are not numeric strings.
const nobody = 65534

// attrBits builds a bitmap4 from attribute numbers.
func attrBits(nums ...int) nfs4.Bitmap4 {
	var bm nfs4.Bitmap4
	for _, n := range nums {
		w := n / 32
		for len(bm) <= w {
			bm = append(bm, 0)
		}
		bm[w] |= 1 << (n % 32)
	}
	return bm
}

// statBits are the attributes every Attr is built from.
var statBits = attrBits(
	nfs4.FATTR4_TYPE, nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE, nfs4.FATTR4_FILEID,
	nfs4.FATTR4_MODE, nfs4.FATTR4_NUMLINKS, nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP,
	nfs4.FATTR4_RAWDEV, nfs4.FATTR4_SPACE_USED, nfs4.FATTR4_TIME_ACCESS,
	nfs4.FATTR4_TIME_METADATA, nfs4.FATTR4_TIME_MODIFY,
)

// fsInfo holds the file system attributes read once at Dial.
type fsInfo struct {
	maxRead, maxWrite uint64
	lease             uint32
	layoutTypes       []uint32 // fs_layout_types: the pNFS layouts offered
	layoutBlksize     uint32   // layout_blksize: the server's preferred I/O size
	stat              FSStat   // space_* and files_*, for Client.Statfs
	fh                []byte   // filehandle, for READDIR entries
}

// FSStat holds the space and file counts of a file system, as statfs(2)
// reports them, from the space_total/free/avail and files_total/free/avail
// attributes. Counts the server does not support are zero.
type FSStat struct {
	Total, Free, Avail           uint64 // bytes; Avail is what the caller may use
	Files, FilesFree, FilesAvail uint64 // file slots (inodes)
}

var fsStatBits = attrBits(nfs4.FATTR4_FILES_AVAIL, nfs4.FATTR4_FILES_FREE, nfs4.FATTR4_FILES_TOTAL,
	nfs4.FATTR4_SPACE_AVAIL, nfs4.FATTR4_SPACE_FREE, nfs4.FATTR4_SPACE_TOTAL)

var fsInfoBits = attrBits(nfs4.FATTR4_LEASE_TIME, nfs4.FATTR4_MAXREAD, nfs4.FATTR4_MAXWRITE,
	nfs4.FATTR4_FS_LAYOUT_TYPES, nfs4.FATTR4_LAYOUT_BLKSIZE)

// changeBits asks for the change attribute alone.
var changeBits = attrBits(nfs4.FATTR4_CHANGE)

// decodeFattr walks the attributes present in f in bit order, which is how
// fattr4 lays them out, and stores those it knows into a and fi (either may
// be nil). An attribute it cannot decode stops the walk with an error,
// because the position of everything after it would be unknown.
func decodeFattr(f *nfs4.Fattr4, a *Attr, fi *fsInfo) error {
	if a == nil {
		a = new(Attr)
	}
	if fi == nil {
		fi = new(fsInfo)
	}
	d := xdr.NewDecoder(f.AttrVals)
	for w, word := range f.Attrmask {
		for word != 0 {
			b := bits.TrailingZeros32(word)
			word &^= 1 << b
			n := w*32 + b
			switch n {
			case nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_SUPPATTR_EXCLCREAT:
				cnt := d.ArrayLen(64, 4)
				for range cnt {
					d.Uint32()
				}
			case nfs4.FATTR4_TYPE:
				a.Type = FileType(d.Uint32())
			case nfs4.FATTR4_FH_EXPIRE_TYPE, nfs4.FATTR4_RDATTR_ERROR, nfs4.FATTR4_ACLSUPPORT,
				nfs4.FATTR4_MAXLINK, nfs4.FATTR4_MAXNAME,
				nfs4.FATTR4_LAYOUT_ALIGNMENT, nfs4.FATTR4_CLONE_BLKSIZE:
				d.Uint32()
			case nfs4.FATTR4_LAYOUT_BLKSIZE:
				fi.layoutBlksize = d.Uint32()
			case nfs4.FATTR4_CHANGE:
				a.Change = d.Uint64()
			case nfs4.FATTR4_SIZE:
				a.Size = d.Uint64()
			case nfs4.FATTR4_LINK_SUPPORT, nfs4.FATTR4_SYMLINK_SUPPORT, nfs4.FATTR4_NAMED_ATTR,
				nfs4.FATTR4_UNIQUE_HANDLES, nfs4.FATTR4_ARCHIVE, nfs4.FATTR4_CANSETTIME,
				nfs4.FATTR4_CASE_INSENSITIVE, nfs4.FATTR4_CASE_PRESERVING,
				nfs4.FATTR4_CHOWN_RESTRICTED, nfs4.FATTR4_HIDDEN, nfs4.FATTR4_HOMOGENEOUS,
				nfs4.FATTR4_NO_TRUNC, nfs4.FATTR4_SYSTEM, nfs4.FATTR4_XATTR_SUPPORT:
				d.Bool()
			case nfs4.FATTR4_FSID:
				d.Uint64()
				d.Uint64()
			case nfs4.FATTR4_LEASE_TIME:
				fi.lease = d.Uint32()
			case nfs4.FATTR4_FILEHANDLE:
				fi.fh = append([]byte(nil), d.Opaque(nfs4.NFS4_FHSIZE)...)
			case nfs4.FATTR4_FILEID:
				a.Fileid = d.Uint64()
			case nfs4.FATTR4_FILES_AVAIL:
				fi.stat.FilesAvail = d.Uint64()
			case nfs4.FATTR4_FILES_FREE:
				fi.stat.FilesFree = d.Uint64()
			case nfs4.FATTR4_FILES_TOTAL:
				fi.stat.Files = d.Uint64()
			case nfs4.FATTR4_SPACE_AVAIL:
				fi.stat.Avail = d.Uint64()
			case nfs4.FATTR4_SPACE_FREE:
				fi.stat.Free = d.Uint64()
			case nfs4.FATTR4_SPACE_TOTAL:
				fi.stat.Total = d.Uint64()
			case nfs4.FATTR4_MAXFILESIZE, nfs4.FATTR4_QUOTA_AVAIL_HARD, nfs4.FATTR4_QUOTA_AVAIL_SOFT,
				nfs4.FATTR4_QUOTA_USED, nfs4.FATTR4_MOUNTED_ON_FILEID, nfs4.FATTR4_SPACE_FREED:
				d.Uint64()
			case nfs4.FATTR4_MAXREAD:
				fi.maxRead = d.Uint64()
			case nfs4.FATTR4_MAXWRITE:
				fi.maxWrite = d.Uint64()
			case nfs4.FATTR4_MODE:
				a.Mode = d.Uint32() & 0o7777
			case nfs4.FATTR4_NUMLINKS:
				a.Nlink = d.Uint32()
			case nfs4.FATTR4_OWNER:
				a.UID = parseOwner(d.String(nfs4.NFS4_OPAQUE_LIMIT))
			case nfs4.FATTR4_OWNER_GROUP:
				a.GID = parseOwner(d.String(nfs4.NFS4_OPAQUE_LIMIT))
			case nfs4.FATTR4_RAWDEV:
				a.RdevMajor = d.Uint32()
				a.RdevMinor = d.Uint32()
			case nfs4.FATTR4_SPACE_USED:
				a.Used = d.Uint64()
			case nfs4.FATTR4_TIME_ACCESS:
				a.Atime = decodeTime(d)
			case nfs4.FATTR4_TIME_METADATA:
				a.Ctime = decodeTime(d)
			case nfs4.FATTR4_TIME_MODIFY:
				a.Mtime = decodeTime(d)
			case nfs4.FATTR4_TIME_BACKUP, nfs4.FATTR4_TIME_CREATE, nfs4.FATTR4_TIME_DELTA:
				decodeTime(d)
			case nfs4.FATTR4_FS_LAYOUT_TYPES, nfs4.FATTR4_LAYOUT_TYPES:
				cnt := d.ArrayLen(64, 4)
				fi.layoutTypes = fi.layoutTypes[:0]
				for range cnt {
					fi.layoutTypes = append(fi.layoutTypes, d.Uint32())
				}
			default:
				return fmt.Errorf("nfs: cannot decode attribute %d returned by the server", n)
			}
		}
	}
	if err := d.Err(); err != nil {
		return fmt.Errorf("nfs: malformed fattr4: %w", err)
	}
	return nil
}

func decodeTime(d *xdr.Decoder) time.Time {
	s := d.Int64()
	ns := d.Uint32()
	if ns >= 1e9 {
		ns = 0
	}
	return time.Unix(s, int64(ns))
}

// parseOwner turns an owner string into an id. Servers configured for
// numeric ids send "1000"; others send "1000@domain" for unmapped ids.
func parseOwner(s string) uint32 {
	if i := strings.IndexByte(s, '@'); i >= 0 {
		s = s[:i]
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		if s == "root" {
			return 0
		}
		return nobody
	}
	return uint32(n)
}

// SetAttr lists attribute changes for Client.SetAttr; nil fields are left
// alone.
type SetAttr struct {
	Mode     *uint32
	UID, GID *uint32
	Size     *uint64
	Atime    *time.Time
	Mtime    *time.Time
}

// encode builds the fattr4 for s. Attributes must appear in bit order.
func (s *SetAttr) encode() nfs4.Fattr4 {
	e := xdr.NewEncoder(64)
	var nums []int
	if s.Size != nil {
		nums = append(nums, nfs4.FATTR4_SIZE)
		e.Uint64(*s.Size)
	}
	if s.Mode != nil {
		nums = append(nums, nfs4.FATTR4_MODE)
		e.Uint32(*s.Mode & 0o7777)
	}
	if s.UID != nil {
		nums = append(nums, nfs4.FATTR4_OWNER)
		e.String(strconv.FormatUint(uint64(*s.UID), 10))
	}
	if s.GID != nil {
		nums = append(nums, nfs4.FATTR4_OWNER_GROUP)
		e.String(strconv.FormatUint(uint64(*s.GID), 10))
	}
	if s.Atime != nil {
		nums = append(nums, nfs4.FATTR4_TIME_ACCESS_SET)
		encodeSetTime(e, *s.Atime)
	}
	if s.Mtime != nil {
		nums = append(nums, nfs4.FATTR4_TIME_MODIFY_SET)
		encodeSetTime(e, *s.Mtime)
	}
	return nfs4.Fattr4{Attrmask: attrBits(nums...), AttrVals: e.Bytes()}
}

func (s *SetAttr) empty() bool {
	return s.Mode == nil && s.UID == nil && s.GID == nil && s.Size == nil && s.Atime == nil && s.Mtime == nil
}

func encodeSetTime(e *xdr.Encoder, t time.Time) {
	e.Uint32(uint32(nfs4.SET_TO_CLIENT_TIME4))
	e.Int64(t.Unix())
	e.Uint32(uint32(t.Nanosecond()))
}

func modeAttr(mode uint32) nfs4.Fattr4 {
	m := mode & 0o7777
	return (&SetAttr{Mode: &m}).encode()
}
