package client

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Access is how a File moves data between the application and the server.
// See the package documentation ("Access methods") for the trade-offs.
type Access int

const (
	// AccessDefault means "not chosen here": a File takes the Client's
	// access method, and a Client takes AccessDirect.
	AccessDefault Access = iota
	// AccessDirect sends every ReadAt and WriteAt to the layout driver or
	// the metadata server with its offset and length untouched, and
	// COMMITs at Sync and Close. Nothing is cached or buffered.
	AccessDirect
	// AccessODirect caches no data but gathers contiguous small writes in
	// a buffer of one block, written when a write is not contiguous with
	// it, when it is full, and at Sync, Close, Truncate and reads of the
	// range it holds.
	AccessODirect
	// AccessCached keeps a client-side data cache (bounded by
	// Policy.CacheSize) with write-back in blocks of Policy.BlockSize,
	// readahead for sequential reads and close-to-open consistency.
	AccessCached
)

// String returns the name used in flags and config files.
func (a Access) String() string {
	switch a {
	case AccessDefault:
		return ""
	case AccessDirect:
		return "direct"
	case AccessODirect:
		return "odirect"
	case AccessCached:
		return "cached"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// ParseAccess parses "cached", "odirect" or "direct" ("" is AccessDefault).
func ParseAccess(s string) (Access, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "":
		return AccessDefault, nil
	case "direct":
		return AccessDirect, nil
	case "odirect", "o_direct":
		return AccessODirect, nil
	case "cached":
		return AccessCached, nil
	}
	return AccessDefault, fmt.Errorf("client: unknown access method %q (want cached, odirect or direct)", s)
}

// Set parses s as ParseAccess does (flag.Value).
func (a *Access) Set(s string) error {
	v, err := ParseAccess(s)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Type names the value in command-line help.
func (a *Access) Type() string { return "access" }

// MarshalText implements encoding.TextMarshaler.
func (a Access) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Access) UnmarshalText(b []byte) error { return a.Set(string(b)) }

// LayoutFetch says when a File asks for a pNFS layout.
type LayoutFetch int

const (
	// LayoutOnFirstIO asks for the layout at the first read or write (the
	// default): files opened and closed without I/O cost no LAYOUTGET.
	LayoutOnFirstIO LayoutFetch = iota
	// LayoutOnOpen asks for it right after OPEN, so the first I/O does not
	// wait for LAYOUTGET and GETDEVICEINFO.
	LayoutOnOpen
)

// String returns the name used in flags and config files.
func (l LayoutFetch) String() string {
	if l == LayoutOnOpen {
		return "open"
	}
	return "first-io"
}

// Set parses "open" or "first-io" (flag.Value).
func (l *LayoutFetch) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "first-io", "io", "first_io":
		*l = LayoutOnFirstIO
	case "open":
		*l = LayoutOnOpen
	default:
		return fmt.Errorf("client: unknown layout fetch %q (want open or first-io)", s)
	}
	return nil
}

// Type names the value in command-line help.
func (l *LayoutFetch) Type() string { return "when" }

// MarshalText implements encoding.TextMarshaler.
func (l LayoutFetch) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (l *LayoutFetch) UnmarshalText(b []byte) error { return l.Set(string(b)) }

