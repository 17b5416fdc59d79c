package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// exitInconsistent is fsck's exit status when it found problems (1 is any
// other failure, such as a database that does not open).
const exitInconsistent = 4

// fsckResult is `shoal admin fsck --json`'s output.
type fsckResult struct {
	Dir         string   `json:"dir"`
	OK          bool     `json:"ok"`
	Inodes      uint64   `json:"inodes"`
	Directories uint64   `json:"directories"`
	Entries     uint64   `json:"entries"`
	Orphans     uint64   `json:"orphans"`
	DataObjects uint64   `json:"data_objects"`
	Problems    []string `json:"problems"`
	Omitted     int      `json:"omitted,omitempty"`
	// Removed counts the data objects no file owns that --repair
	// removed (before the check whose result this is).
	Removed int `json:"removed,omitempty"`
}

func newAdminFsckCmd() *cobra.Command {
	var dir string
	var asJSON, repair bool
	cmd := &cobra.Command{
		Use:   "fsck",
		Short: "Check a stopped server's metadata for inconsistencies (offline)",
		Long: `Check the namespace in a server's --dir (its meta.db; the bolt engine)
for inconsistencies: entries without their inode, inodes no entry names,
link counts, the readdir index, records left by deleted inodes, counters,
and data objects in DIR/data that no file owns. Unlike the other admin
commands it works offline, on the directory of a server that is not
running: it opens the database as the server would (replaying its
metadata log, so it opens what a restart would open) and checks it.
It changes nothing else, unless --repair. Exit status 0: consistent; 4:
problems found (listed); 1: the check could not run (for example a
database that does not open).

--repair removes the data objects no file owns (unreferenced-data-object:
data of files whose create a machine crash took back, with sync: false)
and then checks again; it repairs nothing else. A server sweeps these
itself after an unclean start; --repair is for a stopped one. For a
cluster's data servers, use 'shoal admin sweep' on the running MDS.`,
		Example: "  shoal admin fsck --dir /var/lib/shoal\n  shoal admin fsck --dir /var/lib/shoal --repair",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return errors.New("--dir is required: the stopped server's data directory")
			}
			res, err := fsckDir(cmd, dir, repair)
			if err != nil {
				return err
			}
			if res.Removed > 0 && !asJSON {
				fmt.Printf("removed %d data objects no file owns\n", res.Removed)
			}
			if asJSON {
				if err := printJSON(res); err != nil {
					return err
				}
			} else {
				fmt.Printf("%s: %d inodes (%d directories, %d orphans), %d entries, %d data objects\n",
					dir, res.Inodes, res.Directories, res.Orphans, res.Entries, res.DataObjects)
				for _, p := range res.Problems {
					fmt.Println("  " + p)
				}
				if res.Omitted > 0 {
					fmt.Printf("  and %d more\n", res.Omitted)
				}
			}
			if !res.OK {
				return &exitError{code: exitInconsistent, err: fmt.Errorf("%s: %d problems", dir, len(res.Problems)+res.Omitted)}
			}
			if !asJSON {
				fmt.Println("consistent")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the server's data directory (holding meta.db and, for shoal serve, data/)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	cmd.Flags().BoolVar(&repair, "repair", false, "remove the data objects no file owns (left by creates a machine crash took back), then check again")
	return cmd
}

func fsckDir(cmd *cobra.Command, dir string, repair bool) (*fsckResult, error) {
	dbPath := filepath.Join(dir, "meta.db")
	if _, err := os.Stat(dbPath); err != nil {
		return nil, fmt.Errorf("--dir %s: no metadata database: %w", dir, err)
	}
	// The server's lock: a running server's database is not to be
	// opened (it would also replay and remove its log files).
	claim, err := claimDir(dir)
	if err != nil {
		return nil, err
	}
	claim.ready() // keep everything: the directory is the server's
	defer claim.release()
	e, err := meta.OpenBolt(dbPath, meta.BoltOptions{WAL: true})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dbPath, err)
	}
	defer e.Close()
	var objs []meta.Ino
	hasData := false
	if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
		hasData = true
		objs, err = dataObjects(dir)
		if err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	removed := 0
	// A metadata server's directory has no data/: its objects are on
	// the data servers, and its sweep mark stays for its own sweep.
	if repair && hasData {
		if objs, removed, err = repairObjects(cmd.Context(), e, dir, objs); err != nil {
			return nil, err
		}
	}
	rep, err := meta.Check(cmd.Context(), e, meta.CheckOptions{DataObjects: objs})
	if err != nil {
		return nil, err
	}
	res := &fsckResult{Removed: removed,
		Dir: dir, OK: rep.OK(), Inodes: rep.Inodes, Directories: rep.Directories, Entries: rep.Entries,
		Orphans: rep.Orphans, DataObjects: rep.DataObjects, Problems: []string{}, Omitted: rep.Omitted,
	}
	for _, p := range rep.Problems {
		res.Problems = append(res.Problems, p.String())
	}
	return res, nil
}

// dataObjects lists the inodes that have a data object in dir's local
// store (`shoal serve`'s file data).
func dataObjects(dir string) ([]meta.Ino, error) {
	var objs []meta.Ino
	err := store.WalkLocal(dir, func(ino uint64) error {
		objs = append(objs, meta.Ino(ino))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list data objects: %w", err)
	}
	return objs, nil
}

// repairObjects removes the objects of objs that no regular file owns
// (meta.Unowned: the rule of Check's unreferenced-data-object) from dir's
// local store, and clears the engine's sweep mark, since this is the
// sweep the server would run after an unclean start. Offline, with the
// server's lock held, no create can be in flight, so every such object
// is garbage. It returns the objects left and how many it removed.
func repairObjects(ctx context.Context, e meta.Engine, dir string, objs []meta.Ino) ([]meta.Ino, int, error) {
	gone, err := meta.Unowned(ctx, e, objs)
	if err != nil {
		return nil, 0, err
	}
	for _, ino := range gone {
		if err := store.RemoveLocal(dir, uint64(ino)); err != nil {
			return nil, 0, fmt.Errorf("repair: %w", err)
		}
	}
	if mark, ok, err := meta.SweepMark(ctx, e); err != nil {
		return nil, 0, err
	} else if ok {
		if err := meta.ClearSweepMark(ctx, e, mark); err != nil {
			return nil, 0, err
		}
	}
	removed := make(map[meta.Ino]bool, len(gone))
	for _, ino := range gone {
		removed[ino] = true
	}
	left := slices.DeleteFunc(objs, func(ino meta.Ino) bool { return removed[ino] })
	return left, len(gone), nil
}
