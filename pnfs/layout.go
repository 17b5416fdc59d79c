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

// FlexLayout is a file's flexible files layout (RFC 8435) as the MDS
// hands it out in LAYOUTGET: Mirrors[j] lists, by stripe index, the
// device (one data server) that holds mirror j's copy of the units at
// that index; stripe index i holds the units k with k mod len(Mirrors[j])
// == i, each Unit bytes. Every mirror has the same number of stripe
// indexes. A client writes every mirror and reads any.
type FlexLayout struct {
	Unit    uint64
	Mirrors [][][16]byte
	// Staled lists the data servers whose copies of the file were
	// marked stale in making a layout for writing, because they were
	// out of service and the layout leaves them out.
	Staled []string
}
