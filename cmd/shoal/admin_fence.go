package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/cluster"
)

func newAdminFenceFileCmd() *cobra.Command {
	var f adminFlags
	cmd := &cobra.Command{
		Use:   "fence-file PATH",
		Short: "Fence a file on the NFSv3 data servers: a new owner for its data files, its layouts recalled",
		Long: `Fence PATH (a regular file, from the file system's root) on the loosely
coupled NFSv3 data servers of an MDS started with --flex-v3-server: its data
files get a fresh synthetic owner uid, so that clients still writing with
the ids of their old layouts are refused by the data servers (RFC 8435
section 2.2), and its layouts are recalled, so that clients come back for
layouts that carry the new ids. The MDS fences a client this way by itself
when it revokes the client's layouts.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var fi cluster.FenceInfo
			if err := f.call(cmd.Context(), "fence-file", cluster.AdminRequest{Path: args[0]}, &fi); err != nil {
				return err
			}
			if f.json {
				return printJSON(fi)
			}
			fmt.Printf("%s (inode %d): data files now owned by uid %d\n", fi.Path, fi.Ino, fi.Owner)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}
