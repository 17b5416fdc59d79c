// Package pnfs is the vocabulary that Shoal's pNFS metadata server (MDS)
// and data servers (DS) share across the control protocol: the verdicts on
// a stateid, the errors that say a server or the data on it cannot be
// reached, and the files layout of a file.
//
// It is a leaf: it imports nothing from Shoal, so that the NFS side
// (package server and its state manager, server/state) and the cluster
// side (package cluster) both sit above it and neither above the other.
// Each sentinel is declared here once. The state manager returns the
// stateid verdicts for the MDS's own clients; package cluster carries
// them, and the availability errors, between MDS and data servers (its
// wire statuses CTL_ERR_* map to and from them); package server maps
// every one of them to an NFS4ERR_* status in its one error table
// (server/errors.go), whose test checks that none is left out.
//
// Errors returned by Shoal's packages may wrap these sentinels with
// context: test for them with errors.Is.
package pnfs