// Policy holds the client's I/O tunables. The zero value means "all
// defaults"; each zero field takes the default documented on it (see also
// DefaultPolicy and docs/client-policy.md for the measurements behind
// them). A Policy is set per Client in Options.Policy; the access method
// can also be chosen per File (OpenAccess, File.SetAccess).
type Policy struct {
	// Access is the Client's access method for Files that do not choose
	// one. Default AccessDirect (the behaviour of earlier releases).
	Access Access `yaml:"access"`
	// BlockSize is the transfer size the cached and odirect methods
	// gather writes into and read in. Default: the server's suggestion
	// (the layout_blksize attribute, which Shoal's metadata server sets
	// to its stripe unit), else 4 MiB. The direct method ignores it.
	BlockSize int `yaml:"block_size"`
	// MaxPerDS bounds the requests in flight to each data server, shared
	// by all Files of the Client. Default 8. (Options.MaxPerDS is the
	// older spelling; this field wins when both are set.)
	MaxPerDS int `yaml:"max_per_ds"`
	// LayoutFetch says when layouts are fetched. Default LayoutOnFirstIO.
	LayoutFetch LayoutFetch `yaml:"layout_fetch"`
	// KeepLayouts keeps a File's layout after Close (committed, not
	// returned) for the next File of the Client that opens the same file;
	// the server can still recall it. Default false: layouts are returned
	// at Close.
	KeepLayouts bool `yaml:"keep_layouts"`
	// SmallIOThreshold: requests to the server shorter than this many
	// bytes go through the metadata server instead of the data servers,
	// and need no layout: a small file written or read in one request
	// then costs no LAYOUTGET, LAYOUTCOMMIT or LAYOUTRETURN and no
	// data-server round trip. It applies to what is sent, i.e. after
	// gathering for cached and odirect, and to the application's
	// request rather than the pieces it arrives in: a short request
	// that starts where a large one of the File ended is its tail (the
	// kernel cuts unaligned 1 MiB buffers into 1 MiB - 16 B and 16 B)
	// and goes the large one's way. Default
	// DefaultSmallIOThreshold (64 KiB); negative never uses the metadata
	// server for I/O that a layout could serve.
	SmallIOThreshold int `yaml:"small_io_threshold"`
	// Readahead is how far the cached method reads ahead of a sequential
	// reader. Default 1 MiB; negative turns readahead off.
	Readahead int `yaml:"readahead"`
	// CacheSize bounds the memory of the cached method's data cache,
	// shared by all Files of the Client. Default 64 MiB.
	CacheSize int64 `yaml:"cache_size"`
	// IORetryTimeout bounds how long a READ, WRITE or COMMIT is retried
	// while the server answers NFS4ERR_DELAY ("try again later"), counted
	// from the first such answer, with a backoff of 10 ms doubling to 1 s.
	// When it runs out the I/O fails with the server's NFS4ERR_DELAY (a
	// *StatusError). It applies to the metadata server and to data
	// servers; other operations wait longer (see the package
	// documentation, "Sessions and slots"). Shoal's metadata server
	// answers NFS4ERR_DELAY for I/O on a data server that is out of
	// service for its own bound (`shoal mds --ds-down-after`, default
	// 10 s) and NFS4ERR_IO after it, so this should exceed that bound for
	// the server's verdict to reach the caller. Default
	// DefaultIORetryTimeout (30 s); negative is invalid.
	IORetryTimeout time.Duration `yaml:"io_retry_timeout"`
	// UnstableLimit bounds the memory each File uses to keep copies of
	// the data it wrote UNSTABLE until a COMMIT vouches for it (see the
	// package documentation, "Consistency and durability"). A write that
	// takes a File past half of it starts a commit of what the File holds
	// in the background, as Sync would commit it, and a write that would
	// take the File past the limit waits for that commit. Writes larger than a quarter of it go out in parts of
	// that size, each checked the same way, so a File holds at most
	// about UnstableLimit plus a quarter of it (plus what concurrent
	// writes of the same File have in flight). Default
	// DefaultUnstableLimit (64 MiB); negative is invalid.
	UnstableLimit int64 `yaml:"unstable_limit"`
}

// Defaults of Policy, chosen from BenchmarkAccessMethods (see
// docs/client-policy.md).
const (
	DefaultBlockSize = 4 << 20
	DefaultReadahead = 1 << 20
	DefaultCacheSize = 64 << 20
	// DefaultSmallIOThreshold: with 2 data servers on loopback, files
	// of 4 KiB (and postmark's of up to 16 KiB) created and read through
	// the MDS cost 24-42% less CPU per operation and ran 1.3-1.6x
	// faster than with a layout each, level with pNFS off, while 1 MiB
	// requests still went to the data servers at unchanged rates. The
	// price: 4 KiB direct I/O on large files goes through the MDS too,
	// 15-37% slower (docs/client-policy.md).
	DefaultSmallIOThreshold = 64 << 10
	// DefaultIORetryTimeout is Policy.IORetryTimeout's default: three
	// times the metadata server's default --ds-down-after (10 s), so the
	// server's NFS4ERR_IO for a dead data server arrives well within it,
	// while I/O never hangs for minutes (the general NFS4ERR_DELAY budget
	// is two leases plus 10 s: 3 min 10 s with the usual 90 s lease).
	DefaultIORetryTimeout = 30 * time.Second
	// DefaultUnstableLimit is Policy.UnstableLimit's default.
	DefaultUnstableLimit = 64 << 20
	// minCacheBlocks is how many blocks the cache holds at least, so that
	// write-back and readahead can overlap.
	minCacheBlocks = 4
)

