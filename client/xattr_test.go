package client_test

import (
	"errors"
	"slices"
	"syscall"
	"testing"

	"github.com/shoalfs/shoal/client"
)

// TestXattr sets, reads, lists and removes extended attributes through
// Shoal's client, with the errnos Linux's system calls give, and checks
// that an NFSv4.1 session refuses them.
func TestXattr(t *testing.T) {
	addr := startShoal(t)
	c := dialer(addr, client.Options{})(t)
	defer c.Close()
	ctx := t.Context()
	if err := c.Mkdir(ctx, "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	wantErrno := func(what string, err error, want syscall.Errno) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", what, err, want)
		}
	}
	if err := c.Setxattr(ctx, "/d", "user.a", []byte("1"), client.XattrCreate); err != nil {
		t.Fatal(err)
	}
	wantErrno("create existing", c.Setxattr(ctx, "/d", "user.a", nil, client.XattrCreate), syscall.EEXIST)
	wantErrno("replace missing", c.Setxattr(ctx, "/d", "user.b", nil, client.XattrReplace), syscall.ENODATA)
	wantErrno("other namespace", c.Setxattr(ctx, "/d", "trusted.a", nil, 0), syscall.ENOTSUP)
	wantErrno("value too big", c.Setxattr(ctx, "/d", "user.big", make([]byte, 64<<10+1), 0), syscall.E2BIG)
	if err := c.Setxattr(ctx, "/d", "user.b", []byte("two"), 0); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Getxattr(ctx, "/d", "user.b"); err != nil || string(v) != "two" {
		t.Fatalf("get: %q, %v", v, err)
	}
	if names, err := c.Listxattr(ctx, "/d"); err != nil || !slices.Equal(names, []string{"user.a", "user.b"}) {
		t.Fatalf("list: %q, %v", names, err)
	}
	if err := c.Removexattr(ctx, "/d", "user.a"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Getxattr(ctx, "/d", "user.a")
	wantErrno("get removed", err, syscall.ENODATA)

	old := dialer(addr, client.Options{MinorVersion: 1})(t)
	defer old.Close()
	_, err = old.Getxattr(ctx, "/d", "user.b")
	wantErrno("4.1 get", err, syscall.ENOTSUP)
}
