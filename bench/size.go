package bench

import (
	"fmt"
	"strconv"
	"strings"
)

// sizeSuffixes maps unit suffixes (lower case) to multipliers. Binary units
// are the default for the bare letters because block and file sizes are
// powers of two in practice.
var sizeSuffixes = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseSize parses a byte count such as "1GiB", "64MiB", "512k" or "4096".
// KiB/MiB/GiB and the bare letters K/M/G are powers of two; KB/MB/GB are
// powers of ten.
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range sizeSuffixes {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q: want a number with an optional unit (KiB, MiB, GiB, KB, MB, GB)", s)
	}
	if n > 0 && mult > 1 && n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * mult, nil
}

// FormatSize renders n in the largest binary unit that divides it exactly,
// so "1GiB" and "1536MiB" round-trip through ParseSize.
func FormatSize(n int64) string {
	units := []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if n != 0 && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.name)
		}
	}
	return fmt.Sprintf("%dB", n)
}
