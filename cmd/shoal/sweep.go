package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/server"
)

func newAdminSweepCmd() *cobra.Command {
	var f adminFlags
	var detach bool
	cmd := &cobra.Command{
		Use:   "sweep",
		Short: "Remove the data objects no file owns from the data servers, online",
		Long: `Make the running MDS list the objects of every data server in service and
remove those that no file owns: data of files whose create a crash of the
MDS took back (with sync: false, a create is answered before it is
durable). The MDS does this by itself after an unclean start, once the
grace period is over; run it by hand after a data server that was out of
service then is back, or to check. Only objects of inode numbers below
the inode counter as the sweep starts are considered, so files created
meanwhile are never touched. The sweep runs in the background at a
bounded rate; this command shows its result when it ends (--detach: at
once). For a stopped 'shoal serve', use 'shoal admin fsck --repair'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var st cluster.SweepState
			if err := f.call(cmd.Context(), "sweep", cluster.AdminRequest{}, &st); err != nil {
				return err
			}
			if !st.Started && st.Running {
				fmt.Println("a sweep is running already; waiting for it")
			}
			for !detach && st.Running {
				select {
				case <-cmd.Context().Done():
					fmt.Println("stopped watching; the sweep goes on")
					return nil
				case <-time.After(time.Second):
				}
				if err := f.call(cmd.Context(), "sweep-status", cluster.AdminRequest{}, &st); err != nil {
					return err
				}
			}
			if f.json {
				return printJSON(st)
			}
			if st.Running {
				fmt.Println("sweep started; 'shoal admin sweep' again shows its result when it ends")
				return nil
			}
			var rep server.SweepReport
			if len(st.Last) == 0 {
				return errors.New("the MDS reports no sweep")
			}
			if err := json.Unmarshal(st.Last, &rep); err != nil {
				return fmt.Errorf("the MDS's sweep report: %w", err)
			}
			fmt.Printf("sweep below inode %d: %d objects listed, %d no file owns, %d removed, %d failed, in %v\n",
				rep.Below, rep.Listed, rep.Unowned, rep.Removed, rep.Failed, rep.Ended.Sub(rep.Started).Round(time.Millisecond))
			if !rep.Complete {
				return fmt.Errorf("sweep incomplete: %s", rep.Err)
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&detach, "detach", false, "start the sweep and return without waiting for its end")
	return cmd
}
