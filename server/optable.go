package server

import "github.com/shoalfs/shoal/internal/nfs4"

// role is a set of the server roles that answer an operation.
type role uint8

const (
	// roleMDS is a plain NFSv4.1/4.2 server or a pNFS metadata server.
	roleMDS role = 1 << iota
	// roleDS is a pNFS data server (NewDataServer). RFC 8881 §13.6: a
	// client uses sessions, PUTFH, READ, WRITE, COMMIT and GETATTR with
	// data servers; anything not marked for it is NFS4ERR_NOTSUPP there.
	roleDS

	allRoles = roleMDS | roleDS
)

// role returns the role this server plays.
func (s *Server) role() role {
	if s.ds != nil {
		return roleDS
	}
	return roleMDS
}

// sessionRule says where an operation may appear relative to SEQUENCE
// (RFC 8881 §2.6.3.1.1.8 and each operation's description in §18).
type sessionRule uint8

const (
	// inSession: only after SEQUENCE; as the first operation it is
	// NFS4ERR_OP_NOT_IN_SESSION.
	inSession sessionRule = iota
	// sessionless: allowed without SEQUENCE, but then as the only
	// operation of the COMPOUND (NFS4ERR_NOT_ONLY_OP otherwise).
	sessionless
	// sequenceOp: SEQUENCE itself, which must come first
	// (NFS4ERR_SEQUENCE_POS anywhere else). compoundRequest evaluates it:
	// it needs the rest of the request, and may answer from the reply
	// cache instead.
	sequenceOp
)

// opDef declares one operation: everything the dispatcher needs to know
// about it, in one place.
type opDef struct {
	// run evaluates the operation; nil means NFS4ERR_NOTSUPP (Shoal does
	// not implement it), except for SEQUENCE (see sequenceOp).
	run opHandler
	// minor is the first minor version that defines the operation; in
	// older ones its number is NFS4ERR_OP_ILLEGAL.
	minor uint32
	// roles are the server roles that answer it; the others say
	// NFS4ERR_NOTSUPP.
	roles role
	// session says where it may appear relative to SEQUENCE.
	session sessionRule
	// v40only marks NFSv4.0 operations, which a 4.1 server answers with
	// NFS4ERR_NOTSUPP wherever they appear (RFC 8881 §18).
	v40only bool
	// releaseArgs: the handler provably keeps no reference to its
	// decoded arguments' bytes once the reply is written, so the RPC
	// layer may recycle the request's buffer (see argsrelease.go for the
	// audit, and TestArgsNotRetainedAudit). Leave it false unless you
	// have audited the handler: a missing mark costs an allocation, a
	// wrong one corrupts data.
	releaseArgs bool
}

