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

// kvStore is the storage engine beneath the metadata engine. Transactions
// are serializable. The function passed to Update may run more than once (a
// store may retry on conflict or replay it after a failed group commit), so
// it must have no effects besides its transaction and assigning its results.
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
