package state

import (
	"encoding/binary"
	"fmt"

	"github.com/shoalfs/shoal/pnfs"
)

// Stateid is the NFSv4 stateid4: a seqid that counts changes to one piece
// of state and a 12-byte "other" that names the state.
//
// Layout of Other for stateids minted here:
//
//	bytes 0..3   boot epoch (big-endian) – detects stateids of a previous boot
//	byte  4      StateType
//	bytes 5..7   random salt fixed per Manager – makes guessing harder
//	bytes 8..11  counter (big-endian), unique within the boot
type Stateid struct {
	Seqid uint32
	Other [12]byte
}

// StateType is the kind of state a stateid names. It is encoded in byte 4
// of Stateid.Other.
type StateType uint8

const (
	TypeOpen   StateType = 1
	TypeLock   StateType = 2
	TypeDeleg  StateType = 3 // delegations (deleg.go)
	TypeLayout StateType = 4 // pNFS layouts (layout.go)
)

func (t StateType) String() string {
	switch t {
	case TypeOpen:
		return "open"
	case TypeLock:
		return "lock"
	case TypeDeleg:
		return "deleg"
	case TypeLayout:
		return "layout"
	}
	return fmt.Sprintf("StateType(%d)", uint8(t))
}

// Special stateids (RFC 8881 section 8.2.3).
var (
	// AnonymousStateid is all zeros: I/O without any open.
	AnonymousStateid = Stateid{}
	// ReadBypassStateid is all ones: READ that bypasses deny reservations.
	ReadBypassStateid = Stateid{Seqid: 0xffffffff, Other: [12]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
	// CurrentStateid {1, zeros} asks for the COMPOUND's current stateid; the
	// dispatcher substitutes it before calling this package.
	CurrentStateid = Stateid{Seqid: 1}
	// InvalidStateid {0xffffffff, zeros} is always invalid; the dispatcher
	// uses it as the "no current stateid" value.
	InvalidStateid = Stateid{Seqid: 0xffffffff}
)

// IsAnonymous reports whether s is the anonymous (all-zero) stateid.
func (s Stateid) IsAnonymous() bool { return s == AnonymousStateid }

// IsReadBypass reports whether s is the all-ones READ bypass stateid.
func (s Stateid) IsReadBypass() bool { return s == ReadBypassStateid }

// IsCurrent reports whether s is the "current stateid" marker.
func (s Stateid) IsCurrent() bool { return s == CurrentStateid }

// IsSpecial reports whether s is any reserved stateid (other is all zeros
// or all ones). Special stateids are never found in the state table.
func (s Stateid) IsSpecial() bool {
	return s.Other == AnonymousStateid.Other || s.Other == ReadBypassStateid.Other
}

// Epoch returns the boot epoch embedded in s.
func (s Stateid) Epoch() uint32 { return binary.BigEndian.Uint32(s.Other[0:4]) }

// Type returns the kind of state s names.
func (s Stateid) Type() StateType { return StateType(s.Other[4]) }

func (s Stateid) String() string {
	return fmt.Sprintf("{%d %x}", s.Seqid, s.Other[:])
}

// nextSeqid advances a stateid seqid, skipping 0 which means "current".
func nextSeqid(s uint32) uint32 {
	s++
	if s == 0 {
		s = 1
	}
	return s
}

// checkSeqid applies RFC 8881 section 8.2.2: seqid 0 means the current
// state, a newer seqid than the server has issued is invalid, an older one
// is stale.
func checkSeqid(req, cur uint32) error {
	switch {
	case req == 0 || req == cur:
		return nil
	case seqidAfter(req, cur):
		return pnfs.ErrBadStateid
	default:
		return pnfs.ErrOldStateid
	}
}

// seqidAfter compares seqids with wraparound (serial-number arithmetic).
func seqidAfter(a, b uint32) bool { return int32(a-b) > 0 }

// fromEarlierBoot reports whether sid was minted by an earlier boot of this
// server (NFS4ERR_STALE_STATEID). Epochs only grow, so an epoch from the
// future is not stale but simply bad.
func (m *Manager) fromEarlierBoot(sid Stateid) bool {
	e := sid.Epoch()
	return e != m.epoch && e < m.epoch
}
