package pcopy_test

import (
	"fmt"
	"testing"

	"github.com/shoalfs/shoal/internal/pcopy"
)

// BenchmarkCopy copies a 256 MiB tree (8 files of 32 MiB) from one
// in-process cluster to another, both with two data servers and pNFS on.
func BenchmarkCopy(b *testing.B) {
	const files, size = 8, 32 << 20
	src, _ := startCluster(b)
	dst, dcl := startCluster(b)
	tree := []node{{path: "d", typ: pcopy.TypeDir, perm: 0o755}}
	for i := range files {
		tree = append(tree, node{path: fmt.Sprintf("d/f%d", i), typ: pcopy.TypeFile, perm: 0o644, size: size})
	}
	makeTree(b, src, "/src", tree)
	ctx := testCtx(b)
	b.SetBytes(files * size)
	for i := 0; b.Loop(); i++ {
		dir := fmt.Sprintf("/dst%d", i)
		if _, err := pcopy.Copy(ctx, pcopy.Endpoint{FS: src, Path: "/src"}, pcopy.Endpoint{FS: dst, Path: dir}, pcopy.Options{Recursive: true}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := dcl.RemoveAll(ctx, dir); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
