package server

import "bytes"

// DataFHKey returns the key that data servers use to verify data
// filehandles (the ones in file layouts): HMAC-SHA256 of the MDS's master
// filehandle secret with a fixed label. Hand this, not ClusterSecret, to
// data servers (DataServerConfig.Secret): it authenticates data handles
// only, so a data server, or anyone who registers as one, cannot mint
// handles for the MDS's files and directories. It is nil on a data server.
func (s *Server) DataFHKey() []byte {
	return bytes.Clone(s.fh.dataKey)
}

// encodeFH encodes a filehandle for a client (GETFH, FATTR4_FILEHANDLE). A
// data server has no codec of its own: it signs with the data key it got
// from its metadata server, so it returns the handle the client gave it.
func (c *compound) encodeFH(h fhandle) []byte {
	if c.s.ds != nil {
		codec := newDataFHCodec(c.s.ds.Secret())
		return codec.encode(h)
	}
	return c.s.fh.encode(h)
}
