package main

import (
	"io/fs"
	"strings"
	"testing"
)

// TestArgErrorsShowUsage: a command given the wrong number of arguments
// says how it is used.
func TestArgErrorsShowUsage(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		usage string
	}{
		{[]string{"cp", "only-one"}, "usage: shoal cp"},
		{[]string{"up", "stray"}, "usage: shoal up"},
		{[]string{"admin", "policy"}, "usage: shoal admin policy PATH"},
		{[]string{"version", "x"}, "usage: shoal version"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			root := newRootCmd()
			root.SetArgs(tc.args)
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.usage) {
				t.Fatalf("shoal %s: %v, want an error with %q", strings.Join(tc.args, " "), err, tc.usage)
			}
		})
	}
}

func TestLsMode(t *testing.T) {
	for _, tc := range []struct {
		mode fs.FileMode
		want string
	}{
		{0o644, "-rw-r--r--"},
		{fs.ModeDir | 0o755, "drwxr-xr-x"},
		{fs.ModeSymlink | 0o777, "lrwxrwxrwx"},
		{fs.ModeNamedPipe | 0o600, "prw-------"},
		{fs.ModeSocket | 0o755, "srwxr-xr-x"},
		{fs.ModeDevice | fs.ModeCharDevice | 0o666, "crw-rw-rw-"},
		{fs.ModeDevice | 0o660, "brw-rw----"},
	} {
		if got := lsMode(tc.mode); got != tc.want {
			t.Errorf("lsMode(%v) = %q, want %q", tc.mode, got, tc.want)
		}
	}
}
