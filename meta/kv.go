package meta

import "errors"

// kvTxn is one transaction of an ordered key-value store. Keys and values
// returned by Get and Scan are only valid until the transaction ends and must
// not be modified; callers copy what they keep.
type kvTxn interface {
	// Get returns the value of key, or nil if it is absent.
	Get(key []byte) ([]byte, error)
	Put(key, val []byte) error
	Delete(key []byte) error
	// Scan calls fn for every key that has prefix and is >= start (start
	// may be nil), in key order, until fn returns false.
	Scan(prefix, start []byte, fn func(k, v []byte) bool) error
}

// kvBatchGetter is implemented by transactions that read several keys
// faster together than one Get at a time, such as etcd's, where every Get is
// a network round trip. Engines read through getMany, which falls back to
// Get for transactions without it (bbolt: a Get is a B-tree lookup, and a
// batch would only add allocations).
type kvBatchGetter interface {
	// GetMany returns the value of each key, in the order of keys, with
	// nil for absent keys. It reads exactly what a Get of each key at
	// the same point of the transaction would (the same snapshot, and
	// the transaction's own writes), and the values obey Get's rules:
	// valid until the transaction ends, not to be modified. The returned
	// slice itself belongs to the caller. keys is not retained.
	GetMany(keys [][]byte) ([][]byte, error)
}

// getMany reads keys in t, in one batch if t supports it.
func getMany(t kvTxn, keys [][]byte) ([][]byte, error) {
	if b, ok := t.(kvBatchGetter); ok {
		return b.GetMany(keys)
	}
	vals := make([][]byte, len(keys))
	for i, k := range keys {
		v, err := t.Get(k)
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	return vals, nil
}

// kvStore is the storage engine beneath the metadata engine. Transactions
// are serializable. The function passed to Update may run more than once (a
// store may retry on conflict, replay it after a failed group commit, or
// run it ahead to learn what it reads, concurrently with the functions of
// other Updates: etcd's readAhead), so it must have no effects besides its
// transaction and assigning its results, and only its last run counts.
// Update returns only when the transaction is durable. Engines keep each
// transaction small (a handful of keys, or ReadDir's max entries), so stores
// with per-transaction limits, like etcd, fit.
type kvStore interface {
	Update(fn func(kvTxn) error) error
	View(fn func(kvTxn) error) error
	Close() error
}

// errKVClosed is returned by stores after Close.
var errKVClosed = errors.New("meta: kv store closed")

// kvPrefetcher is implemented by transactions for which reading several
// keys together is cheaper than one at a time (etcd's, see
// kvBatchGetter). Prefetch reads keys so that later Gets of them in the
// transaction are answered without another round trip. Engines name the
// keys an operation is about to read at its start (prefetch); for other
// transactions it does nothing.
type kvPrefetcher interface {
	Prefetch(keys [][]byte) error
}

// prefetch hints that t will read keys.
func prefetch(t kvTxn, keys ...[]byte) error {
	if p, ok := t.(kvPrefetcher); ok {
		return p.Prefetch(keys)
	}
	return nil
}
