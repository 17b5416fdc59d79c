package pnfs

// FileLayout is a file's files layout (RFC 8881 §13) as the MDS hands it
// out in LAYOUTGET: which device (a list of data servers, one per stripe
// index), and how the file's bytes are striped over it.
type FileLayout struct {
	Device [16]byte
	First  uint32 // nfl_first_stripe_index
	Unit   uint64
	Count  uint32 // stripe count: the device's data servers
}
