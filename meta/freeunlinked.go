package meta

import "context"

// FreeUnlinked asks Remove to delete a regular file's inode in the
// transaction that drops its last link, instead of keeping it as an
// orphan for the caller to free later (see Engine.Remove). The caller
// uses it when it knows that nobody holds the file open and that the
// file has no data outside the engine to remove first: the NFS server
// for a removed file that never had data, which then costs one
// transaction instead of two (server/orphans.go).
//
// Ino is the inode the caller checked: the entry must still name it when
// the transaction runs (a rename may have put another file under the
// name since the caller looked it up), or Remove keeps the orphan as
// usual. Freed is set by the engine when it deleted the inode.
type FreeUnlinked struct {
	Ino   Ino
	Freed bool
}

type freeUnlinkedKey struct{}

// WithFreeUnlinked returns a context that makes the next Remove called
// with it free f.Ino (see FreeUnlinked). Other methods ignore it.
func WithFreeUnlinked(ctx context.Context, f *FreeUnlinked) context.Context {
	return context.WithValue(ctx, freeUnlinkedKey{}, f)
}

func freeUnlinkedFrom(ctx context.Context) *FreeUnlinked {
	if ctx == nil {
		return nil
	}
	f, _ := ctx.Value(freeUnlinkedKey{}).(*FreeUnlinked)
	return f
}
