package metatest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/meta"
)

// runPolicies runs the replication-policy cases (meta.Policy).
func runPolicies(t *testing.T, open Opener, ctx context.Context) {
	tests := []struct {
		name string
		fn   func(t *testing.T, v *env)
	}{
		{"SetGetClear", testPolicySetGet},
		{"Validation", testPolicyValidation},
		{"Inheritance", testPolicyInheritance},
		{"NotRetroactive", testPolicyNotRetroactive},
		{"LinkRenameKeep", testPolicyLinkRename},
		{"DeletedWithInode", testPolicyDeleted},
		{"ConcurrentSetCreate", testPolicyConcurrent},
		{"Layout", testPolicyLayout},
	}
	for _, tc := range tests {
		t.Run("Policies/"+tc.name, func(t *testing.T) {
			tc.fn(t, newEnv(t, open, ctx))
		})
	}
}

func (v *env) policy(ino meta.Ino) meta.Policy {
	v.t.Helper()
	p, err := v.e.Policy(v.ctx, ino)
	if err != nil {
		v.t.Fatalf("policy of %d: %v", ino, err)
	}
	return p
}

func (v *env) setPolicy(ino meta.Ino, mirrors int) {
	v.t.Helper()
	if err := v.e.SetPolicy(v.ctx, ino, meta.Policy{Mirrors: mirrors}); err != nil {
		v.t.Fatalf("set policy of %d to %d mirrors: %v", ino, mirrors, err)
	}
}

// wantPolicy checks the policies of inodes, given as ino, mirrors pairs.
func (v *env) wantPolicy(what string, inoMirrors ...any) {
	v.t.Helper()
	for i := 0; i < len(inoMirrors); i += 2 {
		ino, want := inoMirrors[i].(meta.Ino), inoMirrors[i+1].(int)
		if got := v.policy(ino); got != (meta.Policy{Mirrors: want}) {
			v.t.Fatalf("%s: policy of %d = %+v, want %d mirrors", what, ino, got, want)
		}
	}
}

// testPolicySetGet sets, reads, replaces and clears a directory's policy,
// across a reopen, and checks that it is not an NFS attribute.
func testPolicySetGet(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	v.wantPolicy("fresh", meta.RootIno, 0, d.Ino, 0)

	before := v.attr(d.Ino)
	v.setPolicy(d.Ino, 2)
	v.wantPolicy("set", d.Ino, 2, meta.RootIno, 0)
	if a := v.attr(d.Ino); !sameAttr(a, before) {
		t.Fatalf("SetPolicy changed the directory's attributes:\n got %+v\nwant %+v", a, before)
	}
	v.setPolicy(meta.RootIno, 3)
	v.reopen()
	v.wantPolicy("after reopen", d.Ino, 2, meta.RootIno, 3)

	for _, m := range []int{1, 3, 3, 0, 0, 2} {
		v.setPolicy(d.Ino, m) // replacing, and clearing a cleared policy, are fine
		v.wantPolicy(fmt.Sprintf("set to %d", m), d.Ino, m)
	}
	v.setPolicy(meta.RootIno, 0)
	v.reopen()
	v.wantPolicy("cleared, after reopen", meta.RootIno, 0, d.Ino, 2)
}

// testPolicyValidation checks the arguments SetPolicy refuses, and that a
// refusal changes nothing.
func testPolicyValidation(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	v.setPolicy(d.Ino, 2)
	f := v.create(d.Ino, "f", meta.TypeRegular)
	l := v.create(d.Ino, "l", meta.TypeSymlink)
	p := v.create(d.Ino, "p", meta.TypeFIFO)
	const missing = meta.Ino(1 << 40)
	for _, tc := range []struct {
		name    string
		ino     meta.Ino
		mirrors int
		want    error
	}{
		{"negative", d.Ino, -1, meta.ErrInval},
		{"above MaxMirrors", d.Ino, meta.MaxMirrors + 1, meta.ErrInval},
		{"far above", d.Ino, 256, meta.ErrInval},
		{"regular file", f.Ino, 1, meta.ErrNotDir},
		{"clear on a regular file", f.Ino, 0, meta.ErrNotDir},
		{"symlink", l.Ino, 1, meta.ErrNotDir},
		{"fifo", p.Ino, 3, meta.ErrNotDir},
		{"missing inode", missing, 1, meta.ErrStale},
		{"bad value on a missing inode", missing, 9, meta.ErrInval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := v.e.SetPolicy(v.ctx, tc.ino, meta.Policy{Mirrors: tc.mirrors})
			wantErr(t, "SetPolicy", err, tc.want)
		})
	}
	v.wantPolicy("after refusals", d.Ino, 2, f.Ino, 2, l.Ino, 0, p.Ino, 0)
	_, err := v.e.Policy(v.ctx, missing)
	wantErr(t, "Policy of a missing inode", err, meta.ErrStale)
}