// opTable declares every operation number of NFSv4.1 and NFSv4.2, from
// OP_ACCESS to OP_REMOVEXATTR (TestOpTableComplete checks that none is
// missing). Numbers outside it are answered with OP_ILLEGAL.
var opTable = map[nfs4.NfsOpnum4]opDef{
	// Filehandles (ops_fh.go).
	nfs4.OP_PUTROOTFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.putRootFH() },
		minor: 1, roles: roleMDS, releaseArgs: true},
	nfs4.OP_PUTPUBFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.putRootFH() },
		minor: 1, roles: roleMDS},
	nfs4.OP_PUTFH: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.putFH(a.Opputfh) },
		minor: 1, roles: allRoles, releaseArgs: true},
	nfs4.OP_GETFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.getFH() },
		minor: 1, roles: allRoles, releaseArgs: true},
	nfs4.OP_SAVEFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.saveFH() },
		minor: 1, roles: roleMDS, releaseArgs: true},
	nfs4.OP_RESTOREFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.restoreFH() },
		minor: 1, roles: roleMDS, releaseArgs: true},
	nfs4.OP_LOOKUP: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.lookup(a.Oplookup) },
		minor: 1, roles: roleMDS},
	nfs4.OP_LOOKUPP: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.lookupp() },
		minor: 1, roles: roleMDS},
	nfs4.OP_SECINFO: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.secinfo(a.Opsecinfo) },
		minor: 1, roles: roleMDS},
	nfs4.OP_SECINFO_NO_NAME: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.secinfoNoName(a.OpsecinfoNoName) },
		minor: 1, roles: allRoles},

	// Attributes (ops_attr.go).
	nfs4.OP_GETATTR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.getattr(a.Opgetattr) },
		minor: 1, roles: allRoles, releaseArgs: true},
	nfs4.OP_SETATTR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.setattr(a.Opsetattr) },
		minor: 1, roles: roleMDS},
	nfs4.OP_VERIFY: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.verify(&a.Opverify.ObjAttributes, false) },
		minor: 1, roles: roleMDS},
	nfs4.OP_NVERIFY: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.verify(&a.Opnverify.ObjAttributes, true) },
		minor: 1, roles: roleMDS},
	nfs4.OP_ACCESS: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.access(a.Opaccess) },
		minor: 1, roles: roleMDS},

	// Namespace (ops_ns.go).
	nfs4.OP_CREATE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.create(a.Opcreate) },
		minor: 1, roles: roleMDS},
	nfs4.OP_REMOVE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.remove(a.Opremove) },
		minor: 1, roles: roleMDS},
	nfs4.OP_RENAME: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.rename(a.Oprename) },
		minor: 1, roles: roleMDS},
	nfs4.OP_LINK: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.link(a.Oplink) },
		minor: 1, roles: roleMDS},
	nfs4.OP_READLINK: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.readlink() },
		minor: 1, roles: roleMDS},
	nfs4.OP_READDIR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.readdir(a.Opreaddir) },
		minor: 1, roles: roleMDS},
	nfs4.OP_OPENATTR: {minor: 1, roles: roleMDS}, // named attributes: not supported

	// Data (ops_io.go, ops_42.go).
	nfs4.OP_READ: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.read(a.Opread) },
		minor: 1, roles: allRoles, releaseArgs: true},
	nfs4.OP_WRITE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.write(a.Opwrite) },
		minor: 1, roles: allRoles, releaseArgs: true},
	nfs4.OP_COMMIT: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.commit(a.Opcommit) },
		minor: 1, roles: allRoles, releaseArgs: true},
	// READ_PLUS on a data server too: the Linux client sends it there
	// when the MDS takes it (and falls back to READ on NFS4ERR_NOTSUPP).
	nfs4.OP_READ_PLUS: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.readPlus(a.OpreadPlus) },
		minor: 2, roles: allRoles},
	nfs4.OP_SEEK: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.seek(a.Opseek) },
		minor: 2, roles: roleMDS},
	nfs4.OP_ALLOCATE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.allocate(a.Opallocate) },
		minor: 2, roles: roleMDS},
	nfs4.OP_DEALLOCATE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.deallocate(a.Opdeallocate) },
		minor: 2, roles: roleMDS},
	// Server-side copy (ops_copy.go); COPY_NOTIFY is for inter-server
	// copies, which Shoal does not do.
	nfs4.OP_COPY: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.copy(a.Opcopy) },
		minor: 2, roles: roleMDS},
	nfs4.OP_CLONE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.clone(a.Opclone) },
		minor: 2, roles: roleMDS},
	nfs4.OP_OFFLOAD_STATUS: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.offloadStatus(a.OpoffloadStatus) },
		minor: 2, roles: roleMDS},
	nfs4.OP_OFFLOAD_CANCEL: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.offloadCancel(a.OpoffloadCancel) },
		minor: 2, roles: roleMDS},
	nfs4.OP_COPY_NOTIFY: {minor: 2, roles: roleMDS}, // not supported
	nfs4.OP_IO_ADVISE:   {minor: 2, roles: roleMDS}, // not supported
	nfs4.OP_WRITE_SAME:  {minor: 2, roles: roleMDS}, // not supported

	// Extended attributes (RFC 8276; ops_xattr.go).
	nfs4.OP_GETXATTR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.getxattr(a.Opgetxattr) },
		minor: 2, roles: roleMDS},
	nfs4.OP_SETXATTR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.setxattr(a.Opsetxattr) },
		minor: 2, roles: roleMDS},
	nfs4.OP_LISTXATTRS: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.listxattrs(a.Oplistxattrs) },
		minor: 2, roles: roleMDS},
	nfs4.OP_REMOVEXATTR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.removexattr(a.Opremovexattr) },
		minor: 2, roles: roleMDS},

	// Opens, locks and stateids (ops_open.go, ops_lock.go).
	nfs4.OP_OPEN: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.open(a.Opopen) },
		minor: 1, roles: roleMDS},
	nfs4.OP_OPEN_DOWNGRADE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.openDowngrade(a.OpopenDowngrade) },
		minor: 1, roles: roleMDS},
	nfs4.OP_CLOSE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.close(a.Opclose) },
		minor: 1, roles: roleMDS},
	nfs4.OP_LOCK: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.lock(a.Oplock) },
		minor: 1, roles: roleMDS},
	nfs4.OP_LOCKT: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.lockt(a.Oplockt) },
		minor: 1, roles: roleMDS},
	nfs4.OP_LOCKU: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.locku(a.Oplocku) },
		minor: 1, roles: roleMDS},
	nfs4.OP_TEST_STATEID: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.testStateid(a.OptestStateid) },
		minor: 1, roles: roleMDS},
	nfs4.OP_FREE_STATEID: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.freeStateid(a.OpfreeStateid) },
		minor: 1, roles: roleMDS},

	// Delegations (deleg.go).
	nfs4.OP_DELEGRETURN: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.delegReturn(a.Opdelegreturn) },
		minor: 1, roles: roleMDS},
	nfs4.OP_DELEGPURGE:         {minor: 1, roles: roleMDS}, // not supported (no CLAIM_DELEGATE_PREV)
	nfs4.OP_GET_DIR_DELEGATION: {minor: 1, roles: roleMDS}, // not supported
	nfs4.OP_WANT_DELEGATION: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.wantDelegation(a.OpwantDelegation) },
		minor: 1, roles: roleMDS},

	// pNFS (ops_layout.go; the handlers refuse on a server without pNFS).
	nfs4.OP_LAYOUTGET: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutGet(a.Oplayoutget) },
		minor: 1, roles: roleMDS},
	nfs4.OP_GETDEVICEINFO: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.getDeviceInfo(a.Opgetdeviceinfo) },
		minor: 1, roles: roleMDS},
	nfs4.OP_GETDEVICELIST: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.getDeviceList(a.Opgetdevicelist) },
		minor: 1, roles: roleMDS},
	nfs4.OP_LAYOUTCOMMIT: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutCommit(a.Oplayoutcommit) },
		minor: 1, roles: roleMDS},
	nfs4.OP_LAYOUTRETURN: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutReturn(a.Oplayoutreturn) },
		minor: 1, roles: roleMDS},
	nfs4.OP_LAYOUTERROR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutError(a.Oplayouterror) },
		minor: 2, roles: roleMDS},
	nfs4.OP_LAYOUTSTATS: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutStats(a.Oplayoutstats) },
		minor: 2, roles: roleMDS},

	// Client IDs and sessions (ops_session.go).
	nfs4.OP_SEQUENCE: {session: sequenceOp, minor: 1, roles: allRoles, releaseArgs: true},
	nfs4.OP_EXCHANGE_ID: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.exchangeID(a.OpexchangeId) },
		minor: 1, roles: allRoles, session: sessionless},
	nfs4.OP_CREATE_SESSION: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.createSession(a.OpcreateSession) },
		minor: 1, roles: allRoles, session: sessionless},
	nfs4.OP_DESTROY_SESSION: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.destroySession(a.OpdestroySession) },
		minor: 1, roles: allRoles, session: sessionless},
	nfs4.OP_BIND_CONN_TO_SESSION: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.bindConn(a.OpbindConnToSession) },
		minor: 1, roles: allRoles, session: sessionless},
	nfs4.OP_DESTROY_CLIENTID: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.destroyClientID(a.OpdestroyClientid) },
		minor: 1, roles: allRoles, session: sessionless},
	nfs4.OP_RECLAIM_COMPLETE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.reclaimComplete(a.OpreclaimComplete) },
		minor: 1, roles: allRoles},
	nfs4.OP_BACKCHANNEL_CTL: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.backchannelCtl(a.OpbackchannelCtl) },
		minor: 1, roles: allRoles},
	nfs4.OP_SET_SSV: {minor: 1, roles: roleMDS}, // not supported (SP4_NONE only)

	// NFSv4.0 only (RFC 8881 §18: NFS4ERR_NOTSUPP in 4.1 and later).
	nfs4.OP_OPEN_CONFIRM:        {minor: 1, roles: allRoles, v40only: true},
	nfs4.OP_RENEW:               {minor: 1, roles: allRoles, v40only: true},
	nfs4.OP_SETCLIENTID:         {minor: 1, roles: allRoles, v40only: true},
	nfs4.OP_SETCLIENTID_CONFIRM: {minor: 1, roles: allRoles, v40only: true},
	nfs4.OP_RELEASE_LOCKOWNER:   {minor: 1, roles: allRoles, v40only: true},
}

// lookupOp returns the declaration of op in minor version minor; false for
// numbers the minor version does not define (OP_ILLEGAL).
func lookupOp(op nfs4.NfsOpnum4, minor uint32) (opDef, bool) {
	d, ok := opTable[op]
	if !ok || minor < d.minor {
		return opDef{}, false
	}
	return d, true
}
