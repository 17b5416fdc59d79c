package testbed

import (
	"fmt"
	"strconv"
	"strings"
)

// Rate is a link rate in bits per second.
type Rate uint64

// ParseRate parses a rate in tc's notation: a number followed by bit, kbit,
// mbit, gbit (powers of 1000, in bits) or bps, kbps, mbps, gbps (bytes per
// second). A bare number is bits per second.
func ParseRate(s string) (Rate, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	units := []struct {
		suffix string
		mult   float64
	}{
		{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1},
		{"gbps", 8e9}, {"mbps", 8e6}, {"kbps", 8e3}, {"bps", 8},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bad rate %q: want e.g. 800mbit, 1gbit, 2.5gbit", s)
	}
	r := Rate(v * mult)
	if r < 1e6 || r > 100e9 {
		return 0, fmt.Errorf("rate %q out of range (1mbit..100gbit)", s)
	}
	return r, nil
}

// String formats r the way tc accepts it and people read it.
func (r Rate) String() string {
	switch {
	case r%1e9 == 0:
		return fmt.Sprintf("%dgbit", r/1e9)
	case r%1e6 == 0:
		return fmt.Sprintf("%dmbit", r/1e6)
	case r%1e3 == 0:
		return fmt.Sprintf("%dkbit", r/1e3)
	}
	return fmt.Sprintf("%dbit", uint64(r))
}

// tbfArgs returns the tbf parameters for r. The bucket must hold at least
// one timer tick of traffic or tbf cannot reach the rate; 1 MiB covers
// rates up to several Gbit/s, faster links get rate/100.
func (r Rate) tbfArgs() []string {
	burst := uint64(r) / 8 / 100
	if burst < 1<<20 {
		burst = 1 << 20
	}
	return []string{"tbf", "rate", fmt.Sprintf("%dbit", uint64(r)), "burst", strconv.FormatUint(burst, 10), "latency", "50ms"}
}
