package server

import (
	"context"
	"encoding/hex"
	"regexp"
	"strconv"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/server/internal/state"
)

// The flexible files layout (RFC 8435) of the metadata server, tightly
// coupled with Shoal's own data servers.
//
// An export with `layout: flexfiles` (or a file created below a directory
// that set flexfiles, layoutpolicy.go) lists LAYOUT4_FLEX_FILES in
// fs_layout_types and answers LAYOUTGET of that type with an ff_layout4
// built from the file's stripe map (FlexLayouter, cluster.Striped): one
// mirror per good copy in service, each mirror the data servers of the
// file's positions in stripe order with the map's stripe unit, or, for a
// client that cannot stripe inside a mirror, one data server per mirror
// (Export.FlexStripe; the file is then placed one data server wide).
//
// Tight coupling (§2.2 of the RFC): the data servers are NFSv4.1 servers
// that ask the MDS about every stateid, as for the files layout. The
// layout gives each data server the client's layout stateid
// (ffds_stateid), which the data servers accept for I/O on that file
// (state.Manager.CheckIOAny), writes only under a read/write layout; a
// returned or revoked layout stops the I/O. ffds_user and ffds_group are
// not used with tight coupling (the client does its I/O with its own
// credential); they are numbers, which is what the Linux client parses,
// and follow the loose-coupling convention of RFC 8435 §2.2 all the same:
// a read/write layout names the file's owner, a read layout the export's
// anonymous user, both the file's group (pynfs FFLA1).
//
// The client writes every mirror itself. The layout's filehandle is of
// kind fhFlex, and a data server writes and commits I/O on such a handle
// to its own copy only (LocalCopier): no data server forwards. The
// copies are those the files layout's replication keeps, so healing,
// scrub and drain work unchanged.
//
// Flags: FF_FLAGS_NO_LAYOUTCOMMIT is not set, because the file's size
// lives on the MDS and grows only by LAYOUTCOMMIT (or I/O through the
// MDS); FF_FLAGS_NO_IO_THRU_MDS is not set, because the MDS serves every
// file's data itself, and a client whose data server fails goes there.
//
// A client's error report on a copy (LAYOUTERROR, or ff_ioerr4 in
// LAYOUTRETURN) marks that copy stale (CopyFailer): the map change
// recalls the file's layouts, the next layout leaves the copy out, and
// healing rewrites it. A client that reports an error has not been told
// its write succeeded (the Linux client reports, then resends through
// the MDS or a new layout), so no write is acknowledged while a copy the
// layout named missed it and is not stale. LAYOUTSTATS and ff_iostats4
// feed the same metrics as for the files layout (layoutstats.go).

// FlexLayouter is an optional capability of DataServers
// (cluster.Striped): flexfiles layouts.
type FlexLayouter interface {
	// FlexLayout returns file ino's flexfiles layout, placing the file
	// first if it has no stripe map, width data servers wide per copy
	// (0: as wide as the cluster places files). A layout for writing
	// (write) must not leave out a copy that is still counted good: the
	// client writes only the mirrors it is given. Errors are Layout's.
	FlexLayout(ctx context.Context, ino uint64, width int, write bool) (pnfs.FlexLayout, error)
}

// CopyFailer is an optional capability of DataServers (cluster.Striped):
// marking stale the copy of a file on the data server of a flexfiles
// device that a client reported failing. marked is false when nothing
// changed (not a flexfiles device, or the copy is stale already); err is
// set when the copy could not be marked (it is the last good one).
type CopyFailer interface {
	CopyFailed(ctx context.Context, ino uint64, device [16]byte) (ds string, marked bool, err error)
}

// maxImpls bounds pnfsState.impls.
const maxImpls = 1 << 16

// impl is what the MDS takes from a client's EXCHANGE_ID implementation
// id.
type impl struct {
	// stripes: the client can stripe inside a flexfiles mirror
	// (implStripes).
	stripes bool
	// linux: the client is the Linux kernel, which asks for a layout in
	// every OPEN and sends I/O below the mdsthreshold hint through the
	// MDS (ops_layout.go, declineOnOpen).
	linux bool
}

// linuxRelease finds the kernel release in a Linux client's
// implementation id name ("Linux 6.1.0-27-amd64 #1 SMP ...").
var linuxRelease = regexp.MustCompile(`^Linux (\d+)\.(\d+)`)

// implStripes reports whether a client that names itself ids in
// EXCHANGE_ID can stripe inside a flexfiles mirror: Linux from 6.18 on,
// and Shoal's own client.
func implStripes(ids []nfs4.NfsImplId4) bool {
	for _, id := range ids {
		name := string(id.NiiName)
		if string(id.NiiDomain) == "shoal.dev" {
			return true
		}
		if m := linuxRelease.FindStringSubmatch(name); m != nil {
			major, _ := strconv.Atoi(m[1])
			minor, _ := strconv.Atoi(m[2])
			return major > 6 || major == 6 && minor >= 18
		}
	}
	return false
}

