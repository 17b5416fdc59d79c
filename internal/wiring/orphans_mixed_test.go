package wiring

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/shoalfs/shoal/client"
)

// TestFreerMixedBurst: a burst of removes of small files (inline at the
// MDS, no stripe map: the freer frees them with their inodes alone) and
// large ones (objects on the data servers) among them. Every orphan is
// freed, and every large file's objects are gone from every data server:
// the freer's shortcut for files without a stripe map (orphanSet.unplaced)
// must not skip a file that has one.
func TestFreerMixedBurst(t *testing.T) {
	c := startCluster(t, 2, 0)
	ctx := ctxT(t)
	cl, err := client.Dial(ctx, c.MDS.Addr.String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	small, large := []byte("small"), bytes.Repeat([]byte("L"), 200<<10)
	var inos []uint64
	placed := map[uint64]bool{}
	for i := range 40 {
		name := "f" + strconv.Itoa(i)
		data := small
		if i%4 == 0 {
			data = large
		}
		f, err := cl.Open(ctx, "/"+name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		ino := inoOf(t, c, name)
		inos = append(inos, ino)
		if st := stateOf(t, c, ino); st.placed != (i%4 == 0) {
			t.Fatalf("%s: placed %v, want %v (inline %d bytes)", name, st.placed, i%4 == 0, len(st.inline))
		}
		placed[ino] = i%4 == 0
	}
	objects := func(ino uint64) int {
		n := 0
		for _, ds := range c.DS {
			if f, err := ds.Store.Open(ino, false); err == nil {
				f.Close()
				n++
			}
		}
		return n
	}
	for ino, p := range placed {
		if p && objects(ino) == 0 {
			t.Fatalf("ino %d: no object on any data server before the remove", ino)
		}
	}
	for i := range inos {
		if err := cl.Remove(ctx, "/f"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every orphan freed", func() bool {
		o, err := c.MDS.Server.Meta().Orphans(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(o) == 0
	})
	for _, ino := range inos {
		if n := objects(ino); n != 0 {
			t.Errorf("ino %d (placed %v): %d objects left on the data servers", ino, placed[ino], n)
		}
	}
}
