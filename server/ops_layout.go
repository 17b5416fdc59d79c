package server

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/server/internal/state"
)

// pNFS operations of the metadata server (RFC 8881 §18.40–18.44) for the
// files layout (§13) and the flexible files layout (RFC 8435,
// flexfiles.go): each file hands out one of them, its export's
// (Export.Layout) or the one its directory set (layoutpolicy.go).

func (c *compound) layoutGet(a *nfs4.LAYOUTGET4args) opReply {
	s := c.s
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if o.attr.Type != meta.TypeRegular {
		return fail(nfs4.NFS4ERR_LAYOUTUNAVAILABLE)
	}
	if t := c.fileLayoutType(o); a.LogaLayoutType != t {
		// A type the export offers, but not this file's: no layout
		// for this file (layoutpolicy.go).
		if c.exportOffers(o.export, a.LogaLayoutType) {
			return fail(nfs4.NFS4ERR_LAYOUTUNAVAILABLE)
		}
		return fail(nfs4.NFS4ERR_UNKNOWN_LAYOUTTYPE)
	}
	flex := a.LogaLayoutType == nfs4.LAYOUT4_FLEX_FILES
	if a.LogaIomode != nfs4.LAYOUTIOMODE4_READ && a.LogaIomode != nfs4.LAYOUTIOMODE4_RW {
		return fail(nfs4.NFS4ERR_BADIOMODE)
	}
	// RFC 8881 §18.43.3: the range must hold loga_minlength, and neither
	// it nor the range (unless it reaches to the end of the file, all
	// ones) may run past the largest offset.
	const toEOF = ^uint64(0)
	if a.LogaLength < a.LogaMinlength ||
		a.LogaMinlength != toEOF && a.LogaMinlength > toEOF-a.LogaOffset ||
		a.LogaLength != toEOF && a.LogaLength > toEOF-a.LogaOffset {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	if c.opened && s.inline != nil && c.declineOnOpen(id, a.LogaLayoutType) {
		// Linux asks for a layout in every OPEN, before it knows how
		// much it will read or write. For a file whose data is at the
		// MDS (inline, or none yet: no stripe map) a layout would move
		// it to the data servers before the first byte: the guess is
		// declined, before it recalls anything, and the mdsthreshold
		// attribute sends the client's I/O of small files through the
		// MDS. I/O past the threshold asks for a layout on its own,
		// which is granted.
		placed, err := s.inline.placed(uint64(o.fh.ino))
		if err != nil {
			return failErr(err)
		}
		if !placed {
			return fail(nfs4.NFS4ERR_LAYOUTUNAVAILABLE)
		}
	}
	if a.LogaIomode == nfs4.LAYOUTIOMODE4_RW {
		if st := c.writable(o); st != nfs4.NFS4_OK {
			return fail(st)
		}
		// Writing through a layout conflicts with other clients'
		// delegations of the file.
		if st := c.breakDelegations(o.fh.ino, true); st != nfs4.NFS4_OK {
			return fail(st)
		}
	}
	if s.pnfs.layoutHeld(state.FileID(o.fh.ino)) {
		// The file's data is moving between data servers (HoldLayouts):
		// I/O goes through the MDS until the move is done.
		return fail(nfs4.NFS4ERR_LAYOUTTRYLATER).withBody(marshalFunc(func(e *xdr.Encoder) { e.Bool(false) }))
	}
	// A layout names data servers: the file's data must be there, and
	// stay there (inline.go).
	var (
		fl  pnfs.FileLayout
		ffl pnfs.FlexLayout
		err error
	)
	loose := s.pnfs.looseFlex()
	if flex && loose != nil {
		// Loosely coupled NFSv3 data servers (flexfiles_v3.go): the data
		// files are created here, before any layout state exists, and a
		// layout held back (pnfs.ErrLayoutHeld) is refused here too.
		_, err = loose.LooseFlexLayout(c.ctx, uint64(id), uint64(o.fh.ino), a.LogaIomode == nfs4.LAYOUTIOMODE4_RW)
	} else if flex {
		var st nfs4.Nfsstat4
		if ffl, st, err = c.flexLayout(o, id, a.LogaIomode == nfs4.LAYOUTIOMODE4_RW); st != nfs4.NFS4_OK {
			return fail(st)
		}
	} else {
		err = s.inline.striped(uint64(o.fh.ino), func() (err error) {
			fl, err = s.pnfs.ds.Layout(c.ctx, uint64(o.fh.ino))
			return err
		})
	}
	switch {
	case err == nil:
	case errors.Is(err, pnfs.ErrLayoutHeld):
		return fail(nfs4.NFS4ERR_LAYOUTTRYLATER).withBody(marshalFunc(func(e *xdr.Encoder) { e.Bool(false) }))
	case errors.Is(err, pnfs.ErrUnavailable), errors.Is(err, pnfs.ErrDataServerDown),
		errors.Is(err, pnfs.ErrNoDataServers):
		// A data server of the file's stripe map is out of service (or
		// none is in service for a new file): without a layout the
		// client does its I/O through the MDS, which serves what is
		// reachable and fails the rest with a clear error.
		c.log.Debug("no layout", "ino", o.fh.ino, "err", err)
		return fail(nfs4.NFS4ERR_LAYOUTUNAVAILABLE)
	default:
		return failErr(err)
	}
	sid, st := c.stateid(a.LogaStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	iomode := uint32(a.LogaIomode)
	ls, err := s.st.m.LayoutGet(id, sid, state.FileID(o.fh.ino), iomode)
	if err != nil {
		r := failErr(err)
		if r.status == nfs4.NFS4ERR_LAYOUTTRYLATER {
			// LAYOUTGET4res carries logr_will_signal_layout_avail here.
			r.body = marshalFunc(func(e *xdr.Encoder) { e.Bool(false) })
		}
		return r
	}
	s.pnfs.unfence(id)
	s.pnfs.noteGranted(a.LogaLayoutType)
	s.pnfs.noteLayoutFH(state.FileID(o.fh.ino), c.s.fh.encode(o.fh))
	c.setStateid(ls)
	mode := a.LogaIomode
	if mode == nfs4.LAYOUTIOMODE4_RW && s.st.m.LayoutIOMode(ls) != state.IOModeRW {
		mode = nfs4.LAYOUTIOMODE4_READ // RW asked under a read-only open
	}
	var body []byte
	if flex && loose != nil {
		if body, err = c.looseBody(loose, o, uint64(id), mode); err != nil {
			if errors.Is(err, pnfs.ErrLayoutHeld) {
				// Held since the check above: the layout state just
				// made is left to the next recall or the lease.
				return fail(nfs4.NFS4ERR_LAYOUTTRYLATER).withBody(marshalFunc(func(e *xdr.Encoder) { e.Bool(false) }))
			}
			return failErr(err)
		}
	} else if flex {
		body = c.flexBody(o, ffl, ls, mode)
	} else {
		dataFH := s.fh.encode(fhandle{kind: fhData, ino: o.fh.ino})
		body = xdr.Marshal(&nfs4.Nfsv41FileLayout4{
			NflDeviceid:         fl.Device,
			NflUtil:             uint32(fl.Unit), // sparse packing, commits go to the data servers
			NflFirstStripeIndex: fl.First,
			NflPatternOffset:    0,
			NflFhList:           []nfs4.NfsFh4{dataFH},
		})
	}
	return ok(&nfs4.LAYOUTGET4resok{
		// Layouts stay cached after CLOSE, so a later truncate or remove
		// of the file is a real recall (and a reopen needs no LAYOUTGET).
		LogrReturnOnClose: false,
		LogrStateid:       fromState(ls),
		LogrLayout: []nfs4.Layout4{{
			LoOffset:  0,
			LoLength:  ^uint64(0),
			LoIomode:  mode,
			LoContent: nfs4.LayoutContent4{LocType: a.LogaLayoutType, LocBody: body},
		}},
	})
}

// declineOnOpen reports whether a LAYOUTGET of type t by client id that
// follows an OPEN in the same COMPOUND is declined for a file whose data
// is not on the data servers (inline data, layoutGet).
//
// The files layout declines it for every client. A flexfiles layout
// declines it only for the Linux kernel: the decline is a guess about
// that client's habits (asking in every OPEN, small I/O through the MDS
// below mdsthreshold, a later LAYOUTGET of its own for large I/O).
// Another flexfiles client that asks for a layout in the OPEN that
// creates a file means to use it: pynfs's FFLS1 opens, gets the layout
// in one COMPOUND and returns it with I/O statistics of the data
// servers. That file is placed on the data servers at once and is never
// kept inline.
func (c *compound) declineOnOpen(id state.ClientID, t nfs4.Layouttype4) bool {
	if t != nfs4.LAYOUT4_FLEX_FILES {
		return true
	}
	return c.s.pnfs.isLinux(id)
}

// deviceAddr encodes the files-layout device: stripe index i maps to the
// data server at addrs[i], each reachable at its advertised addresses
// (multipath). A data server at several stripe indexes is listed once and
// named by each of them (nflda_stripe_indices, RFC 8881 §13.3).
func deviceAddr(addrs [][]string) ([]byte, error) {
	var da nfs4.Nfsv41FileLayoutDsAddr4
	seen := map[string]uint32{}
	for _, list := range addrs {
		key := strings.Join(list, ",")
		if j, ok := seen[key]; ok {
			da.NfldaStripeIndices = append(da.NfldaStripeIndices, j)
			continue
		}
		j := uint32(len(da.NfldaMultipathDsList))
		seen[key] = j
		da.NfldaStripeIndices = append(da.NfldaStripeIndices, j)
		var mp nfs4.MultipathList4
		for _, a := range list {
			netid, ua, err := uaddr(a)
			if err != nil {
				return nil, err
			}
			mp = append(mp, nfs4.Netaddr4{NaRNetid: netid, NaRAddr: ua})
		}
		da.NfldaMultipathDsList = append(da.NfldaMultipathDsList, mp)
	}
	return xdr.Marshal(&da), nil
}

func (c *compound) getDeviceInfo(a *nfs4.GETDEVICEINFO4args) opReply {
	s := c.s
	if !s.servesLayoutType(a.GdiaLayoutType) {
		return fail(nfs4.NFS4ERR_UNKNOWN_LAYOUTTYPE)
	}
	if l := s.pnfs.looseFlex(); l != nil && a.GdiaLayoutType == nfs4.LAYOUT4_FLEX_FILES {
		body, found, err := l.LooseDeviceAddr(a.GdiaDeviceId)
		if !found {
			return fail(nfs4.NFS4ERR_NOENT)
		}
		if err != nil {
			c.log.Warn("bad advertised NFSv3 data server address", "err", err)
			return fail(nfs4.NFS4ERR_SERVERFAULT)
		}
		return c.deviceInfoReply(a, body)
	}
	addrs, found := s.pnfs.ds.Device(a.GdiaDeviceId)
	if !found || a.GdiaLayoutType == nfs4.LAYOUT4_FLEX_FILES && len(addrs) != 1 {
		// A flexfiles device is one data server.
		return fail(nfs4.NFS4ERR_NOENT)
	}
	var body []byte
	var err error
	if a.GdiaLayoutType == nfs4.LAYOUT4_FLEX_FILES {
		body, err = s.flexDeviceAddr(addrs[0])
	} else {
		body, err = deviceAddr(addrs)
	}
	if err != nil {
		c.log.Warn("bad advertised data server address", "err", err)
		return fail(nfs4.NFS4ERR_SERVERFAULT)
	}
	return c.deviceInfoReply(a, body)
}

// deviceInfoReply answers GETDEVICEINFO with device body, or TOOSMALL.
func (c *compound) deviceInfoReply(a *nfs4.GETDEVICEINFO4args, body []byte) opReply {
	// device_addr4 = type + opaque body, then the notification bitmap.
	need := uint32(4 + 4 + len(body) + 3&^3 + 8)
	if a.GdiaMaxcount != 0 && a.GdiaMaxcount < need {
		return fail(nfs4.NFS4ERR_TOOSMALL).withBody(marshalFunc(func(e *xdr.Encoder) { e.Uint32(need) }))
	}
	return ok(&nfs4.GETDEVICEINFO4resok{
		GdirDeviceAddr: nfs4.DeviceAddr4{DaLayoutType: a.GdiaLayoutType, DaAddrBody: body},
	})
}

func (c *compound) getDeviceList(a *nfs4.GETDEVICELIST4args) opReply {
	s := c.s
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if !slices.Contains(c.layoutTypesOf(o), a.GdlaLayoutType) {
		return fail(nfs4.NFS4ERR_UNKNOWN_LAYOUTTYPE)
	}
	// Every device in one reply: there are as many as distinct data-server
	// lists in stripe maps handed out, a handful in practice.
	res := &nfs4.GETDEVICELIST4resok{GdlrEof: true}
	if a.GdlaCookie == 0 {
		for _, d := range s.pnfs.ds.Devices() {
			if uint32(len(res.GdlrDeviceidList)) >= a.GdlaMaxdevices {
				res.GdlrEof = false
				break
			}
			res.GdlrDeviceidList = append(res.GdlrDeviceidList, d)
		}
		res.GdlrCookie = 1
	}
	return ok(res)
}

func (c *compound) layoutCommit(a *nfs4.LAYOUTCOMMIT4args) opReply {
	s := c.s
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	sid, st := c.stateid(a.LocaStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if a.LocaReclaim && !s.st.m.InGrace() {
		// RFC 8881 §18.42.3: a reclaiming LAYOUTCOMMIT outside the grace
		// period is refused. Inside it, loca_reclaim changes nothing below:
		// the stateid of the earlier boot is judged like any other.
		return fail(nfs4.NFS4ERR_NO_GRACE)
	}
	if err := s.st.m.CheckLayoutCommit(id, sid, state.FileID(o.fh.ino)); err != nil {
		switch {
		case errors.Is(err, pnfs.ErrStaleStateid) && sid.Type() == state.TypeLayout &&
			s.st.m.HasWriteOpen(id, state.FileID(o.fh.ino)):
			// A layout of an earlier boot: the client wrote to the data
			// servers, then the MDS restarted before this LAYOUTCOMMIT.
			// The Linux client never sets loca_reclaim and takes
			// NFS4ERR_BADLAYOUT, NFS4ERR_GRACE and (newer kernels)
			// NFS4ERR_STALE_STATEID here as "done"
			// (fs/nfs/nfs4proc.c nfs4_layoutcommit_done), so refusing would
			// silently lose the size growth of data that is on the data
			// servers. RFC 8881 §18.42.3 lets the server accept the commit
			// when it can check it. The check is the client's open of this
			// file with write access, reclaimed or made after the restart:
			// with it the client could extend the file by itself, so
			// trusting its last write offset grants nothing new. A
			// LAYOUTCOMMIT during grace is not refused either, so a commit
			// right after the reclaim counts too.
		case errors.Is(err, pnfs.ErrStaleStateid) || errors.Is(err, pnfs.ErrBadStateid) ||
			errors.Is(err, state.ErrBadLayout):
			// No read/write layout of this file under this stateid: an
			// open, lock or delegation stateid (loca_stateid is the layout
			// stateid, RFC 8881 §18.42.3), a layout of another file or
			// client, one granted for reading only, one returned or
			// revoked in this boot (a revoked client's late commit must
			// not grow the file), or one of an earlier boot from a client
			// that cannot write the file. Growing the size on any of those
			// would let a client publish a size it never wrote through a
			// layout. NFS4ERR_BADLAYOUT ("layout specified is invalid")
			// is also what Linux nfsd answers for any bad LAYOUTCOMMIT
			// stateid ("fixup error code as per RFC5661" in
			// nfsd4_layoutcommit), and the Linux client takes it as
			// "done" (fs/nfs/nfs4proc.c nfs4_layoutcommit_done). Not
			// NFS4ERR_BAD_STATEID, which that client hands to its generic
			// error recovery, nor NFS4ERR_STALE_STATEID: on that, older
			// Linux clients renew their lease and resend the same stateid
			// forever.
			return fail(nfs4.NFS4ERR_BADLAYOUT)
		default:
			return failErr(err)
		}
	}
	if err := s.cache.flush(c.ctx, o.fh.ino); err != nil {
		return failErr(err)
	}
	// Wrote grows the recorded size to the last write offset inside one
	// metadata transaction (never shrinking it), so concurrent LAYOUTCOMMITs
	// of writers sharing a file cannot lose each other's extensions. The
	// size merged from the data servers that GETATTR reports while layouts
	// are out plays no part here.
	var end uint64
	if lw := a.LocaLastWriteOffset; lw.NoNewoffset && lw.NoOffset != nil {
		end = *lw.NoOffset + 1
	}
	before, err := s.meta.GetAttr(c.ctx, o.fh.ino)
	if err != nil {
		return failErr(err)
	}
	after, err := s.meta.Wrote(c.ctx, o.fh.ino, end, time.Now())
	if err != nil {
		return failErr(err)
	}
	if t := a.LocaTimeModify; t.NtTimechanged && t.NtTime != nil {
		mt := time.Unix(t.NtTime.Seconds, int64(t.NtTime.Nseconds))
		if _, err := s.meta.SetAttr(c.ctx, o.fh.ino, meta.SetAttr{Mask: meta.SetMtime, Mtime: mt}, time.Now()); err != nil {
			return failErr(err)
		}
	}
	// The pNFS commit of the file's size and mtime: stable when
	// answered, also on an async export (durability.go).
	c.needStable()
	res := &nfs4.LAYOUTCOMMIT4resok{}
	if after.Size != before.Size {
		size := after.Size
		res.LocrNewsize = nfs4.Newsize4{NsSizechanged: true, NsSize: &size}
	}
	return ok(res)
}

func (c *compound) layoutReturn(a *nfs4.LAYOUTRETURN4args) opReply {
	s := c.s
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if !s.servesLayoutType(a.LoraLayoutType) {
		return fail(nfs4.NFS4ERR_UNKNOWN_LAYOUTTYPE)
	}
	notPresent := marshalFunc(func(e *xdr.Encoder) { e.Bool(false) })
	switch a.LoraLayoutreturn.LrReturntype {
	case nfs4.LAYOUTRETURN4_FILE:
		lr := a.LoraLayoutreturn.LrLayout
		if lr == nil {
			return fail(nfs4.NFS4ERR_BADXDR)
		}
		o, st := c.current()
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		sid, st := c.stateid(lr.LrfStateid)
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		if a.LoraLayoutType != c.fileLayoutType(o) {
			return fail(nfs4.NFS4ERR_UNKNOWN_LAYOUTTYPE)
		}
		if a.LoraLayoutType == nfs4.LAYOUT4_FLEX_FILES {
			if err := s.st.m.CheckCurrentLayoutSeqid(id, sid, state.FileID(o.fh.ino)); err != nil {
				return failErr(err)
			}
		}
		if _, _, err := s.st.m.LayoutReturnFile(id, sid, state.FileID(o.fh.ino)); err != nil {
			return failErr(err)
		}
		if a.LoraLayoutType == nfs4.LAYOUT4_FLEX_FILES {
			// The reports are taken once the return is known good; a
			// copy reported failing is marked stale before the reply.
			c.flexReturn(id, o, lr.LrfBody)
		}
		return ok(notPresent)
	case nfs4.LAYOUTRETURN4_FSID, nfs4.LAYOUTRETURN4_ALL:
		if err := s.st.m.LayoutReturnAll(id); err != nil {
			return failErr(err)
		}
		return ok(notPresent)
	}
	return fail(nfs4.NFS4ERR_INVAL)
}

var _ = errors.New