// implLinux reports whether ids name the Linux kernel's client.
func implLinux(ids []nfs4.NfsImplId4) bool {
	for _, id := range ids {
		if linuxRelease.MatchString(string(id.NiiName)) {
			return true
		}
	}
	return false
}

// noteImpl records what client id said it is in EXCHANGE_ID.
func (p *pnfsState) noteImpl(id state.ClientID, ids []nfs4.NfsImplId4) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.impls) >= maxImpls {
		clear(p.impls)
	}
	p.impls[id] = impl{stripes: implStripes(ids), linux: implLinux(ids)}
}

// isLinux reports whether client id said it is the Linux kernel.
func (p *pnfsState) isLinux(id state.ClientID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.impls[id].linux
}

// flexStripes reports whether client id gets flexfiles layouts that
// stripe inside a mirror on export e (Export.FlexStripe).
func (p *pnfsState) flexStripes(e *Export, id state.ClientID) bool {
	switch e.FlexStripe {
	case FlexStripeOn:
		return true
	case FlexStripeOff:
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.impls[id].stripes
}

// flexLayout returns the flexfiles layout for client id's LAYOUTGET of
// file o (for writing: write), or the status to fail it with.
func (c *compound) flexLayout(o *object, id state.ClientID, write bool) (pnfs.FlexLayout, nfs4.Nfsstat4, error) {
	s := c.s
	fx, ok := s.pnfs.ds.(FlexLayouter)
	if !ok {
		return pnfs.FlexLayout{}, nfs4.NFS4ERR_LAYOUTUNAVAILABLE, nil
	}
	stripe := s.pnfs.flexStripes(o.export, id)
	width := 0
	if !stripe {
		width = 1
	}
	var fl pnfs.FlexLayout
	err := s.inline.striped(uint64(o.fh.ino), func() (err error) {
		fl, err = fx.FlexLayout(c.ctx, uint64(o.fh.ino), width, write)
		return err
	})
	if len(fl.Staled) > 0 {
		s.reports.mu.Lock()
		for _, ds := range fl.Staled {
			s.reports.staled[staleKey{ds, staleLeftOut}]++
		}
		s.reports.mu.Unlock()
	}
	if err != nil {
		return fl, nfs4.NFS4_OK, err
	}
	if !stripe && len(fl.Mirrors[0]) > 1 {
		// Placed wider before (by a client that stripes, or the
		// files layout): this client would refuse the layout.
		c.log.Debug("no flexfiles layout: the file is striped and the client cannot stripe a mirror",
			"ino", o.fh.ino, "width", len(fl.Mirrors[0]))
		return fl, nfs4.NFS4ERR_LAYOUTUNAVAILABLE, nil
	}
	return fl, nfs4.NFS4_OK, nil
}

// flexBody encodes fl as the loc_body of a LAYOUT4_FLEX_FILES layout
// handed out under layout stateid ls.
func (c *compound) flexBody(o *object, fl pnfs.FlexLayout, ls state.Stateid, mode nfs4.Layoutiomode4) []byte {
	fh := c.s.fh.encode(fhandle{kind: fhFlex, ino: o.fh.ino})
	uid := o.attr.UID
	if mode != nfs4.LAYOUTIOMODE4_RW {
		uid, _ = o.export.anon()
		if uid == o.attr.UID {
			uid = ^uint32(0) - 1 // never the owner: 4294967294
		}
	}
	user := []byte(strconv.FormatUint(uint64(uid), 10))
	group := []byte(strconv.FormatUint(uint64(o.attr.GID), 10))
	ff := nfs4.FfLayout4{FflStripeUnit: fl.Unit, FflMirrors: make([]nfs4.FfMirror4, len(fl.Mirrors))}
	if o.export.FlexNoIOThruMDS {
		ff.FflFlags |= nfs4.FF_FLAGS_NO_IO_THRU_MDS
	}
	for j, devs := range fl.Mirrors {
		m := &ff.FflMirrors[j]
		for _, dev := range devs {
			m.FfmDataServers = append(m.FfmDataServers, nfs4.FfDataServer4{
				FfdsDeviceid: dev,
				// The first mirror is the files layout's copy: the one
				// reads prefer.
				FfdsEfficiency: uint32(len(fl.Mirrors) - j),
				FfdsStateid:    fromState(ls),
				FfdsFhVers:     []nfs4.NfsFh4{fh},
				FfdsUser:       user,
				FfdsGroup:      group,
			})
		}
	}
	return xdr.Marshal(&ff)
}

// flexDeviceAddr encodes a flexfiles device (one data server reachable
// at addrs) as ff_device_addr4: NFSv4.1, tightly coupled.
func (s *Server) flexDeviceAddr(addrs []string) ([]byte, error) {
	var da nfs4.FfDeviceAddr4
	for _, a := range addrs {
		netid, ua, err := uaddr(a)
		if err != nil {
			return nil, err
		}
		da.FfdaNetaddrs = append(da.FfdaNetaddrs, nfs4.Netaddr4{NaRNetid: netid, NaRAddr: ua})
	}
	da.FfdaVersions = []nfs4.FfDeviceVersions4{{
		FfdvVersion: 4, FfdvMinorversion: 1,
		FfdvRsize: s.cfg.MaxRead, FfdvWsize: s.cfg.MaxWrite,
		FfdvTightlyCoupled: true,
	}}
	return xdr.Marshal(&da), nil
}

// copyFailed handles a client's report that its I/O to the copy on
// device failed, for file o of a flexfiles export: the copy is marked
// stale. Errors that say nothing about the copy (the client's state,
// a data server asking it to retry or to go to the MDS) mark nothing.
// It reports whether the copy is out of service for the file now
// (marked here, or stale or not a copy of the file already): only then
// may a client that wrote every other copy count its write as done
// without this one (recordErrors).
func (c *compound) copyFailed(o *object, device [16]byte, status nfs4.Nfsstat4) (out bool) {
	if c.fileLayoutType(o) != nfs4.LAYOUT4_FLEX_FILES {
		return false
	}
	switch status {
	case nfs4.NFS4_OK, nfs4.NFS4ERR_DELAY, nfs4.NFS4ERR_GRACE, nfs4.NFS4ERR_PNFS_NO_LAYOUT,
		nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_OLD_STATEID, nfs4.NFS4ERR_STALE_STATEID,
		nfs4.NFS4ERR_EXPIRED, nfs4.NFS4ERR_ADMIN_REVOKED, nfs4.NFS4ERR_DELEG_REVOKED,
		nfs4.NFS4ERR_OPENMODE, nfs4.NFS4ERR_ACCESS, nfs4.NFS4ERR_PERM,
		nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_DEADSESSION, nfs4.NFS4ERR_STALE_CLIENTID:
		return false
	}
	cf, ok := c.s.pnfs.ds.(CopyFailer)
	if !ok {
		return false
	}
	ds, marked, err := cf.CopyFailed(c.ctx, uint64(o.fh.ino), device)
	switch {
	case err != nil:
		c.log.Warn("flexfiles: a copy a client reports failing could not be marked stale",
			"ino", o.fh.ino, "device", hex.EncodeToString(device[:]), "ds", ds, "status", statusLabel(status), "err", err)
		return false
	case marked:
		c.s.reports.mu.Lock()
		c.s.reports.staled[staleKey{ds, staleReport}]++
		c.s.reports.mu.Unlock()
		c.log.Warn("flexfiles: a copy a client reports failing is stale until healed",
			"ino", o.fh.ino, "ds", ds, "status", statusLabel(status))
	}
	// Not marked without an error: the copy is stale already, or the
	// device holds no copy of the file (CopyFailed's early returns).
	return true
}

// flexReturn takes the reports of an ff_layoutreturn4 (the lrf_body of a
// LAYOUTRETURN of a flexfiles layout of file o, by client id): error
// reports as LAYOUTERROR, statistics as LAYOUTSTATS. A body that does
// not decode is ignored: the layout is returned all the same.
func (c *compound) flexReturn(id state.ClientID, o *object, body []byte) {
	if len(body) == 0 {
		return
	}
	var lr nfs4.FfLayoutreturn4
	if err := xdr.Unmarshal(body, &lr); err != nil {
		c.log.Debug("flexfiles: undecodable LAYOUTRETURN body", "ino", o.fh.ino, "err", err)
		return
	}
	for _, e := range lr.FflrIoerrReport {
		c.recordErrors(id, o, e.FfieOffset, e.FfieLength, e.FfieErrors)
	}
	for _, st := range lr.FflrIostatsReport {
		c.recordStats(id, o, st.FfisDeviceid, st.FfisOffset, st.FfisLength, st.FfisRead, st.FfisWrite, &st.FfisLayoutupdate)
	}
}

// servesLayoutType reports whether some export of the server hands out
// layouts of type t, or one was handed out since the server started
// (GETDEVICEINFO and LAYOUTRETURN of the whole client name no file, so
// no export).
func (s *Server) servesLayoutType(t nfs4.Layouttype4) bool {
	if s.pnfs == nil {
		return false
	}
	for _, e := range s.ns.exports {
		if layoutTypeOf(e) == t {
			return true
		}
	}
	// A type set on a directory (layoutpolicy.go) is served once a
	// layout of it was handed out.
	return s.pnfs.grantedType(t)
}
