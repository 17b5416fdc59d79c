package meta

import (
	"bytes"
	"context"
	"fmt"
)

// Policy is the replication policy of a directory or regular file: how
// many copies the data of a file gets when it is first placed.
//
// A directory's policy is a default for what is created in it, in the
// manner of Lustre's default directory striping: Create copies the
// parent's policy record, in the same transaction, to every new regular
// file and directory, so a file carries the policy its data placement
// uses and a subdirectory passes it on to what is created in it later.
// Setting or clearing a directory's policy therefore changes only inodes
// created afterwards; existing files and subdirectories keep their own
// copy, and Link and Rename never change a policy. Symlinks, devices,
// FIFOs and sockets hold no data and get no policy.
type Policy struct {
	// Mirrors is the number of copies of each stripe unit, 1 to
	// MaxMirrors (see StripeMap). Zero means not set: the cluster
	// default applies.
	Mirrors int
}

func (p Policy) validate() error {
	if p.Mirrors < 0 || p.Mirrors > MaxMirrors {
		return fmt.Errorf("policy with %d mirrors (0 to %d): %w", p.Mirrors, MaxMirrors, ErrInval)
	}
	return nil
}

// policy records:
//
//	'P' ino(8) -> version(1)=1 mirrors(1)
//
// Only set policies are stored (mirrors 1 to MaxMirrors): a policy of zero
// deletes the record. Decoders accept longer records, so later versions
// can append fields, and Create copies the record byte for byte, so a
// field an older binary does not know still reaches new inodes.
const pPolicy = 'P'

const (
	policyV1    = 1
	policyV1Len = 2
)

func policyKey(ino Ino) []byte { return be.AppendUint64([]byte{pPolicy}, uint64(ino)) }

func (p Policy) encode() []byte { return []byte{policyV1, byte(p.Mirrors)} }

func decodePolicy(b []byte) (Policy, error) {
	if len(b) < policyV1Len || b[0] != policyV1 || b[1] < 1 || b[1] > MaxMirrors {
		return Policy{}, fmt.Errorf("meta: corrupt policy record (%d bytes)", len(b))
	}
	return Policy{Mirrors: int(b[1])}, nil
}

// inherits reports whether a new inode of type t gets its parent's policy.
func inherits(t FileType) bool { return t == TypeRegular || t == TypeDirectory }

// inheritPolicy gives the new inode ino a copy of rec, its parent's
// policy record as read in this transaction (nil if the parent has none).
// A corrupt record fails the create rather than spread.
func (x *tx) inheritPolicy(parent, ino Ino, rec []byte) error {
	if rec == nil {
		return nil
	}
	if _, err := decodePolicy(rec); err != nil {
		return fmt.Errorf("policy of directory %d: %w", parent, err)
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
		if p.Mirrors == 0 {
			return x.t.Delete(policyKey(ino))
		}
		return x.t.Put(policyKey(ino), p.encode())
	})
}
