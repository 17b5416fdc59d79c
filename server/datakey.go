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

// encodeFH encodes a filehandle for a client (GETFH, FATTR4_FILEHANDLE).
// Only the MDS hands out filehandles: a data server answers neither GETFH
// nor GETATTR (RFC 8881 §13.6).
func (c *compound) encodeFH(h fhandle) []byte {
	return c.s.fh.encode(h)
}
