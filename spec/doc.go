// Package spec holds the XDR descriptions of the protocols Shoal speaks:
// nfs4.x for NFSv4.1/4.2 (RFC 5662, RFC 7863, plus the RFC 8276 extended
// attribute and RFC 8275 umask extensions) with its callback program, and
// flexfiles.x for the RFC 8435 flexible file layout, and nfs3.x for the
// part of NFSv3 and MOUNT v3 (RFC 1813) the metadata server calls on
// loosely coupled flexfiles data servers (generated into internal/nfs3).
//
// The Go types in internal/nfs4 are generated from these files by
// tools/xdrgen (go generate ./internal/nfs4), so the .x files are the single
// source of truth for every wire format: a wrong number here becomes a wrong
// number on the wire everywhere. The files keep the RFCs' identifiers
// exactly, because generated Go names are derived from them mechanically.
//
// The package has no Go API. Its tests parse the .x text with regular
// expressions, independently of the generator, and check the protocol
// numbers that matter most against the values published in the RFCs, the
// completeness of the status and attribute numbering, and the union arm and
// field names that hand-written code depends on.
package spec
