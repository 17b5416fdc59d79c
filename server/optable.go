package server

import "github.com/shoalfs/shoal/internal/nfs4"

// Roles. A Server plays one role, fixed when it is built, and the role is
// its operation table: New serves mdsOps (plainOps without data servers),
// NewDataServer serves dsOps. The COMPOUND and session machinery
// (compound.go, ops_session.go) is the core every role shares; the
// handlers a table names belong to its role, so a handler of one role is
// never reached on a server of another: the metadata engine, namespace
// and inline store that MDS handlers use are nil on a data server, and a
// data server's filehandle key and metadata-server callbacks (dataServer)
// are nil on an MDS.

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

// opDef declares one operation of one role: everything the dispatcher
// needs to know about it, in one place.
type opDef struct {
	// run evaluates the operation; nil means NFS4ERR_NOTSUPP (Shoal does
	// not implement it), except for SEQUENCE (see sequenceOp).
	run opHandler
	// session says where it may appear relative to SEQUENCE.
	session sessionRule
	// v40only marks NFSv4.0 operations, which a 4.1 server answers with
	// NFS4ERR_NOTSUPP wherever they appear (RFC 8881 §18).
	v40only bool
	// pnfs marks the operations of a pNFS metadata server (RFC 8881
	// §18.40–18.44, RFC 7862 §15.6–15.7): a server without data servers
	// answers them NFS4ERR_NOTSUPP (plainOps).
	pnfs bool
	// releaseArgs: the handler provably keeps no reference to its
	// decoded arguments' bytes once the reply is written, so the RPC
	// layer may recycle the request's buffer (see argsrelease.go for the
	// audit, and TestArgsNotRetainedAudit). Leave it false unless you
	// have audited the handler: a missing mark costs an allocation, a
	// wrong one corrupts data.
	releaseArgs bool
}

// opTable is one role's operations. An operation number the COMPOUND's
// minor version defines but the table does not declare is
// NFS4ERR_NOTSUPP (the zero opDef); a number it does not define is
// OP_ILLEGAL (lookup).
type opTable map[nfs4.NfsOpnum4]opDef

// opMinor returns the first minor version that defines op: NFSv4.1 took
// over operations 3 to 39 from 4.0 and added 40 to 58 (RFC 8881 §16.2.1;
// Shoal serves no 4.0), NFSv4.2 added 59 to 71 (RFC 7862 §11.1) and the
// extended attribute operations 72 to 75 (RFC 8276 §8). ok is false for
// any other number.
func opMinor(op nfs4.NfsOpnum4) (minor uint32, ok bool) {
	switch {
	case op >= nfs4.OP_ACCESS && op <= nfs4.OP_RECLAIM_COMPLETE:
		return 1, true
	case op >= nfs4.OP_ALLOCATE && op <= nfs4.OP_REMOVEXATTR:
		return 2, true
	}
	return 0, false
}

// lookup returns the declaration of op in minor version minor, the zero
// opDef (NFS4ERR_NOTSUPP) for an operation the role does not serve, and
// false for numbers the minor version does not define (OP_ILLEGAL).
func (t opTable) lookup(op nfs4.NfsOpnum4, minor uint32) (opDef, bool) {
	m, ok := opMinor(op)
	if !ok || minor < m {
		return opDef{}, false
	}
	return t[op], true
}

// join returns a table with the declarations of both; they must not
// overlap (one declaration per operation and role).
func join(a, b opTable) opTable {
	t := make(opTable, len(a)+len(b))
	for op, d := range a {
		t[op] = d
	}
	for op, d := range b {
		if _, dup := t[op]; dup {
			panic("server: operation " + op.String() + " declared twice for a role")
		}
		t[op] = d
	}
	return t
}

// withoutPNFS returns t with its pnfs operations unsupported.
func (t opTable) withoutPNFS() opTable {
	out := make(opTable, len(t))
	for op, d := range t {
		if d.pnfs {
			d = opDef{session: d.session}
		}
		out[op] = d
	}
	return out
}

var (
	// mdsOps are the operations of a pNFS metadata server: the shared
	// core and the MDS's own.
	mdsOps = join(coreOps, mdsOwnOps)
	// plainOps are those of a server without data servers (New without
	// Config.PNFS): no layouts.
	plainOps = mdsOps.withoutPNFS()
	// dsOps are those of a data server (NewDataServer): the shared core
	// and the I/O operations of RFC 8881 §13.6.
	dsOps = join(coreOps, dsOwnOps)
)

