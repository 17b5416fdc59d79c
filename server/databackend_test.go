package server

import "github.com/shoalfs/shoal/store"

// DataBackend returns the store.Backend the server keeps file data in: on
// a pNFS metadata server with inline data on, the inline store in front
// of the data servers. Tests of package server_test run the backend
// conformance suite on it (conformance_test.go).
func (s *Server) DataBackend() store.Backend { return s.data }
