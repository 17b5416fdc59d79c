package store

// Copier is the capability of a Backend that copies a range of one file's
// data to another file, or elsewhere in the same one, itself: the bytes
// never reach its caller (NFSv4.2 COPY and CLONE, RFC 7862 §15.2 and
// §15.13). Local copies in the kernel (copy_file_range(2), which shares
// blocks on file systems that can); cluster.Striped has each data server
// copy its own stripe units.
type Copier interface {
	// CopyRange makes [dstOff, dstOff+n) of dst's data equal to [srcOff,
	// srcOff+n) of src's, where src's bytes past the end of its data are
	// zeros (all of them if src has no data). dst's data is created if
	// needed and grows to the end of the last byte copied from src's
	// data, never further: the zeros past it are holes or past its end.
	// Overlapping ranges of one file are an error wrapping
	// fs.ErrInvalid. An error wrapping ErrNotSupported means this range
	// cannot be copied this way (the caller copies through its own
	// buffer); nothing was changed then. After another error the range
	// of dst is undefined.
	CopyRange(src, dst uint64, srcOff, dstOff, n int64) error
}
