package server

import (
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestImplStripes: which clients get flexfiles layouts striped inside a
// mirror under flex_stripe: auto, by the implementation id they send in
// EXCHANGE_ID (Linux sends "Linux RELEASE VERSION MACHINE").
func TestImplStripes(t *testing.T) {
	for _, tc := range []struct {
		domain, name string
		want         bool
	}{
		{"kernel.org", "Linux 6.1.0-27-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.115-1 (2024-11-01) x86_64", false},
		{"kernel.org", "Linux 6.17.9 #1 SMP x86_64", false},
		{"kernel.org", "Linux 6.18.0 #1 SMP x86_64", true},
		{"kernel.org", "Linux 7.2.13+deb14-amd64 #1 SMP PREEMPT_DYNAMIC Debian 7.2.13-1 x86_64", true},
		{"kernel.org", "Linux 10.0.1 #1", true},
		{"shoal.dev", "shoal", true},
		{"example.org", "some client 9.9", false},
		{"", "", false},
	} {
		ids := []nfs4.NfsImplId4{{NiiDomain: []byte(tc.domain), NiiName: []byte(tc.name)}}
		if got := implStripes(ids); got != tc.want {
			t.Errorf("%q %q: stripes %v, want %v", tc.domain, tc.name, got, tc.want)
		}
	}
	if implStripes(nil) {
		t.Error("a client without an implementation id stripes")
	}
}