// testPolicyInheritance checks that new regular files and directories get
// a copy of their parent's policy, at any depth, and that other types and
// children of a directory without one get none.
func testPolicyInheritance(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	plain := v.create(meta.RootIno, "plain", meta.TypeRegular)
	v.setPolicy(d.Ino, 2)

	f := v.create(d.Ino, "f", meta.TypeRegular)
	sub := v.create(d.Ino, "sub", meta.TypeDirectory)
	subf := v.create(sub.Ino, "f", meta.TypeRegular)
	subsub := v.create(sub.Ino, "sub", meta.TypeDirectory)
	deep := v.create(subsub.Ino, "f", meta.TypeRegular)
	v.wantPolicy("inherited", f.Ino, 2, sub.Ino, 2, subf.Ino, 2, subsub.Ino, 2, deep.Ino, 2, plain.Ino, 0)
	for _, typ := range []meta.FileType{meta.TypeSymlink, meta.TypeFIFO, meta.TypeSocket, meta.TypeChar, meta.TypeBlock} {
		n := v.create(d.Ino, "n-"+typ.String(), typ)
		v.wantPolicy(typ.String()+" holds no data", n.Ino, 0)
	}

	// An exclusive create of an existing name returns the existing file
	// and copies nothing.
	g := v.create(meta.RootIno, "g", meta.TypeRegular)
	if _, _, err := v.e.Link(v.ctx, g.Ino, d.Ino, "g", v.tick()); err != nil {
		t.Fatal(err)
	}
	n, _, err := v.e.Create(v.ctx, d.Ino, "g", meta.CreateArgs{Type: meta.TypeRegular, Exclusive: true}, v.tick())
	wantErr(t, "create existing", err, meta.ErrExist)
	if n.Ino != g.Ino {
		t.Fatalf("create existing returned %d, want %d", n.Ino, g.Ino)
	}
	v.wantPolicy("existing name", g.Ino, 0)

	// A subdirectory's own policy overrides what it inherited, for its
	// new children only.
	v.setPolicy(sub.Ino, 3)
	f3 := v.create(sub.Ino, "f3", meta.TypeRegular)
	v.setPolicy(subsub.Ino, 0)
	none := v.create(subsub.Ino, "none", meta.TypeRegular)
	noneDir := v.create(subsub.Ino, "none-dir", meta.TypeDirectory)
	v.reopen()
	v.wantPolicy("after overrides and reopen", f3.Ino, 3, subf.Ino, 2, none.Ino, 0, noneDir.Ino, 0, deep.Ino, 2, d.Ino, 2)
}

// testPolicyNotRetroactive checks that changing or clearing a directory's
// policy leaves the inodes created before it alone.
func testPolicyNotRetroactive(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	before := v.create(d.Ino, "before", meta.TypeRegular)
	beforeDir := v.create(d.Ino, "before-dir", meta.TypeDirectory)
	v.setPolicy(d.Ino, 3)
	v.wantPolicy("created before any policy", before.Ino, 0, beforeDir.Ino, 0)
	inBefore := v.create(beforeDir.Ino, "f", meta.TypeRegular)
	v.wantPolicy("child of a directory created before the policy", inBefore.Ino, 0)

	three := v.create(d.Ino, "three", meta.TypeRegular)
	threeDir := v.create(d.Ino, "three-dir", meta.TypeDirectory)
	v.setPolicy(d.Ino, 1)
	one := v.create(d.Ino, "one", meta.TypeRegular)
	v.setPolicy(d.Ino, 0)
	zero := v.create(d.Ino, "zero", meta.TypeRegular)
	inThreeDir := v.create(threeDir.Ino, "f", meta.TypeRegular)
	v.wantPolicy("each keeps the policy of its creation",
		before.Ino, 0, three.Ino, 3, threeDir.Ino, 3, one.Ino, 1, zero.Ino, 0, inThreeDir.Ino, 3, d.Ino, 0)
}

