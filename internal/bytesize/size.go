// Package bytesize parses the byte counts that Shoal's command line, client
// policy files and benchmarks take, so that one spelling means one number
// everywhere.
//
// Units mean what their standards say: KiB, MiB, GiB, TiB are powers of
// 1024 (IEC), KB, MB, GB, TB are powers of 1000 (SI). A bare letter (4k,
// 64M, 1G) is a power of 1024, as in dd and fio, because block, stripe and
// file sizes are powers of two in practice. Case does not matter, a space
// may separate number and unit, and a number without a unit is a byte
// count. The parsing is go-humanize's; this package adds the bare-letter
// rule, exact plain byte counts, and the int64 range.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
)

// Parse returns the number of bytes s stands for, such as 65536 for
// "64KiB", 64000 for "64KB" and 4194304 for "4M".
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size: want a byte count such as 4096, 64KiB or 1MB")
	}
	// A plain byte count stays exact above 2^53, which go-humanize's
	// float arithmetic would round.
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("size %q is negative", s)
		}
		return n, nil
	}
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	if last := t[len(t)-1]; strings.IndexByte("kmgtpeKMGTPE", last) >= 0 {
		t += "i" // bare letter: binary (see the package documentation)
	}
	n, err := humanize.ParseBytes(t)
	if err != nil {
		return 0, fmt.Errorf("bad size %q: want a byte count such as 4096, 64KiB (65536) or 64KB (64000)", s)
	}
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(n), nil
}

// ParseSigned is Parse for settings where a negative size means "off" or
// "never" (such as the client policy's readahead): a leading minus sign
// negates the size that follows ("-1", "-64KiB").
func ParseSigned(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(t, "-"); ok {
		n, err := Parse(rest)
		if err != nil {
			return 0, fmt.Errorf("bad size %q: want a byte count such as 4096, 64KiB or -1", s)
		}
		return -n, nil
	}
	return Parse(s)
}
