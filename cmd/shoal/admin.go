package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/wiring"
)

// adminFlags are the flags every `shoal admin` command takes.
type adminFlags struct {
	mds, secretFile string
	json            bool
}

func (f *adminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.mds, "mds", "127.0.0.1:2049", "metadata server address host:port, or several (host:port,host:port): the one that leads answers")
	cmd.Flags().StringVar(&f.secretFile, "join-secret-file", "", "the cluster's join secret (the MDS's "+wiring.JoinSecretName+"; default for 'shoal up': DIR/mds/"+wiring.JoinSecretName+" with DIR $TMPDIR/shoal)")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the MDS's answer as JSON")
}

func (f *adminFlags) call(ctx context.Context, command string, req cluster.AdminRequest, out any) error {
	path := f.secretFile
	if path == "" {
		path = filepath.Join(os.TempDir(), "shoal", "mds", wiring.JoinSecretName)
	}
	secret, err := cluster.ReadJoinSecret(path)
	if err != nil {
		return fmt.Errorf("%w (pass --join-secret-file)", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// Standby MDS nodes do not listen: try the addresses in turn and let
	// the leader answer. A refusal from a reached MDS is its answer.
	var errs []error
	for _, addr := range strings.Split(f.mds, ",") {
		err := cluster.CallAdmin(cctx, addr, secret, command, req, out)
		var nerr *net.OpError
		if err == nil || !errors.As(err, &nerr) && !errors.Is(err, cluster.ErrNotLeader) {
			return err
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func newAdminCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Administer a Shoal cluster: data servers, drains, rebalancing, replication",
		Long: `Administer a running Shoal cluster through its metadata server. Every
command presents the cluster's join secret (--join-secret-file), except
fsck, which checks a stopped server's directory offline.`,
	}
	cmd.AddCommand(newAdminStatusCmd(), newAdminDrainCmd(), newAdminRemoveCmd(), newAdminRebalanceCmd(), newAdminCancelCmd(),
		newAdminPolicyCmd(), newAdminScrubCmd(), newAdminStepDownCmd(), newAdminFsckCmd(), newAdminFenceFileCmd(), newAdminSweepCmd())
	return cmd
}

func newAdminStatusCmd() *cobra.Command {
	var f adminFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the data servers, the files that are not fully available, and replication",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var st cluster.Status
			if err := f.call(cmd.Context(), "status", cluster.AdminRequest{}, &st); err != nil {
				return err
			}
			if f.json {
				return printJSON(st)
			}
			printStatus(&st)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newAdminStepDownCmd() *cobra.Command {
	var f adminFlags
	cmd := &cobra.Command{
		Use:   "step-down",
		Short: "Make the leading MDS hand over to a standby at once (MDS nodes on etcd)",
		Long: `The leading metadata server stops serving and resigns its election, so a
standby MDS on the same etcd prefix takes over without waiting for the
leader's lease; the old leader stands by. Clients recover their state at the
new leader as after a server restart.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.call(cmd.Context(), "step-down", cluster.AdminRequest{}, nil); err != nil {
				return err
			}
			fmt.Println("the leader is stepping down; `shoal admin status` shows the new one")
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

func printStatus(st *cluster.Status) {
	fmt.Printf("cluster %s: %d data servers, %d files placed, %d not fully available\n\n",
		st.ClusterID, len(st.DataServers), st.Files, st.UnavailableFiles)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tADDRESS\tSTATE\tUP\tFILES\tBYTES\tFREE\tLAST HEARTBEAT")
	for _, d := range st.DataServers {
		up := "up"
		if !d.Up {
			up = "DOWN since " + d.Since.Format(time.TimeOnly)
		}
		beat := "-"
		if !d.LastBeat.IsZero() {
			beat = time.Since(d.LastBeat).Round(time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, strings.Join(d.Addrs, ","), d.State, up,
			d.Files, humanBytes(d.Bytes), humanBytes(d.Free), beat)
	}
	w.Flush()
	if len(st.Unavailable) > 0 {
		fmt.Printf("\nfiles not fully available (%d):\n", st.UnavailableFiles)
		for _, f := range st.Unavailable {
			if len(f.Down) == 0 {
				fmt.Printf("  inode %d: stripes whose only copies are stale\n", f.Ino)
				continue
			}
			fmt.Printf("  inode %d: stripes on %s\n", f.Ino, strings.Join(f.Down, ", "))
		}
	}
	printReplication(&st.Replication)
	if ha := st.HA; ha != nil {
		printHA(ha)
	}
	if j := st.Job; j != nil {
		fmt.Println()
		printJob(j)
	}
}

func printHA(ha *cluster.HAStatus) {
	fmt.Printf("\nmetadata servers (term %d):\n", ha.Term)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  NODE\tADDRESS\tROLE\tTERM\tLEASE LEFT")
	for _, n := range ha.Nodes {
		role := "standby"
		if n.Leader {
			role = "leader"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%d\t%s\n", n.Node, n.Addr, role, n.Term, n.LeaseLeft)
	}
	w.Flush()
	fmt.Println("etcd members:")
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  NAME\tENDPOINTS\tHEALTH")
	for _, m := range ha.Etcd {
		h := "healthy"
		switch {
		case m.Error != "":
			h = "UNHEALTHY: " + m.Error
		case m.Leader:
			h = "healthy, raft leader"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\n", m.Name, strings.Join(m.Endpoints, ","), h)
	}
	w.Flush()
}

func printReplication(r *cluster.ReplicationStatus) {
	fmt.Printf("\nreplication: %d files in several copies; %d degraded (%d stripe positions), %d stale copies, %d cannot heal\n",
		r.Files, r.DegradedFiles, r.DegradedStripes, r.StaleCopies, r.UnhealableFiles)
	if len(r.Unhealable) > 0 {
		fmt.Printf("  no good copy in service of some stripes (inodes):")
		for _, ino := range r.Unhealable {
			fmt.Printf(" %d", ino)
		}
		fmt.Println()
	}
	if h := r.Heal; h != nil {
		rate := "unlimited"
		if h.Rate > 0 {
			rate = humanBytes(uint64(h.Rate)) + "/s"
		}
		state := "idle"
		if h.Running {
			state = fmt.Sprintf("healing inode %d", h.Current)
		}
		fmt.Printf("  healing: %s; %d files healed, %s copied, %d failed (rate limit %s)\n",
			state, h.Files, humanBytes(uint64(h.Bytes)), h.Failed, rate)
		if h.LastErr != "" {
			fmt.Printf("  last healing error (%s): %s\n", h.LastErrAt.Format(time.DateTime), h.LastErr)
		}
	} else {
		fmt.Println("  healing: off")
	}
	if sc := r.Scrub; sc.Files > 0 {
		fmt.Printf("  scrubbed since the MDS started: %d files, %d chunks, %d bad copies, %d repaired\n",
			sc.Files, sc.Chunks, sc.Bad, sc.Repaired)
	}
}

func printJob(j *cluster.Job) {
	state := "running"
	switch {
	case j.Running:
	case j.Cancelled:
		state = "cancelled"
	case j.Err != "":
		state = "failed"
	default:
		state = "done"
	}
	what := j.Kind
	if j.DS != "" {
		what += " " + j.DS
	}
	end := time.Now()
	if !j.Ended.IsZero() {
		end = j.Ended
	}
	el := end.Sub(j.Started)
	rate := 0.0
	if el > 0 {
		rate = float64(j.Bytes) / el.Seconds() / 1e6
	}
	if j.Kind == "scrub" {
		fmt.Printf("%s: %s: %d files, %d chunks checked, %d bad copies, %d repaired, %d files not checked, in %v\n",
			what, state, j.Files, j.Chunks, j.Bad, j.Repaired, j.Failed, el.Round(time.Millisecond))
	} else {
		fmt.Printf("%s: %s: %d of %d files moved, %d failed, %s copied in %v (%.1f MB/s)\n",
			what, state, j.Moved, j.Files, j.Failed, humanBytes(uint64(j.Bytes)), el.Round(time.Millisecond), rate)
	}
	if j.Err != "" {
		fmt.Printf("  error: %s\n", j.Err)
	}
}

// printFindings lists what a scrub found.
func printFindings(j *cluster.Job) {
	for _, f := range j.Findings {
		outcome := "repaired"
		if !f.Repaired {
			outcome = "NOT repaired: " + f.Err
		}
		fmt.Printf("  inode %d, bytes %d+%d on %s: %s, %s\n", f.Ino, f.Offset, f.Length, f.DS, f.Problem, outcome)
	}
	if len(j.Findings) < j.Bad {
		fmt.Printf("  (%d more not listed)\n", j.Bad-len(j.Findings))
	}
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// runJob starts a job and, unless detached, shows its progress until it
// ends.
func runJob(cmd *cobra.Command, f *adminFlags, command string, req cluster.AdminRequest, detach bool) error {
	var j cluster.Job
	if err := f.call(cmd.Context(), command, req, &j); err != nil {
		return err
	}
	for !detach && j.Running {
		select {
		case <-cmd.Context().Done():
			fmt.Println("\nstopped watching; the job goes on (`shoal admin cancel` stops it)")
			return nil
		case <-time.After(time.Second):
		}
		var st cluster.Status
		if err := f.call(cmd.Context(), "status", cluster.AdminRequest{}, &st); err != nil {
			return err
		}
		if st.Job == nil {
			return errors.New("the MDS no longer reports the job (did it restart? a drain resumes by itself)")
		}
		j = *st.Job
		if !f.json && j.Running {
			printJob(&j)
		}
	}
	if f.json {
		return printJSON(j)
	}
	printJob(&j)
	printFindings(&j)
	if j.Err != "" || j.Cancelled {
		return fmt.Errorf("%s did not finish", command)
	}
	return nil
}

func newAdminDrainCmd() *cobra.Command {
	var f adminFlags
	var detach bool
	cmd := &cobra.Command{
		Use:   "drain DS-ID",
		Short: "Move every stripe off a data server, online; resumable",
		Long: `Move every stripe off a data server while clients keep reading and
writing: each file's layouts are recalled, its stripe units on the data server
are copied to another one, verified, and the file's stripe map is switched.
New files stop going to the data server at once. Interrupt it with
` + "`shoal admin cancel`" + ` and run it again to resume; an MDS restart resumes it too.
When it is done the data server is "drained" and can be removed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJob(cmd, &f, "drain", cluster.AdminRequest{DS: args[0]}, detach)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&detach, "detach", false, "start the drain and return")
	return cmd
}

func newAdminRebalanceCmd() *cobra.Command {
	var f adminFlags
	var detach bool
	cmd := &cobra.Command{
		Use:   "rebalance",
		Short: "Spread existing files over data servers added since they were written",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJob(cmd, &f, "rebalance", cluster.AdminRequest{}, detach)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&detach, "detach", false, "start the rebalance and return")
	return cmd
}

func newAdminCancelCmd() *cobra.Command {
	var f adminFlags
	cmd := &cobra.Command{
		Use:   "cancel",
		Short: "Stop the running drain, rebalance or scrub (a drain resumes when asked again)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var j cluster.Job
			if err := f.call(cmd.Context(), "cancel", cluster.AdminRequest{}, &j); err != nil {
				return err
			}
			printJob(&j)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newAdminRemoveCmd() *cobra.Command {
	var f adminFlags
	var force bool
	cmd := &cobra.Command{
		Use:   "remove DS-ID",
		Short: "Retire a drained data server (--force: a dead one, losing its stripes)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res cluster.RemoveResult
			if err := f.call(cmd.Context(), "remove", cluster.AdminRequest{DS: args[0], Force: force}, &res); err != nil {
				return err
			}
			if f.json {
				return printJSON(res)
			}
			fmt.Printf("removed %s\n", res.DS)
			if res.FilesLost > 0 {
				fmt.Printf("%d files lost the stripes it held; their reads of those stripes fail with EIO. Inodes:\n", res.FilesLost)
				for _, ino := range res.Inodes {
					fmt.Printf("  %d\n", ino)
				}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "remove a data server that still holds stripes; the files that lose data are listed")
	return cmd
}

func newAdminScrubCmd() *cobra.Command {
	var f adminFlags
	var wait bool
	cmd := &cobra.Command{
		Use:   "scrub",
		Short: "Check every copy of every replicated file and repair the bad ones",
		Long: `Check every copy of every replicated file: each data server sums its copy of
each stripe chunk (1 MiB) through its block checksums, and a copy that fails
them or disagrees with the sound copies is rewritten from a sound one, under
the file's layout hold. The scrub runs on the MDS as a job, one job at a time
with drains and rebalances; ` + "`shoal admin status`" + ` shows its progress and
` + "`shoal admin cancel`" + ` stops it. With --wait, wait for the end and list
what was found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJob(cmd, &f, "scrub", cluster.AdminRequest{}, !wait)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the scrub ends and list the bad copies found")
	return cmd
}

func newAdminPolicyCmd() *cobra.Command {
	var f adminFlags
	var mirrors int
	var layout string
	cmd := &cobra.Command{
		Use:   "policy PATH",
		Short: "Show or set how many copies, and which pNFS layout, the files created below a directory get",
		Long: `Show the policy of PATH (a directory of the file system, from its root), or
set it.

--mirrors N: files created below PATH from then on keep N copies of each
stripe unit, on N different data servers (at most 3, and at most the number
of data servers). --mirrors 0 clears the setting, so PATH inherits from above
it, up to the cluster default.

--layout files|flexfiles|inherit: files created below PATH from then on hand
out pNFS layouts of that type (the files layout, RFC 8881, or the flexible
files layout, RFC 8435: docs/flexfiles.md), whatever their export's layout
setting; inherit clears the setting, so new files get what PATH inherited
when it was created, or else the export's type. A file's layout type is
fixed when it is created. Every directory above PATH then lists the type in
fs_layout_types too, since a client may meet it below them.

Existing files keep the copies and the layout type they have.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := cluster.AdminRequest{Path: args[0]}
			if cmd.Flags().Changed("mirrors") {
				req.Mirrors = &mirrors
			}
			if cmd.Flags().Changed("layout") {
				if _, err := cluster.ParseLayout(layout); err != nil {
					return err
				}
				req.Layout = &layout
			}
			var pi cluster.PolicyInfo
			if err := f.call(cmd.Context(), "policy", req, &pi); err != nil {
				return err
			}
			if f.json {
				return printJSON(pi)
			}
			// A directory's policy is its own record (set on it, or copied
			// from its parent when it was created), else the default.
			if pi.Inherited {
				fmt.Printf("%s: %d copies (the cluster default)\n", pi.Path, pi.Mirrors)
			} else {
				fmt.Printf("%s: %d copies for files created in it from now on (cluster default %d)\n", pi.Path, pi.Mirrors, pi.Default)
			}
			if pi.Layout != "" {
				fmt.Printf("%s: %s layouts for files created in it from now on\n", pi.Path, pi.Layout)
			} else {
				fmt.Printf("%s: the export's layout type for files created in it\n", pi.Path)
			}
			if len(pi.LayoutsBelow) > 0 {
				fmt.Printf("%s: directories below it set %s\n", pi.Path, strings.Join(pi.LayoutsBelow, ", "))
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&mirrors, "mirrors", 0, "set the number of copies (1-3); 0 clears the setting")
	cmd.Flags().StringVar(&layout, "layout", "", "set the pNFS layout type of new files: files, flexfiles, or inherit to clear the setting")
	return cmd
}