// coreOps are the operations every role answers alike: client IDs and
// sessions, RFC 8881 §13.6's "data-server housekeeping operations" less
// SECINFO_NO_NAME (which looks at the current filehandle, so each role
// has its own), plus RECLAIM_COMPLETE and the NFSv4.0 operations.
var coreOps = opTable{
	// Client IDs and sessions (ops_session.go).
	nfs4.OP_SEQUENCE: {session: sequenceOp, releaseArgs: true},
	nfs4.OP_EXCHANGE_ID: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.exchangeID(a.OpexchangeId) },
		session: sessionless},
	nfs4.OP_CREATE_SESSION: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.createSession(a.OpcreateSession) },
		session: sessionless},
	nfs4.OP_DESTROY_SESSION: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.destroySession(a.OpdestroySession) },
		session: sessionless},
	nfs4.OP_BIND_CONN_TO_SESSION: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.bindConn(a.OpbindConnToSession) },
		session: sessionless},
	nfs4.OP_DESTROY_CLIENTID: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.destroyClientID(a.OpdestroyClientid) },
		session: sessionless},
	nfs4.OP_BACKCHANNEL_CTL: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.backchannelCtl(a.OpbackchannelCtl) }},
	nfs4.OP_SET_SSV:         {}, // not supported (SP4_NONE only)
	// Not among §13.6's operations, but clients send it to data servers
	// too, right after CREATE_SESSION (Shoal's client.newSession fails
	// without it), and it has no effect beyond the client's own state.
	nfs4.OP_RECLAIM_COMPLETE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.reclaimComplete(a.OpreclaimComplete) }},

	// NFSv4.0 only (RFC 8881 §18: NFS4ERR_NOTSUPP in 4.1 and later).
	nfs4.OP_OPEN_CONFIRM:        {v40only: true},
	nfs4.OP_RENEW:               {v40only: true},
	nfs4.OP_SETCLIENTID:         {v40only: true},
	nfs4.OP_SETCLIENTID_CONFIRM: {v40only: true},
	nfs4.OP_RELEASE_LOCKOWNER:   {v40only: true},
}

// dsOwnOps are a data server's own operations (ds.go): RFC 8881 §13.6's
// "data-server I/O operations" PUTFH, READ, WRITE and COMMIT on the
// filehandles of layouts, and SECINFO_NO_NAME. Any other operation is
// NFS4ERR_NOTSUPP, as §13.6 requires of a server that is only a data
// server (EXCHGID4_FLAG_USE_PNFS_DS), with one exception: READ_PLUS.
var dsOwnOps = opTable{
	nfs4.OP_PUTFH: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.dsPutFH(a.Opputfh) },
		releaseArgs: true},
	nfs4.OP_SECINFO_NO_NAME: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.dsSecinfoNoName(a.OpsecinfoNoName) }},
	nfs4.OP_READ: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.dsRead(a.Opread) },
		releaseArgs: true},
	nfs4.OP_WRITE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.dsWrite(a.Opwrite) },
		releaseArgs: true},
	nfs4.OP_COMMIT: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.dsCommit(a.Opcommit) },
		releaseArgs: true},
	// NFSv4.2's READ, which §13.6 predates: the Linux client sends it to
	// a data server when the MDS takes it, and on NFS4ERR_NOTSUPP falls
	// back to READ for the whole mount, the MDS included.
	nfs4.OP_READ_PLUS: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.dsReadPlus(a.OpreadPlus) }},
}

