// Package serverhook is how the module's own wiring attaches extra ONC RPC
// programs to a server's listener, next to the NFS program, without the
// public configuration of package server naming internal types.
//
// A metadata server serves the control protocol (SHOAL_CONTROL,
// spec/control.x) to its data servers on the NFS port, and each data server
// serves its peers' replication calls there too. Both are internal/wiring's
// business, not something a user of package server configures: a public
// Config field of type map[uint32]rpc.Handler would put internal/rpc into
// server's API, where no caller outside the module could fill it anyway.
// So server.Config and server.DataServerConfig keep the programs in an
// unexported field, and this package is the one way to set it: a hook
// variable in an internal package, as in the standard library's
// internal/testlog (which package testing installs and package os
// consults). Package server installs [SetPrograms] in its init function,
// and internal/wiring calls it on a configuration before server.New or
// server.NewDataServer.
//
// The configuration travels as an any because this package cannot import
// package server (server imports it). A value of any other type than
// *server.Config or *server.DataServerConfig is a bug in this module, and
// SetPrograms panics on it.
package serverhook

import "github.com/shoalfs/shoal/internal/rpc"

// SetPrograms makes the server built from cfg, a *server.Config or a
// *server.DataServerConfig, hand every call to a program number in progs to
// that program's handler; calls to the NFS program stay the server's, and
// calls to any other program get PROG_UNAVAIL. It replaces the programs set
// before. Package server installs it in its init function, so it is set
// for any caller that holds a server configuration.
var SetPrograms func(cfg any, progs map[uint32]rpc.Handler)
