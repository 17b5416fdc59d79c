package scripted

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Flexible files layouts (RFC 8435), for the client's flexfiles driver:
// after SetFlex the server lists LAYOUT4_FLEX_FILES in fs_layout_types
// and answers LAYOUTGET with an ff_layout4 of one data server per mirror.
// Mirror m is device m+1, at the address SetFlex gave for it (this server
// itself, or another scripted Server acting as a data server only), with
// the filehandle "fh:/NAME#mM", the layout stateid, and efficiency
// mirrors-m (mirror 0 is the one reads prefer).
//
// Any server keeps the bytes written to a file, through the MDS or as a
// data server (a PUTFH of "fh:/NAME#mM" makes such a data file on first
// use), and answers WRITE UNSTABLE with one write verifier, COMMIT with
// the same, READ with what it holds. LAYOUTERROR, LAYOUTCOMMIT and the
// flexfiles body of LAYOUTRETURN are taken and shown in the trace.

// SetFlex makes the server hand out flexfiles layouts whose mirror m is
// on the data server at addrs[m] ("host:port"), with ffl_flags flags.
// With loose, the data servers are loosely coupled (RFC 8435 §2.2): the
// layout gives the anonymous stateid and the synthetic owner 1000:2000.
func (s *Server) SetFlex(addrs []string, flags uint32, loose bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flexDS = append([]string(nil), addrs...)
	s.flexFlags = flags
	s.flexLoose = loose
}

// Data returns the bytes file name (a data file: "NAME#mM") holds.
func (s *Server) Data(name string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.byFH["fh:/"+name]; f != nil {
		return append([]byte(nil), f.data...)
	}
	return nil
}

// dataFile returns the data file with filehandle fh, making it if fh is
// one of a flexfiles layout.
func (s *Server) dataFile(fh []byte) *file {
	if f := s.byFH[string(fh)]; f != nil {
		return f
	}
	name, ok := strings.CutPrefix(string(fh), "fh:/")
	if !ok || !strings.Contains(name, "#m") {
		return nil
	}
	f := &file{name: name, fh: append([]byte(nil), fh...), fileid: uint64(1000 + len(s.byFH))}
	s.byFH[string(f.fh)] = f
	return f
}

var scriptedVerf = nfs4.Verifier4{'s', 'c', 'r', 'i', 'p', 't'}

func (s *Server) write(st *compoundState, a *nfs4.WRITE4args) result {
	f := st.cur
	if f == nil || f.dir {
		return fail(nfs4.OP_WRITE, nfs4.NFS4ERR_INVAL)
	}
	end := uint64(a.Offset) + uint64(len(a.Data))
	if end > uint64(len(f.data)) {
		f.data = append(f.data, make([]byte, end-uint64(len(f.data)))...)
	}
	copy(f.data[a.Offset:], a.Data)
	if _, mds := s.files[f.name]; mds {
		f.size = max(f.size, end) // through the MDS: the size follows
	}
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4res{Resok4: &nfs4.WRITE4resok{
		Count: nfs4.Count4(len(a.Data)), Committed: nfs4.UNSTABLE4, Writeverf: scriptedVerf}}}}
}

func (s *Server) read(st *compoundState, a *nfs4.READ4args) result {
	f := st.cur
	if f == nil || f.dir {
		return fail(nfs4.OP_READ, nfs4.NFS4ERR_INVAL)
	}
	lo := min(uint64(a.Offset), uint64(len(f.data)))
	hi := min(lo+uint64(a.Count), uint64(len(f.data)))
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_READ, Opread: &nfs4.READ4res{Resok4: &nfs4.READ4resok{
		Eof: hi == uint64(len(f.data)), Data: append([]byte(nil), f.data[lo:hi]...)}}}}
}

func (s *Server) layoutCommit(st *compoundState, a *nfs4.LAYOUTCOMMIT4args) result {
	f := st.cur
	if f == nil || f.layout == nil || a.LocaStateid.Other != f.layout.Other {
		return fail(nfs4.OP_LAYOUTCOMMIT, nfs4.NFS4ERR_BAD_STATEID)
	}
	if a.LocaLastWriteOffset.NoNewoffset && a.LocaLastWriteOffset.NoOffset != nil {
		f.size = max(f.size, uint64(*a.LocaLastWriteOffset.NoOffset)+1)
	}
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4res{
		LocrResok4: &nfs4.LAYOUTCOMMIT4resok{}}}, note: fmt.Sprintf("size=%d", f.size)}
}

