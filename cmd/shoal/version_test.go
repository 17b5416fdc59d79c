package main

import (
	"bytes"
	"regexp"
	"testing"
)

// TestVersion runs `shoal version` and checks it names a version, a commit
// and the Go version, and that -X main.commit wins over VCS stamping.
func TestVersion(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	for _, tc := range []struct {
		name, version, commit string
		want                  []string
	}{
		{"default", "dev", "", []string{`(?m)^shoal dev$`, `(?m)^commit \S+`, `(?m)^go go1\.\d+`}},
		{"stamped", "v1.2.3", "0123abcd", []string{`(?m)^shoal v1\.2\.3$`, `(?m)^commit 0123abcd$`, `(?m)^go go1\.\d+`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			version, commit = tc.version, tc.commit
			root := newRootCmd()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetArgs([]string{"version"})
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			for _, re := range tc.want {
				if !regexp.MustCompile(re).MatchString(out.String()) {
					t.Errorf("output %q does not match %s", out.String(), re)
				}
			}
		})
	}
}