// mdsOwnOps declares the rest of the operation numbers of NFSv4.1 and
// NFSv4.2, from OP_ACCESS to OP_REMOVEXATTR, for a plain server or
// metadata server (TestOpTableComplete checks that mdsOps misses none).
var mdsOwnOps = opTable{
	// Filehandles (ops_fh.go).
	nfs4.OP_PUTROOTFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.putRootFH() },
		releaseArgs: true},
	nfs4.OP_PUTPUBFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.putRootFH() }},
	nfs4.OP_PUTFH: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.putFH(a.Opputfh) },
		releaseArgs: true},
	nfs4.OP_GETFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.getFH() },
		releaseArgs: true},
	nfs4.OP_SAVEFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.saveFH() },
		releaseArgs: true},
	nfs4.OP_RESTOREFH: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.restoreFH() },
		releaseArgs: true},
	nfs4.OP_LOOKUP:          {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.lookup(a.Oplookup) }},
	nfs4.OP_LOOKUPP:         {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.lookupp() }},
	nfs4.OP_SECINFO:         {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.secinfo(a.Opsecinfo) }},
	nfs4.OP_SECINFO_NO_NAME: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.secinfoNoName(a.OpsecinfoNoName) }},

	// Attributes (ops_attr.go).
	nfs4.OP_GETATTR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.getattr(a.Opgetattr) },
		releaseArgs: true},
	nfs4.OP_SETATTR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.setattr(a.Opsetattr) }},
	nfs4.OP_VERIFY:  {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.verify(&a.Opverify.ObjAttributes, false) }},
	nfs4.OP_NVERIFY: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.verify(&a.Opnverify.ObjAttributes, true) }},
	nfs4.OP_ACCESS:  {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.access(a.Opaccess) }},

	// Namespace (ops_ns.go).
	nfs4.OP_CREATE:   {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.create(a.Opcreate) }},
	nfs4.OP_REMOVE:   {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.remove(a.Opremove) }},
	nfs4.OP_RENAME:   {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.rename(a.Oprename) }},
	nfs4.OP_LINK:     {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.link(a.Oplink) }},
	nfs4.OP_READLINK: {run: func(c *compound, _ *nfs4.NfsArgop4) opReply { return c.readlink() }},
	nfs4.OP_READDIR:  {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.readdir(a.Opreaddir) }},
	nfs4.OP_OPENATTR: {}, // named attributes: not supported

	// Data (ops_io.go, ops_42.go).
	nfs4.OP_READ: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.read(a.Opread) },
		releaseArgs: true},
	nfs4.OP_WRITE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.write(a.Opwrite) },
		releaseArgs: true},
	nfs4.OP_COMMIT: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.commit(a.Opcommit) },
		releaseArgs: true},
	nfs4.OP_READ_PLUS:  {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.readPlus(a.OpreadPlus) }},
	nfs4.OP_SEEK:       {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.seek(a.Opseek) }},
	nfs4.OP_ALLOCATE:   {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.allocate(a.Opallocate) }},
	nfs4.OP_DEALLOCATE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.deallocate(a.Opdeallocate) }},
	// Server-side copy (ops_copy.go); COPY_NOTIFY is for inter-server
	// copies, which Shoal does not do.
	nfs4.OP_COPY:           {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.copy(a.Opcopy) }},
	nfs4.OP_CLONE:          {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.clone(a.Opclone) }},
	nfs4.OP_OFFLOAD_STATUS: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.offloadStatus(a.OpoffloadStatus) }},
	nfs4.OP_OFFLOAD_CANCEL: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.offloadCancel(a.OpoffloadCancel) }},
	nfs4.OP_COPY_NOTIFY:    {}, // not supported
	nfs4.OP_IO_ADVISE:      {}, // not supported
	nfs4.OP_WRITE_SAME:     {}, // not supported

	// Extended attributes (RFC 8276; ops_xattr.go).
	nfs4.OP_GETXATTR:    {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.getxattr(a.Opgetxattr) }},
	nfs4.OP_SETXATTR:    {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.setxattr(a.Opsetxattr) }},
	nfs4.OP_LISTXATTRS:  {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.listxattrs(a.Oplistxattrs) }},
	nfs4.OP_REMOVEXATTR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.removexattr(a.Opremovexattr) }},

	// Opens, locks and stateids (ops_open.go, ops_lock.go).
	nfs4.OP_OPEN:           {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.open(a.Opopen) }},
	nfs4.OP_OPEN_DOWNGRADE: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.openDowngrade(a.OpopenDowngrade) }},
	nfs4.OP_CLOSE:          {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.close(a.Opclose) }},
	nfs4.OP_LOCK:           {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.lock(a.Oplock) }},
	nfs4.OP_LOCKT:          {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.lockt(a.Oplockt) }},
	nfs4.OP_LOCKU:          {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.locku(a.Oplocku) }},
	nfs4.OP_TEST_STATEID:   {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.testStateid(a.OptestStateid) }},
	nfs4.OP_FREE_STATEID:   {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.freeStateid(a.OpfreeStateid) }},

	// Delegations (deleg.go).
	nfs4.OP_DELEGRETURN:        {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.delegReturn(a.Opdelegreturn) }},
	nfs4.OP_DELEGPURGE:         {}, // not supported (no CLAIM_DELEGATE_PREV)
	nfs4.OP_GET_DIR_DELEGATION: {}, // not supported
	nfs4.OP_WANT_DELEGATION:    {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.wantDelegation(a.OpwantDelegation) }},

	// pNFS (ops_layout.go, layoutstats.go).
	nfs4.OP_LAYOUTGET: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutGet(a.Oplayoutget) },
		pnfs: true},
	nfs4.OP_GETDEVICEINFO: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.getDeviceInfo(a.Opgetdeviceinfo) },
		pnfs: true},
	nfs4.OP_GETDEVICELIST: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.getDeviceList(a.Opgetdevicelist) },
		pnfs: true},
	nfs4.OP_LAYOUTCOMMIT: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutCommit(a.Oplayoutcommit) },
		pnfs: true},
	nfs4.OP_LAYOUTRETURN: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutReturn(a.Oplayoutreturn) },
		pnfs: true},
	nfs4.OP_LAYOUTERROR: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutError(a.Oplayouterror) },
		pnfs: true},
	nfs4.OP_LAYOUTSTATS: {run: func(c *compound, a *nfs4.NfsArgop4) opReply { return c.layoutStats(a.Oplayoutstats) },
		pnfs: true},
}
