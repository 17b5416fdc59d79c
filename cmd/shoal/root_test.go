package main

import (
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
