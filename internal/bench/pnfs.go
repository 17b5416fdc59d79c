package bench

import "github.com/shoalfs/shoal/client"

// pnfsOptions returns the client options for one pNFS mode of the ior
// workload. It is the one place that knows how the client library spells
// "pNFS on/off". Whether a run really went to the data servers is not
// taken from the option but measured: every client reports how many of its
// bytes went to data servers and how many through the metadata server
// (client.Stats), so a client that quietly falls back is seen in the report.
func pnfsOptions(on bool) client.Options {
	return client.Options{PNFSOff: !on}
}

// ioStats is the part of client.Stats the ior workload reports.
type ioStats struct {
	dsBytes, mdsBytes, failovers, layoutGets uint64
}

func clientIOStats(c *client.Client) ioStats {
	s := c.Stats()
	return ioStats{
		dsBytes:    s.DSReadBytes + s.DSWriteBytes,
		mdsBytes:   s.MDSIOBytes,
		failovers:  s.Failovers,
		layoutGets: s.LayoutGets,
	}
}
