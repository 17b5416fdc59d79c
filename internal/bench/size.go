package bench

import "fmt"

// FormatSize renders n in the largest binary unit that divides it exactly,
// so "1GiB" and "1536MiB" round-trip through the CLI's size parser
// (internal/bytesize).
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
