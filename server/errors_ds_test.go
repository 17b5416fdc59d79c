package server

import (
	"fmt"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/pnfs"
)

// TestStatusOfDataServerErrors: what a data server answers when its MDS
// cannot be asked. ErrMDSUnreachable (which may also wrap ErrUnavailable)
// sends the client to the MDS; NFS4ERR_DELAY from a data server pauses the
// Linux files layout driver for 15 s.
func TestStatusOfDataServerErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want nfs4.Nfsstat4
	}{
		{"map without an MDS", fmt.Errorf("%w: %w: not connected", pnfs.ErrMDSUnreachable, pnfs.ErrUnavailable), nfs4.NFS4ERR_PNFS_NO_LAYOUT},
		{"stateid without an MDS", fmt.Errorf("%w: no answer", pnfs.ErrMDSUnreachable), nfs4.NFS4ERR_PNFS_NO_LAYOUT},
		{"peer busy", fmt.Errorf("%w: peer", pnfs.ErrUnavailable), nfs4.NFS4ERR_DELAY},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := statusOf(tt.err); got != tt.want {
				t.Errorf("statusOf(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
