package client_test

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/shoalfs/shoal/client"
)

// TestDSServerCloseKeepsData: closing a data server's NFS service
// (DS.Server.Close) must leave the store it shares with the DS's control
// agent open, so the MDS still reaches that DS's stripe units. (It once
// closed it.)
func TestDSServerCloseKeepsData(t *testing.T) {
	cl := startCluster(t, 2)
	c := dialer(cl.MDS.Addr.String(), client.Options{PNFSOff: true})(t)
	defer c.Close()
	f, err := c.Open(t.Context(), "/f", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 4<<20)
	pattern(b, 0)
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	cl.DS[1].Server.Close() // the NFS listener only; the agent stays
	got := make([]byte, len(b))
	n, err := f.ReadAt(got, 0)
	if n != len(b) || (err != nil && err != io.EOF) || !bytes.Equal(got, b) {
		t.Fatalf("MDS read after closing DS 1's NFS service: %d, %v", n, err)
	}
}