func (s *Server) layoutError(st *compoundState, a *nfs4.LAYOUTERROR4args) result {
	f := st.cur
	if f == nil || f.layout == nil || a.LeaStateid.Other != f.layout.Other {
		return fail(nfs4.OP_LAYOUTERROR, nfs4.NFS4ERR_BAD_STATEID)
	}
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_LAYOUTERROR, Oplayouterror: &nfs4.LAYOUTERROR4res{}}}
}

// flexLayoutBody is the ff_layout4 of file f under layout stateid sid.
func (s *Server) flexLayoutBody(f *file, sid nfs4.Stateid4) []byte {
	fl := nfs4.FfLayout4{FflFlags: nfs4.FfFlags4(s.flexFlags)}
	user, group := "0", "0"
	if s.flexLoose {
		sid, user, group = nfs4.Stateid4{}, "1000", "2000"
	}
	for m := range s.flexDS {
		fl.FflMirrors = append(fl.FflMirrors, nfs4.FfMirror4{FfmDataServers: []nfs4.FfDataServer4{{
			FfdsDeviceid: nfs4.Deviceid4{byte(m + 1)}, FfdsEfficiency: nfs4.Uint32T(len(s.flexDS) - m),
			FfdsStateid: sid, FfdsFhVers: []nfs4.NfsFh4{fmt.Appendf(nil, "%s#m%d", f.fh, m)},
			FfdsUser: []byte(user), FfdsGroup: []byte(group),
		}}})
	}
	return xdr.Marshal(&fl)
}

// flexDevice answers GETDEVICEINFO of a flexfiles device.
func (s *Server) flexDevice(a *nfs4.GETDEVICEINFO4args) result {
	m := int(a.GdiaDeviceId[0]) - 1
	if m < 0 || m >= len(s.flexDS) || a.GdiaDeviceId != (nfs4.Deviceid4{byte(m + 1)}) {
		return fail(nfs4.OP_GETDEVICEINFO, nfs4.NFS4ERR_NOENT)
	}
	body := xdr.Marshal(&nfs4.FfDeviceAddr4{
		FfdaNetaddrs: nfs4.MultipathList4{{NaRNetid: "tcp", NaRAddr: uaddr(s.flexDS[m])}},
		FfdaVersions: []nfs4.FfDeviceVersions4{{FfdvVersion: 4, FfdvMinorversion: 1, FfdvRsize: 1 << 20, FfdvWsize: 1 << 20, FfdvTightlyCoupled: !s.flexLoose}},
	})
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_GETDEVICEINFO, Opgetdeviceinfo: &nfs4.GETDEVICEINFO4res{
		GdirResok4: &nfs4.GETDEVICEINFO4resok{GdirDeviceAddr: nfs4.DeviceAddr4{DaLayoutType: nfs4.LAYOUT4_FLEX_FILES, DaAddrBody: body}}}}}
}

// uaddr is the universal address of "host:port".
func uaddr(hostport string) string {
	host, port, _ := strings.Cut(hostport, ":")
	p, _ := strconv.Atoi(port)
	return fmt.Sprintf("%s.%d.%d", host, p>>8, p&0xff)
}

// renderDevErrors renders device errors for the trace: "[dev2 NFS4ERR_IO WRITE]".
func renderDevErrors(es []nfs4.DeviceError4) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, fmt.Sprintf("dev%d %s %s", e.DeDeviceid[0], statusText(e.DeStatus), opName(e.DeOpnum)))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// renderReturnBody renders the flexfiles body of a LAYOUTRETURN: its
// error reports, if any.
func renderReturnBody(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	var r nfs4.FfLayoutreturn4
	if err := xdr.Unmarshal(b, &r); err != nil {
		return " body=undecodable"
	}
	if len(r.FflrIoerrReport) == 0 {
		return ""
	}
	var parts []string
	for _, e := range r.FflrIoerrReport {
		parts = append(parts, fmt.Sprintf("%d+%d %s", e.FfieOffset, e.FfieLength, renderDevErrors(e.FfieErrors)))
	}
	return " ioerr=" + strings.Join(parts, "; ")
}
