package main

import (
	"net"
	"strings"
	"testing"
)

// TestParseNFSURL covers the address lists of a cluster with
// metadata-server failover as well as the single-server URLs.
func TestParseNFSURL(t *testing.T) {
	for _, tc := range []struct {
		in, addr, path string // addr "" wants an error
	}{
		{"nfs://127.0.0.1:2049/data", "127.0.0.1:2049", "/data"},
		{"nfs://mds/", "mds:2049", "/"},
		{"nfs://mds", "mds:2049", "/"},
		{"NFS://mds:3049/a%20b", "mds:3049", "/a b"},
		{"nfs://a,b,c:2049/path", "a:2049,b:2049,c:2049", "/path"},
		{"nfs://a:2049,b:2050/path", "a:2049,b:2050", "/path"},
		{"nfs://a,b/path", "a:2049,b:2049", "/path"},
		{"nfs://a:3000,b/p", "a:3000,b:2049", "/p"},
		{"nfs://a,b:3000,c/p", "a:3000,b:3000,c:2049", "/p"},
		{"nfs://[::1]:2049,[::1]:2050/x", "[::1]:2049,[::1]:2050", "/x"},
		{"nfs://[::1],[fe80::1]/x", "[::1]:2049,[fe80::1]:2049", "/x"},
		{"nfs://[::1]/x?q", "[::1]:2049", "/x"},
		{in: "nfs://a,,b/p"},
		{in: "nfs://a,b:0/p"},
		{in: "nfs://a:70000/p"},
		{in: "nfs://a:x,b/p"},
		{in: "nfs://::1/p"},
		{in: "nfs:///p"},
		{in: "nfs://user@a/p"},
		{in: "http://a/p"},
		{in: "a:2049/p"},
	} {
		u, err := parseNFSURL(tc.in)
		if tc.addr == "" {
			if err == nil {
				t.Errorf("parseNFSURL(%q) = %q %q, want an error", tc.in, u.addr, u.path)
			}
			continue
		}
		if err != nil || u.addr != tc.addr || u.path != tc.path {
			t.Errorf("parseNFSURL(%q) = %q %q %v, want %q %q", tc.in, u.addr, u.path, err, tc.addr, tc.path)
		}
	}
}

// TestFileCommandsAddressList runs file commands on a URL whose first
// address has nothing listening: they must use the next one.
func TestFileCommandsAddressList(t *testing.T) {
	live := strings.TrimPrefix(startServer(t), "nfs://")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	base := "nfs://" + dead + "," + live
	if out, err := run(t, "mkdir", base+"/listed"); err != nil {
		t.Fatalf("mkdir: %v\n%s", err, out)
	}
	out, err := run(t, "ls", base+"/")
	if err != nil || !strings.Contains(out, "listed") {
		t.Fatalf("ls = %q, %v; want listed", out, err)
	}
}
