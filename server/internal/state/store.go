package state

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// ClientStore persists confirmed client records so that, after a restart,
// the server knows which clients may reclaim state during the grace
// period. Keys and records are opaque to the store. The meta engine
// implements it; MemStore is an in-memory implementation for tests.
type ClientStore interface {
	PutClient(ctx context.Context, key []byte, rec []byte) error
	DeleteClient(ctx context.Context, key []byte) error
	// Clients calls fn for every stored record; an error from fn stops
	// the iteration and is returned.
	Clients(ctx context.Context, fn func(key, rec []byte) error) error
}

// MemStore is a ClientStore kept in memory. It survives Manager restarts
// within one process, which is what tests of the grace period need.
type MemStore struct {
	mu   sync.Mutex
	recs map[string][]byte
}

var _ ClientStore = (*MemStore)(nil)

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{recs: make(map[string][]byte)} }

// PutClient stores a copy of rec under key.
func (s *MemStore) PutClient(_ context.Context, key, rec []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs[string(key)] = append([]byte(nil), rec...)
	return nil
}

// DeleteClient removes key; deleting a missing key is not an error.
func (s *MemStore) DeleteClient(_ context.Context, key []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, string(key))
	return nil
}

// Clients iterates over a snapshot of the records in key order.
func (s *MemStore) Clients(_ context.Context, fn func(key, rec []byte) error) error {
	s.mu.Lock()
	keys := make([]string, 0, len(s.recs))
	for k := range s.recs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	snap := make([][]byte, len(keys))
	for i, k := range keys {
		snap[i] = s.recs[k]
	}
	s.mu.Unlock()
	for i, k := range keys {
		if err := fn([]byte(k), snap[i]); err != nil {
			return err
		}
	}
	return nil
}

// Len reports the number of stored records.
func (s *MemStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// clientRecord is the persisted form of a confirmed client. The key is the
// client owner ID, so a client that reboots (new verifier) overwrites its
// previous record when the new incarnation is confirmed.
type clientRecord struct {
	ClientID  ClientID
	Verifier  [8]byte
	Owner     []byte
	Principal string
}

const recordVersion = 1

// Encoding: version(1) clientid(8) verifier(8) ownerlen(4) owner principallen(4) principal.
func (r *clientRecord) marshal() []byte {
	b := make([]byte, 0, 1+8+8+4+len(r.Owner)+4+len(r.Principal))
	b = append(b, recordVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(r.ClientID))
	b = append(b, r.Verifier[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Owner)))
	b = append(b, r.Owner...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Principal)))
	b = append(b, r.Principal...)
	return b
}

var errBadRecord = errors.New("malformed client record")

func unmarshalClientRecord(b []byte) (clientRecord, error) {
	var r clientRecord
	if len(b) < 1+8+8+4 || b[0] != recordVersion {
		return r, errBadRecord
	}
	b = b[1:]
	r.ClientID = ClientID(binary.BigEndian.Uint64(b))
	copy(r.Verifier[:], b[8:16])
	b = b[16:]
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b)) {
		return r, errBadRecord
	}
	r.Owner = append([]byte(nil), b[:n]...)
	b = b[n:]
	if len(b) < 4 {
		return r, errBadRecord
	}
	n = binary.BigEndian.Uint32(b)
	b = b[4:]
	if uint64(n) != uint64(len(b)) {
		return r, fmt.Errorf("%w: trailing bytes", errBadRecord)
	}
	r.Principal = string(b)
	return r, nil
}
