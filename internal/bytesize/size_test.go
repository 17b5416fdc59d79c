package bytesize

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64 // -1: an error
	}{
		{"0", 0},
		{"4096", 4096},
		{"9007199254740993", 9007199254740993}, // 2^53+1: exact, not rounded
		{"64KiB", 64 << 10},
		{"64KB", 64_000},
		{"64kb", 64_000},
		{"64k", 64 << 10},
		{"64K", 64 << 10},
		{"64Ki", 64 << 10},
		{"1MiB", 1 << 20},
		{"1MB", 1_000_000},
		{"4M", 4 << 20},
		{"4m", 4 << 20},
		{"1.5GiB", 3 << 29},
		{"1G", 1 << 30},
		{"1GB", 1e9},
		{"2TiB", 2 << 40},
		{"2TB", 2e12},
		{"512 B", 512},
		{" 16 MiB ", 16 << 20},
		{"1,000", 1000},
		{"", -1},
		{"-1", -1},
		{"-1KiB", -1},
		{"MiB", -1},
		{"4 parsecs", -1},
		{"10EiB", -1}, // beyond int64
	} {
		got, err := Parse(tc.in)
		if tc.want < 0 {
			if err == nil {
				t.Errorf("Parse(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %d, %v, want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSigned(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"-1", -1, false},
		{"-64KiB", -64 << 10, false},
		{" -4M", -4 << 20, false},
		{"64KB", 64_000, false},
		{"0", 0, false},
		{"--1", 0, true},
		{"-", 0, true},
		{"-x", 0, true},
	} {
		got, err := ParseSigned(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseSigned(%q) = %d, %v, want %d, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}
