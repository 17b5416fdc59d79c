package server

// The releaseArgs mark of an operation's declaration (optable.go) says
// that its handler provably keeps no reference to its decoded arguments'
// bytes once the COMPOUND's reply has been written. A COMPOUND that
// decodes only such operations lets the RPC layer recycle its record
// buffer (rpc.Call.ReleaseArgsAfterReply), which is what keeps a 1 MiB
// WRITE from costing a fresh, page-faulted 1 MiB allocation.
//
// Decoded arguments alias the record only through their []byte fields
// (opaques, utf8 strings, filehandles); integers, fixed-size arrays
// (session ids, stateids, verifiers) and bitmaps ([]uint32) are copies. The
// audit, op by op — re-check it whenever one of these handlers changes:
//
//   - SEQUENCE: session id, slot and sequence ids are values. The slot's
//     reply cache stores BytesSince, a copy of the encoded reply, so even
//     spliced (OpaqueRef) argument bytes would not be cached by reference.
//   - PUTFH: fhCodec.decode (and dsPutFH) parse the handle into the fhandle
//     value struct and verify its MAC; the current and saved filehandles
//     hold only that struct. No state records the raw handle.
//   - PUTROOTFH, GETFH, SAVEFH, RESTOREFH: no arguments.
//   - GETATTR: the attribute request is a []uint32 bitmap (decoded into
//     fresh memory), used while encoding the reply.
//   - READ (read and dsRead, through readData): stateid and integers. The
//     data buffer it splices into the reply is the server's own
//     (readPool), not the request's.
//   - WRITE (write and dsWrite): the payload is passed to
//     store.File.WriteAt, which as an io.WriterAt must not retain it:
//     store.Local pwrites it, the striped cluster backend sends it with a
//     synchronous OBJ_WRITE whose writev completes before WriteAt returns,
//     on every data server, even on errors (parallel waits for all
//     stripes), and a data server's cluster.ReplicaStore waits for every
//     peer's REPLICA_WRITE the same way. The inode cache records only
//     sizes and times; the stateid is a value (dsCheckIO copies it into
//     the control protocol's request).
//   - COMMIT (commit and dsCommit): integers.
//
// Everything else — OPEN and LOCK (owners), EXCHANGE_ID (client names),
// LAYOUT* (layout bodies), names in LOOKUP/CREATE/RENAME, SETATTR and
// VERIFY (fattr4 values), xattrs, CREATE_SESSION — is left unmarked without
// auditing, as are operations added later: a missing mark costs an
// allocation, a wrong one corrupts data. TestArgsNotRetainedAudit pins the
// marked set and the byte fields of their arguments.