// testPolicyLinkRename checks that Link and Rename move names, not
// policies.
func testPolicyLinkRename(t *testing.T, v *env) {
	two := v.create(meta.RootIno, "two", meta.TypeDirectory)
	three := v.create(meta.RootIno, "three", meta.TypeDirectory)
	v.setPolicy(two.Ino, 2)
	v.setPolicy(three.Ino, 3)
	f := v.create(two.Ino, "f", meta.TypeRegular)
	sub := v.create(two.Ino, "sub", meta.TypeDirectory)
	plain := v.create(meta.RootIno, "plain", meta.TypeRegular)

	if _, _, err := v.e.Link(v.ctx, f.Ino, three.Ino, "f-link", v.tick()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.e.Link(v.ctx, plain.Ino, three.Ino, "plain-link", v.tick()); err != nil {
		t.Fatal(err)
	}
	for _, mv := range []struct {
		from meta.Ino
		name string
	}{{two.Ino, "f"}, {two.Ino, "sub"}, {meta.RootIno, "plain"}} {
		if _, err := v.e.Rename(v.ctx, mv.from, mv.name, three.Ino, mv.name, v.tick()); err != nil {
			t.Fatal(err)
		}
	}
	v.wantPolicy("after link and rename", f.Ino, 2, sub.Ino, 2, plain.Ino, 0)
	// A moved directory passes on its own policy, not its new parent's.
	in := v.create(sub.Ino, "in", meta.TypeRegular)
	v.wantPolicy("created in a moved directory", in.Ino, 2)
	// Replacing a file by rename leaves the survivor's policy alone.
	g := v.create(three.Ino, "g", meta.TypeRegular)
	if _, err := v.e.Rename(v.ctx, three.Ino, "plain", three.Ino, "g", v.tick()); err != nil {
		t.Fatal(err)
	}
	v.wantPolicy("rename over a file", plain.Ino, 0)
	v.freeOrphan(g.Ino)
}

// testPolicyDeleted checks that the record goes with its inode, however
// the inode goes: rmdir, rename over an empty directory, and FreeOrphan
// of a regular file (an orphan keeps its policy until then, as it keeps
// its stripe map). Inode numbers are never reused, so the public API can
// only show that the inode is gone and that fresh inodes start clean;
// the engine's own tests check that no record is left in the store.
func testPolicyDeleted(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	v.setPolicy(d.Ino, 3)
	rmdir := v.create(d.Ino, "rmdir", meta.TypeDirectory)
	victim := v.create(d.Ino, "victim", meta.TypeDirectory)
	mover := v.create(d.Ino, "mover", meta.TypeDirectory)
	f := v.create(d.Ino, "f", meta.TypeRegular)
	v.setPolicy(rmdir.Ino, 2)
	v.wantPolicy("before", rmdir.Ino, 2, victim.Ino, 3, mover.Ino, 3, f.Ino, 3)

	if _, _, err := v.e.Remove(v.ctx, d.Ino, "rmdir", v.tick()); err != nil {
		t.Fatal(err)
	}
	if _, err := v.e.Rename(v.ctx, d.Ino, "mover", d.Ino, "victim", v.tick()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.e.Remove(v.ctx, d.Ino, "f", v.tick()); err != nil {
		t.Fatal(err)
	}
	v.wantPolicy("orphan", f.Ino, 3, mover.Ino, 3)
	v.freeOrphan(f.Ino)
	v.reopen()
	for _, ino := range []meta.Ino{rmdir.Ino, victim.Ino, f.Ino} {
		_, err := v.e.Policy(v.ctx, ino)
		wantErr(t, fmt.Sprintf("policy of deleted inode %d", ino), err, meta.ErrStale)
		err = v.e.SetPolicy(v.ctx, ino, meta.Policy{Mirrors: 1})
		wantErr(t, fmt.Sprintf("set policy of deleted inode %d", ino), err, meta.ErrStale)
	}
	// Fresh inodes, wherever they are created, carry only what their
	// parent holds now.
	v.setPolicy(d.Ino, 0)
	fresh := []meta.Node{
		v.create(meta.RootIno, "fresh-dir", meta.TypeDirectory),
		v.create(meta.RootIno, "fresh-file", meta.TypeRegular),
		v.create(d.Ino, "rmdir", meta.TypeDirectory),
		v.create(d.Ino, "f", meta.TypeRegular),
	}
	for _, n := range fresh {
		if n.Ino <= f.Ino {
			t.Fatalf("inode %d reused", n.Ino)
		}
		v.wantPolicy("fresh inode", n.Ino, 0)
	}
	v.wantPolicy("survivor", mover.Ino, 3)
}

// testPolicyConcurrent races creates in a directory with changes of its
// policy (for the race detector, and for engines that retry or batch
// transactions): no call fails, every file holds a valid policy, and a
// create that starts after SetPolicy returned sees the new policy.
func testPolicyConcurrent(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	const creators, each = 4, 6
	var wg sync.WaitGroup
	inos := make([][]meta.Ino, creators)
	errs := make([]error, creators)
	for c := range creators {
		wg.Go(func() {
			for i := range each {
				n, _, err := v.e.Create(v.ctx, d.Ino, fmt.Sprintf("c%d-%d", c, i), meta.CreateArgs{Type: meta.TypeRegular}, v.now)
				if err != nil {
					errs[c] = err
					return
				}
				inos[c] = append(inos[c], n.Ino)
			}
		})
	}
	for m := range 2 * meta.MaxMirrors {
		if err := v.e.SetPolicy(v.ctx, d.Ino, meta.Policy{Mirrors: m % (meta.MaxMirrors + 1)}); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
	for c := range creators {
		if errs[c] != nil {
			t.Fatal(errs[c])
		}
		for _, ino := range inos[c] {
			if p := v.policy(ino); p.Mirrors < 0 || p.Mirrors > meta.MaxMirrors {
				t.Fatalf("inode %d has policy %+v", ino, p)
			}
		}
	}
	v.setPolicy(d.Ino, 2)
	v.wantPolicy("created after the last change", v.create(d.Ino, "last", meta.TypeRegular).Ino, 2)
}

// testPolicyLayout checks a policy's layout type: set with or without
// mirrors, copied to new files and directories at any depth and kept by
// them when the directory changes, validated; and LayoutsBelow, which
// stays on the directory it is set on and is not copied.
func testPolicyLayout(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	before := v.create(d.Ino, "before", meta.TypeRegular)
	flex := meta.Policy{Layout: meta.LayoutFlexFiles}
	set := func(ino meta.Ino, p meta.Policy) {
		t.Helper()
		if err := v.e.SetPolicy(v.ctx, ino, p); err != nil {
			t.Fatalf("SetPolicy %d %+v: %v", ino, p, err)
		}
	}
	want := func(what string, ino meta.Ino, p meta.Policy) {
		t.Helper()
		if got := v.policy(ino); got != p {
			t.Fatalf("%s: policy of %d = %+v, want %+v", what, ino, got, p)
		}
	}
	set(d.Ino, flex)
	below := meta.LayoutSet(0).With(meta.LayoutFlexFiles)
	set(meta.RootIno, meta.Policy{Mirrors: 2, LayoutsBelow: below})
	want("layout alone", d.Ino, flex)
	want("layouts below", meta.RootIno, meta.Policy{Mirrors: 2, LayoutsBelow: below})
	want("created before", before.Ino, meta.Policy{})

	f := v.create(d.Ino, "f", meta.TypeRegular)
	sub := v.create(d.Ino, "sub", meta.TypeDirectory)
	deep := v.create(sub.Ino, "f", meta.TypeRegular)
	l := v.create(d.Ino, "l", meta.TypeSymlink)
	top := v.create(meta.RootIno, "top", meta.TypeRegular)
	topDir := v.create(meta.RootIno, "top-dir", meta.TypeDirectory)
	for _, ino := range []meta.Ino{f.Ino, sub.Ino, deep.Ino} {
		want("inherited", ino, flex)
	}
	want("symlink", l.Ino, meta.Policy{})
	// The root's mirrors are copied, its LayoutsBelow is not.
	want("child of the root", top.Ino, meta.Policy{Mirrors: 2})
	want("subdirectory of the root", topDir.Ino, meta.Policy{Mirrors: 2})

	// Files keep the type of their creation; the directory changes.
	both := meta.Policy{Mirrors: 3, Layout: meta.LayoutFiles}
	set(d.Ino, both)
	g := v.create(d.Ino, "g", meta.TypeRegular)
	set(d.Ino, meta.Policy{})
	h := v.create(d.Ino, "h", meta.TypeRegular)
	v.reopen()
	want("files keep their type", f.Ino, flex)
	want("mirrors and layout", g.Ino, both)
	want("cleared", h.Ino, meta.Policy{})
	want("cleared directory", d.Ino, meta.Policy{})
	want("subdirectory keeps its copy", sub.Ino, flex)

	for _, bad := range []meta.Policy{{Layout: 3}, {Layout: 0xff}, {LayoutsBelow: 1}, {LayoutsBelow: 0x80}} {
		err := v.e.SetPolicy(v.ctx, sub.Ino, bad)
		wantErr(t, fmt.Sprintf("SetPolicy %+v", bad), err, meta.ErrInval)
	}
	want("after refusals", sub.Ino, flex)
	err := v.e.SetPolicy(v.ctx, f.Ino, flex)
	wantErr(t, "SetPolicy of a file", err, meta.ErrNotDir)
}
