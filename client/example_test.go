package client_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"

	"github.com/shoalfs/shoal/client"
)

func Example() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:2049", client.Options{UID: 1000, GID: 1000})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	f, err := c.Open(ctx, "/data/hello.txt", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := f.Write([]byte("hello, NFS\n")); err != nil {
		log.Fatal(err)
	}
	if err := f.Close(); err != nil { // COMMITs the UNSTABLE write
		log.Fatal(err)
	}

	if _, err := c.Stat(ctx, "/data/missing"); errors.Is(err, fs.ErrNotExist) {
		fmt.Println("missing, as expected")
	}
}
