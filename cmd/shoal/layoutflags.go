package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/server"
)

// layoutFlags are `shoal mds --layout` and `--flex-stripe`: the pNFS
// layout type the exports hand out (server.Export.Layout, FlexStripe),
// for every export that does not set its own in the --config file.
type layoutFlags struct {
	layout, flexStripe string
	flexNoIOThruMDS    bool
	flexRecallDelay    time.Duration
}

func (l *layoutFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&l.layout, "layout", "",
		"pNFS layout type of the exports that set none of their own: files (the default; data servers copy replicated stripes) or flexfiles (RFC 8435; clients write every copy)")
	cmd.Flags().StringVar(&l.flexStripe, "flex-stripe", "",
		"with flexfiles: stripe each mirror over the file's data servers (on), one data server per mirror (off; Linux before 6.18 needs it), or by the client's EXCHANGE_ID implementation id (auto, the default)")
	cmd.Flags().BoolVar(&l.flexNoIOThruMDS, "flex-no-io-thru-mds", false,
		"with flexfiles: set FF_FLAGS_NO_IO_THRU_MDS, so that a client whose data server fails reports it and asks for a new layout instead of resending its I/O through the MDS (exports' flex_no_io_thru_mds)")
	cmd.Flags().DurationVar(&l.flexRecallDelay, "flex-recall-delay", 0,
		"with flexfiles: after a data server leaves service, wait this long before recalling the layouts, so that clients report the failed I/O themselves first (exports' flex_recall_delay; 0: at once)")
}

// apply sets the flags on the exports that leave the settings empty; with
// no exports it makes the default one ("/") to carry them. Invalid values
// are the server's to refuse (server.Export).
func (l *layoutFlags) apply(exports []*server.Export) []*server.Export {
	if l.layout == "" && l.flexStripe == "" && !l.flexNoIOThruMDS && l.flexRecallDelay == 0 {
		return exports
	}
	if len(exports) == 0 {
		exports = []*server.Export{{Path: "/"}}
	}
	for _, e := range exports {
		if e.Layout == "" {
			e.Layout = l.layout
		}
		if e.FlexStripe == "" {
			e.FlexStripe = l.flexStripe
		}
		if l.flexNoIOThruMDS {
			e.FlexNoIOThruMDS = true
		}
		if e.FlexRecallDelay == 0 {
			e.FlexRecallDelay = l.flexRecallDelay
		}
	}
	return exports
}
