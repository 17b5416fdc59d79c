// Package rpc implements ONC RPC version 2 (RFC 5531) over TCP for Shoal's
// NFSv4.1 server and client.
//
// # Connection model
//
// A [Conn] is symmetric and full-duplex. One reader goroutine splits the
// byte stream into records and looks at each message type: a REPLY is
// handed to the outgoing call ([Conn.Call]) waiting for its xid, a CALL is
// served by the connection's [Handler] in a goroutine of its own. Writes of
// whole records are serialized by a mutex, each as one writev of record mark,
// header and body, so replies may leave in any order and interleave with
// outgoing calls.
//
// Because both directions share one type, the NFSv4.1 backchannel needs no
// extra machinery: a server handler that wants to send CB_RECALL calls
// [Conn.Call] on the Call.Conn the client's requests arrive on, and the
// client, which dialed with a Handler, serves the callback on the same
// socket. [Conn.SetValue] lets the server attach its session to a
// connection, [Conn.Pin] keeps a bound backchannel from being closed as idle,
// and [Server.ConnState] tells the server when to unbind it.
//
// # Memory bounds
//
// An incoming record may not exceed MaxRecord; a larger record mark (such as
// a 2 or 4 GiB length) closes the connection before anything is allocated.
// At most MaxInFlight calls per connection are served at once; when they are
// all busy the reader stops reading, TCP flow control pushes back on the
// peer, and a connection therefore never holds more than about
// (MaxInFlight+1) × (MaxRecord+4 KiB) bytes of requests (the 4 KiB is the
// slack of a pooled buffer, below). A consequence: a handler
// that waits for a backchannel reply on its own connection occupies a slot
// while it waits, and if every slot does so the reply cannot be read. NFSv4.1
// session slot tables keep fore-channel concurrency below MaxInFlight, and the
// server sends callbacks asynchronously, so this does not arise in Shoal.
//
// # Aliasing
//
// Each record is read into a buffer of its own that the reader never
// touches again. Call.Args and the results returned by [Conn.Call] alias
// that buffer, so decoders may return sub-slices (XDR opaques, WRITE
// payloads) and keep them without copying, and by default the memory is
// freed when the last reference goes. In the other direction a handler may
// splice caller-owned slices into its reply with xdr.Encoder.OpaqueRef (READ
// data); they are written with writev without being copied and must stay
// unchanged until the reply is written, which [Call.AfterReply] reports.
//
// # Buffer reuse
//
// Allocating a fresh buffer for every 1 MiB WRITE costs more than the
// allocation: the Go heap returns freed pages to the kernel, and the next
// record faults them back in zeroed. So records of 64 KiB and more are read
// into buffers from process-wide pools (size classes of 2^k + 4 KiB, emptied
// by garbage collection). A buffer goes back to its pool only when its
// owner says nothing references it any more, which is an explicit opt-in:
//
//   - A handler calls [Call.ReleaseArgsAfterReply] to declare that nothing
//     derived from the call's record (Args, Cred.Body, Verf.Body, decoded
//     opaques, anything they were handed to) is referenced once its reply
//     has been written and its AfterReply callbacks have returned. The
//     connection then recycles the buffer at that point. A handler that
//     does not declare it keeps the old guarantee: the buffer is never
//     reused and its slices may be kept forever. A handler that panics
//     never gets its buffer recycled.
//   - Records nobody sees (dropped or rejected calls, replies to unknown or
//     failed calls) are recycled by the connection.
//   - Results returned by [Conn.Call] and [Conn.CallBuffers] are never
//     recycled. [Conn.CallRelease] returns a release function with the
//     results; calling it declares that nothing references them any more
//     (for example once a READ payload has been copied to the caller's
//     buffer), and recycles the reply's buffer.
//
// Built with the rpcpoison tag (and always in this package's tests),
// released buffers are filled with 0xdb and checked for writes when they
// are reused, so a use after release shows up as corrupted data in
// end-to-end tests: go test -tags rpcpoison ./....
//
// # Failure handling
//
// Malformed input never panics and never reaches a handler: an unreadable
// xid drops the record, an unparseable header is answered GARBAGE_ARGS, a
// wrong RPC version RPC_MISMATCH, an unsupported or malformed credential
// AUTH_ERROR. A handler that panics is answered SYSTEM_ERR and logged. A
// failed write, a truncated record or an oversized record closes the
// connection; pending outgoing calls then fail with an error wrapping
// [ErrConnClosed], and handler contexts are cancelled.
package rpc
