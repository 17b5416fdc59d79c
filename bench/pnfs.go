package bench

import "github.com/shoalfs/shoal/client"

// pnfsOptions returns the client options for one pNFS mode of the ior
// workload, and whether the client can honour the mode. It is the one place
// that knows how the client library spells "pNFS on/off", so the rest of the
// harness stays the same whichever way that option ends up named.
//
// The client library does not do pNFS I/O yet: every READ and WRITE goes
// through the metadata server whatever is asked. "Off" is therefore exactly
// what it says, and "on" is reported as having fallen back to the MDS.
func pnfsOptions(on bool) (opts client.Options, honoured bool) {
	return client.Options{}, !on
}
