package flexv3

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Server names one NFSv3 data server and the export the data files go in.
type Server struct {
	// Addr is the host:port of its NFS service, as the MDS dials it.
	Addr string
	// MountAddr is the host:port of its MOUNT service (default Addr).
	MountAddr string
	// Path is the exported directory the data files are created in.
	Path string
	// Advertise is the host:port clients are told in GETDEVICEINFO
	// (default Addr), for when clients reach the server under another
	// address than the MDS does (qemu user networking).
	Advertise string
}

// ParseServer parses a data server as written in the configuration:
//
//	host:port/export/path
//	host:port/export/path?mount=PORT&advertise=HOST:PORT
//
// mount is the port of the MOUNT service when it is not the NFS port
// (NFS-Ganesha's MNT_Port), advertise the address clients are given.
func ParseServer(s string) (Server, error) {
	u, err := url.Parse("nfs3://" + s)
	if err != nil || u.Host == "" || u.User != nil || u.Fragment != "" {
		return Server{}, fmt.Errorf("flexv3: data server %q: want host:port/path[?mount=PORT&advertise=HOST:PORT]", s)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return Server{}, fmt.Errorf("flexv3: data server %q: %w", s, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return Server{}, fmt.Errorf("flexv3: data server %q: bad port %q", s, port)
	}
	if !strings.HasPrefix(u.Path, "/") {
		return Server{}, fmt.Errorf("flexv3: data server %q: no export path", s)
	}
	srv := Server{Addr: u.Host, MountAddr: u.Host, Path: u.Path, Advertise: u.Host}
	q := u.Query()
	for k := range q {
		if k != "mount" && k != "advertise" {
			return Server{}, fmt.Errorf("flexv3: data server %q: unknown option %q", s, k)
		}
	}
	if m := q.Get("mount"); m != "" {
		if p, err := strconv.Atoi(m); err != nil || p <= 0 || p > 65535 {
			return Server{}, fmt.Errorf("flexv3: data server %q: bad mount port %q", s, m)
		}
		srv.MountAddr = net.JoinHostPort(host, m)
	}
	if a := q.Get("advertise"); a != "" {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return Server{}, fmt.Errorf("flexv3: data server %q: advertise: %w", s, err)
		}
		srv.Advertise = a
	}
	return srv, nil
}

// String is the configuration form of s.
func (s Server) String() string {
	out := s.Addr + s.Path
	var q []string
	if s.MountAddr != "" && s.MountAddr != s.Addr {
		_, p, _ := net.SplitHostPort(s.MountAddr)
		q = append(q, "mount="+p)
	}
	if s.Advertise != "" && s.Advertise != s.Addr {
		q = append(q, "advertise="+s.Advertise)
	}
	if len(q) > 0 {
		out += "?" + strings.Join(q, "&")
	}
	return out
}
