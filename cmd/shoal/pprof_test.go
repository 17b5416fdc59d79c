package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestServePprof: --pprof serves the profile index on a loopback address
// and refuses any other.
func TestServePprof(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:0", true},
		{"localhost:0", true},
		{"0.0.0.0:0", false},
		{":0", false},
		{"192.0.2.1:6060", false},
		{"127.0.0.1", false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			addr, stop, err := servePprof(tc.addr)
			if !tc.ok {
				if err == nil {
					stop()
					t.Fatalf("servePprof(%q) listened; want it refused", tc.addr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			resp, err := http.Get("http://" + addr + "/debug/pprof/")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "goroutine") {
				t.Fatalf("GET /debug/pprof/: %s %q, want the profile index", resp.Status, b)
			}
		})
	}
}
