package main

import (
	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/server"
)

// layoutFlags are `shoal mds --layout` and `--flex-stripe`: the pNFS
// layout type the exports hand out (server.Export.Layout, FlexStripe),
// for every export that does not set its own in the --config file.
type layoutFlags struct {
	layout, flexStripe string
}

func (l *layoutFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&l.layout, "layout", "",
		"pNFS layout type of the exports that set none of their own: files (the default; data servers copy replicated stripes) or flexfiles (RFC 8435; clients write every copy)")
	cmd.Flags().StringVar(&l.flexStripe, "flex-stripe", "",
		"with flexfiles: stripe each mirror over the file's data servers (on), one data server per mirror (off; Linux before 6.18 needs it), or by the client's EXCHANGE_ID implementation id (auto, the default)")
}

// apply sets the flags on the exports that leave the settings empty; with
// no exports it makes the default one ("/") to carry them. Invalid values
// are the server's to refuse (server.Export).
func (l *layoutFlags) apply(exports []*server.Export) []*server.Export {
	if l.layout == "" && l.flexStripe == "" {
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
	}
	return exports
}
