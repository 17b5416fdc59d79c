package server

import (
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server/internal/state"
)

// Session channel limits (RFC 8881 §2.10.6.4, §18.36.3). The sizes of
// channel_attrs4 count the whole RPC message without the record mark:
// header, credential and verifier, and the COMPOUND. CREATE_SESSION
// refuses limits too small to carry the smallest message either side must
// be able to send (NFS4ERR_TOOSMALL); after that the fore channel limits
// the server granted are enforced on every COMPOUND that begins with
// SEQUENCE: NFS4ERR_REQ_TOO_BIG (on SEQUENCE, leaving the slot alone) for
// a request over ca_maxrequestsize, NFS4ERR_REP_TOO_BIG on the operation
// whose result would take the reply over ca_maxresponsesize, and
// NFS4ERR_REP_TOO_BIG_TO_CACHE on the one that would take a reply the
// client asked to cache (sa_cachethis) over ca_maxresponsesize_cached.

const (
	// rpcReplyHeader is an accepted RPC reply's header with the AUTH_NONE
	// verifier the server always sends: xid, REPLY, MSG_ACCEPTED,
	// verifier flavor and length, accept_stat.
	rpcReplyHeader = 6 * 4
	// opStatusSize is an operation result carrying only its status:
	// the operation number and the status.
	opStatusSize = 2 * 4
)

// createSessionFlags are the csa_flags RFC 8881 defines.
const createSessionFlags = nfs4.CREATE_SESSION4_FLAG_PERSIST | nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN |
	nfs4.CREATE_SESSION4_FLAG_CONN_RDMA

// callSize is the size of an RPC call message with credential cred and
// arguments of n bytes.
func callSize(cred, verf []byte, n int) int {
	// xid, CALL, rpcvers, prog, vers, proc; credential and verifier
	// (flavor, length, padded body).
	return 6*4 + 8 + pad4(len(cred)) + 8 + pad4(len(verf)) + n
}

func pad4(n int) int { return (n + 3) &^ 3 }

// requestSize is the size of c's RPC call message (ca_maxrequestsize
// counts it all).
func (c *compound) requestSize() int {
	return callSize(c.call.Cred.Body, c.call.Verf.Body, len(c.call.Args))
}

var (
	// minForeRequest is the smallest fore channel request: a COMPOUND of
	// SEQUENCE alone under AUTH_NONE.
	minForeRequest = callSize(nil, nil, len(xdr.Marshal(&nfs4.COMPOUND4args{Minorversion: 1,
		Argarray: []nfs4.NfsArgop4{{Argop: nfs4.OP_SEQUENCE, Opsequence: &nfs4.SEQUENCE4args{}}}})))
	// minForeResponse is the reply to it.
	minForeResponse = rpcReplyHeader + len(xdr.Marshal(&nfs4.COMPOUND4res{
		Resarray: []nfs4.NfsResop4{{Resop: nfs4.OP_SEQUENCE, Opsequence: &nfs4.SEQUENCE4res{SrResok4: &nfs4.SEQUENCE4resok{}}}}}))
	// maxCallback is the largest CB_COMPOUND the server sends (without
	// its credential): CB_SEQUENCE and a CB_LAYOUTRECALL of a file by a
	// filehandle of the largest size.
	maxCallback = len(xdr.Marshal(&nfs4.CBCOMPOUND4args{Minorversion: 2, Argarray: []nfs4.NfsCbArgop4{
		{Argop: nfs4.OP_CB_SEQUENCE, Opcbsequence: &nfs4.CBSEQUENCE4args{}},
		{Argop: nfs4.OP_CB_LAYOUTRECALL, Opcblayoutrecall: &nfs4.CBLAYOUTRECALL4args{
			CloraRecall: nfs4.Layoutrecall4{LorRecalltype: nfs4.LAYOUTRECALL4_FILE, LorLayout: &nfs4.LayoutrecallFile4{
				LorFh: make([]byte, nfs4.NFS4_FHSIZE)}}}},
	}}))
	// maxCallbackReply is the client's reply to it.
	maxCallbackReply = rpcReplyHeader + len(xdr.Marshal(&nfs4.CBCOMPOUND4res{Resarray: []nfs4.NfsCbResop4{
		{Resop: nfs4.OP_CB_SEQUENCE, Opcbsequence: &nfs4.CBSEQUENCE4res{CsrResok4: &nfs4.CBSEQUENCE4resok{}}},
		{Resop: nfs4.OP_CB_LAYOUTRECALL, Opcblayoutrecall: &nfs4.CBLAYOUTRECALL4res{}},
	}}))
)

