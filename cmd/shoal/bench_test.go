package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/shoalfs/shoal/internal/bench"
)

// TestBenchSmallIOThresholdFlag: --small-io-threshold reaches the ior and
// meta configurations as the client policy's byte count.
func TestBenchSmallIOThresholdFlag(t *testing.T) {
	for _, tt := range []struct {
		arg     string
		want    int
		wantErr string
	}{
		{arg: "", want: 0},
		{arg: "4097", want: 4097},
		{arg: "64KiB", want: 64 << 10},
		{arg: "1M", want: 1 << 20},
		{arg: "-1", want: -1},
		{arg: "lots", wantErr: "--small-io-threshold"},
		{arg: "2GiB", wantErr: "--small-io-threshold"},
	} {
		t.Run(tt.arg, func(t *testing.T) {
			var x benchExtra
			fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
			x.flags(fs)
			var args []string
			if tt.arg != "" {
				args = []string{"--small-io-threshold=" + tt.arg}
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			ior := bench.QuickIORConfig()
			iorErr := x.applyIOR(&ior)
			meta, metaErr := x.metaConfig(true, []int{2}, []string{"on"}, 2, 10, 0)
			for _, err := range []error{iorErr, metaErr} {
				if tt.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
						t.Errorf("err = %v, want one containing %q", err, tt.wantErr)
					}
				} else if err != nil {
					t.Errorf("err = %v", err)
				}
			}
			if tt.wantErr == "" && (ior.SmallIOThreshold != tt.want || meta.SmallIOThreshold != tt.want) {
				t.Errorf("ior %d, meta %d; want %d", ior.SmallIOThreshold, meta.SmallIOThreshold, tt.want)
			}
			if tt.wantErr == "" && (meta.DataServers != 2 || !meta.PNFS) {
				t.Errorf("meta config %+v: want 2 DS with pNFS", meta)
			}
		})
	}
}
