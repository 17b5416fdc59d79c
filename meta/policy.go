package meta

import (
	"bytes"
	"context"
	"fmt"
)

// Policy is the placement policy of a directory or regular file: how
// many copies the data of a file gets when it is first placed, and the
// pNFS layout type its clients get.
//
// A directory's policy is a default for what is created in it, in the
// manner of Lustre's default directory striping: Create copies the
// parent's policy record, in the same transaction, to every new regular
// file and directory, so a file carries the policy its data placement
// uses and a subdirectory passes it on to what is created in it later.
// Setting or clearing a directory's policy therefore changes only inodes
// created afterwards; existing files and subdirectories keep their own
// copy, and Link and Rename never change a policy. Symlinks, devices,
// FIFOs and sockets hold no data and get no policy. LayoutsBelow is the
// exception: it describes the directory's subtree, not its new children,
// and is not copied.
type Policy struct {
	// Mirrors is the number of copies of each stripe unit, 1 to
	// MaxMirrors (see StripeMap). Zero means not set: the cluster
	// default applies.
	Mirrors int
	// Layout is the pNFS layout type of files created below the
	// directory; a file's own is the type its layouts have for good.
	// LayoutDefault means not set: the export's type applies.
	Layout Layout
	// LayoutsBelow are the layout types set on directories below this
	// one (the NFS server lists them in fs_layout_types, since a client
	// may meet them under this directory). The administration adds to
	// it when it sets a Layout below; nothing removes from it, so it may
	// name a type no file below uses any more.
	LayoutsBelow LayoutSet
}

// Layout is a pNFS layout type of a Policy.
type Layout uint8

// Layout values.
const (
	LayoutDefault   Layout = iota // not set: the export's
	LayoutFiles                   // LAYOUT4_NFSV4_1_FILES (RFC 8881 §13)
	LayoutFlexFiles               // LAYOUT4_FLEX_FILES (RFC 8435)
	layoutEnd
)

// String is the name `shoal admin policy` and the export configuration
// use.
func (l Layout) String() string {
	switch l {
	case LayoutDefault:
		return "inherit"
	case LayoutFiles:
		return "files"
	case LayoutFlexFiles:
		return "flexfiles"
	}
	return fmt.Sprintf("Layout(%d)", uint8(l))
}

// LayoutSet is a set of Layouts other than LayoutDefault.
type LayoutSet uint8

// Has reports whether l is in the set.
func (s LayoutSet) Has(l Layout) bool { return l != LayoutDefault && s&(1<<l) != 0 }

// With returns the set with l added (LayoutDefault adds nothing).
func (s LayoutSet) With(l Layout) LayoutSet {
	if l == LayoutDefault {
		return s
	}
	return s | 1<<l
}

// layoutSetAll holds every valid Layout but LayoutDefault.
const layoutSetAll = LayoutSet(1<<LayoutFiles | 1<<LayoutFlexFiles)

func (p Policy) validate() error {
	if p.Mirrors < 0 || p.Mirrors > MaxMirrors {
		return fmt.Errorf("policy with %d mirrors (0 to %d): %w", p.Mirrors, MaxMirrors, ErrInval)
	}
	if p.Layout >= layoutEnd {
		return fmt.Errorf("policy with layout %d: %w", p.Layout, ErrInval)
	}
	if p.LayoutsBelow&^layoutSetAll != 0 {
		return fmt.Errorf("policy with layouts below %#x: %w", uint8(p.LayoutsBelow), ErrInval)
	}
	return nil
}

// policy records:
//
//	'P' ino(8) -> version(1)=1 mirrors(1) [layout(1) layouts-below(1)]
//
// Only set policies are stored: a zero Policy deletes the record. The
// layout bytes are written only when one of them is set, so a policy of
// mirrors alone is the record binaries before layouts wrote (and read);
// mirrors may be 0 only in a record with them. Decoders accept longer
// records, so later versions can append fields, and Create copies the
// record (less LayoutsBelow), keeping bytes it does not know, so a field
// an older binary does not know still reaches new inodes.
const pPolicy = 'P'

const (
	policyV1       = 1
	policyV1Len    = 2
	policyV1LayLen = 4 // with the layout bytes
)

func policyKey(ino Ino) []byte { return be.AppendUint64([]byte{pPolicy}, uint64(ino)) }

func (p Policy) encode() []byte {
	b := []byte{policyV1, byte(p.Mirrors)}
	if p.Layout != LayoutDefault || p.LayoutsBelow != 0 {
		b = append(b, byte(p.Layout), byte(p.LayoutsBelow))
	}
	return b
}

func decodePolicy(b []byte) (Policy, error) {
	if len(b) < policyV1Len || b[0] != policyV1 || b[1] > MaxMirrors {
		return Policy{}, fmt.Errorf("meta: corrupt policy record (%d bytes)", len(b))
	}
	p := Policy{Mirrors: int(b[1])}
	if len(b) >= policyV1LayLen {
		p.Layout, p.LayoutsBelow = Layout(b[2]), LayoutSet(b[3])
	} else if len(b) > policyV1Len {
		return Policy{}, fmt.Errorf("meta: corrupt policy record (%d bytes)", len(b))
	}
	if p == (Policy{}) || p.validate() != nil {
		return Policy{}, fmt.Errorf("meta: corrupt policy record (%x)", b[:min(len(b), policyV1LayLen)])
	}
	return p, nil
}

// inherits reports whether a new inode of type t gets its parent's policy.
func inherits(t FileType) bool { return t == TypeRegular || t == TypeDirectory }

// inheritPolicy gives the new inode ino a copy of rec, its parent's
// policy record as read in this transaction (nil if the parent has none),
// without the parent's LayoutsBelow, which describes the parent's subtree
// and not the child's. A corrupt record fails the create rather than
// spread.
func (x *tx) inheritPolicy(parent, ino Ino, rec []byte) error {
	if rec == nil {
		return nil
	}
	p, err := decodePolicy(rec)
	if err != nil {
		return fmt.Errorf("policy of directory %d: %w", parent, err)
	}
	if p.LayoutsBelow != 0 {
		p.LayoutsBelow = 0
		if p == (Policy{}) {
			return nil
		}
		enc := p.encode()
		if rest := rec[policyV1LayLen:]; len(rest) > 0 {
			// Fields of a later version follow the layout bytes.
			enc = append([]byte{policyV1, byte(p.Mirrors), byte(p.Layout), 0}, rest...)
		}
		rec = enc
	}
	return x.t.Put(policyKey(ino), bytes.Clone(rec))
}

func (e *kvEngine) Policy(ctx context.Context, ino Ino) (Policy, error) {
	var p Policy
	err := e.view(ctx, func(x *tx) error {
		p = Policy{}
		if _, err := x.inode(ino); err != nil {
			return err
		}
		v, err := x.t.Get(policyKey(ino))
		if err != nil || v == nil {
			return err
		}
		if p, err = decodePolicy(v); err != nil {
			return fmt.Errorf("policy of inode %d: %w", ino, err)
		}
		return nil
	})
	return p, err
}

func (e *kvEngine) SetPolicy(ctx context.Context, ino Ino, p Policy) error {
	if err := p.validate(); err != nil {
		return err
	}
	return e.update(ctx, func(x *tx) error {
		if _, err := x.dir(ino); err != nil {
			return err
		}
		if p == (Policy{}) {
			return x.t.Delete(policyKey(ino))
		}
		return x.t.Put(policyKey(ino), p.encode())
	})
}