// foreChannel is the fore channel the client asks for; the state manager
// lowers it to the server's limits (state.negotiate) and never raises it.
// In particular ca_maxresponsesize_cached is never more than asked, however
// small: RFC 8881 §18.36.3 says of it "For each channel, the server MAY
// decrease this value, but MUST NOT increase it", and a client that sets
// sa_cachethis on a request whose reply would not fit gets
// NFS4ERR_REP_TOO_BIG_TO_CACHE (pynfs CSESS27). The Linux client asks for
// room for its largest OPEN reply (encode_create_session in
// fs/nfs/nfs4xdr.c); Linux nfsd grants at most about 2 KiB and answers the
// same error past it.
func foreChannel(a *nfs4.ChannelAttrs4) state.ChannelAttrs {
	return channelFrom(a)
}

// maxCallbackOps is the most operations the server puts in a CB_COMPOUND.
const maxCallbackOps = 2

// checkChannels validates CREATE_SESSION's flags and channel attributes
// before any state changes. cbCred is the credential callbacks will carry.
func checkChannels(a *nfs4.CREATESESSION4args, cbCred rpc.OpaqueAuth) nfs4.Nfsstat4 {
	if a.CsaFlags&^uint32(createSessionFlags) != 0 {
		return nfs4.NFS4ERR_INVAL
	}
	fore, back := &a.CsaForeChanAttrs, &a.CsaBackChanAttrs
	// Fore channel: the client must be able to send SEQUENCE and take
	// its reply; the server may lower every maximum (state.negotiate).
	if int64(fore.CaMaxrequestsize) < int64(minForeRequest) || int64(fore.CaMaxresponsesize) < int64(minForeResponse) ||
		fore.CaMaxoperations < 1 {
		return nfs4.NFS4ERR_TOOSMALL
	}
	// Back channel: the client must take the largest callback the
	// server sends, and be able to answer it.
	if int64(back.CaMaxrequestsize) < int64(callSize(cbCred.Body, nil, maxCallback)) ||
		int64(back.CaMaxresponsesize) < int64(maxCallbackReply) || back.CaMaxoperations < maxCallbackOps {
		return nfs4.NFS4ERR_TOOSMALL
	}
	return nfs4.NFS4_OK
}

// sequenceReplySize is the size of the reply to a COMPOUND with the given
// tag that ends after a successful SEQUENCE.
func sequenceReplySize(tag []byte) int { return minForeResponse + pad4(len(tag)) }

// sequenceOverLimit reports the status SEQUENCE returns, before it touches
// the slot, when the reply could not even carry SEQUENCE's own result
// within the session's limits (RFC 8881 §2.10.6.4: "If the reply exceeds
// ca_maxresponsesize_cached (and sa_cachethis or csa_cachethis is TRUE),
// then the server MUST return NFS4ERR_REP_TOO_BIG_TO_CACHE"; on SEQUENCE,
// no operation executed and the slot is unchanged), or NFS4_OK. Later
// operations are checked as their results are encoded (overLimit).
func sequenceOverLimit(fore state.ChannelAttrs, cacheThis bool, tag []byte) nfs4.Nfsstat4 {
	size := sequenceReplySize(tag)
	switch {
	case size > int(fore.MaxResponseSize):
		return nfs4.NFS4ERR_REP_TOO_BIG
	case cacheThis && size > int(fore.MaxResponseSizeCached):
		return nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE
	}
	return nfs4.NFS4_OK
}

// overLimit reports the status for an operation result that took the
// reply of a COMPOUND (size bytes from the COMPOUND4res on) over the
// session's limits, or NFS4_OK.
func (q *seqContext) overLimit(size int) nfs4.Nfsstat4 {
	fore := q.session.ForeAttrs()
	size += rpcReplyHeader
	switch {
	case size > int(fore.MaxResponseSize):
		return nfs4.NFS4ERR_REP_TOO_BIG
	case q.cacheThis && size > int(fore.MaxResponseSizeCached):
		return nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE
	}
	return nfs4.NFS4_OK
}