// DefaultPolicy returns the policy a Client uses when Options.Policy is
// the zero value, with the server's block size suggestion not applied.
func DefaultPolicy() Policy {
	return Policy{
		Access: AccessDirect, BlockSize: DefaultBlockSize, MaxPerDS: defaultMaxPerDS,
		LayoutFetch: LayoutOnFirstIO, SmallIOThreshold: DefaultSmallIOThreshold,
		Readahead: DefaultReadahead, CacheSize: DefaultCacheSize,
		IORetryTimeout: DefaultIORetryTimeout, UnstableLimit: DefaultUnstableLimit,
	}
}

// Validate reports settings that cannot work.
func (p Policy) Validate() error {
	var errs []error
	if p.Access < AccessDefault || p.Access > AccessCached {
		errs = append(errs, fmt.Errorf("access %d out of range", int(p.Access)))
	}
	if p.BlockSize < 0 {
		errs = append(errs, fmt.Errorf("block_size %d < 0", p.BlockSize))
	}
	if p.BlockSize > 64<<20 {
		errs = append(errs, fmt.Errorf("block_size %d > 64 MiB", p.BlockSize))
	}
	if p.MaxPerDS < 0 {
		errs = append(errs, fmt.Errorf("max_per_ds %d < 0", p.MaxPerDS))
	}
	if p.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("cache_size %d < 0", p.CacheSize))
	}
	if p.IORetryTimeout < 0 {
		errs = append(errs, fmt.Errorf("io_retry_timeout %v < 0", p.IORetryTimeout))
	}
	if p.UnstableLimit < 0 {
		errs = append(errs, fmt.Errorf("unstable_limit %d < 0", p.UnstableLimit))
	}
	if p.LayoutFetch != LayoutOnFirstIO && p.LayoutFetch != LayoutOnOpen {
		errs = append(errs, fmt.Errorf("layout_fetch %d out of range", int(p.LayoutFetch)))
	}
	if len(errs) > 0 {
		return fmt.Errorf("client: invalid policy: %w", errors.Join(errs...))
	}
	return nil
}

// withDefaults fills the zero fields. serverBlk is the server's block size
// suggestion (0: none).
func (p Policy) withDefaults(serverBlk uint32) Policy {
	d := DefaultPolicy()
	if p.Access == AccessDefault {
		p.Access = d.Access
	}
	if p.BlockSize <= 0 {
		p.BlockSize = d.BlockSize
		if serverBlk >= 4<<10 && serverBlk <= 64<<20 {
			p.BlockSize = int(serverBlk)
		}
	}
	if p.MaxPerDS <= 0 {
		p.MaxPerDS = d.MaxPerDS
	}
	switch {
	case p.SmallIOThreshold == 0:
		p.SmallIOThreshold = d.SmallIOThreshold
	case p.SmallIOThreshold < 0:
		p.SmallIOThreshold = 0
	}
	switch {
	case p.Readahead == 0:
		p.Readahead = d.Readahead
	case p.Readahead < 0:
		p.Readahead = 0
	}
	if p.CacheSize <= 0 {
		p.CacheSize = d.CacheSize
	}
	if p.CacheSize < int64(minCacheBlocks*p.BlockSize) {
		p.CacheSize = int64(minCacheBlocks * p.BlockSize)
	}
	if p.IORetryTimeout <= 0 {
		p.IORetryTimeout = d.IORetryTimeout
	}
	if p.UnstableLimit <= 0 {
		p.UnstableLimit = d.UnstableLimit
	}
	return p
}
