package vip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netlink is the [Net] of one interface in one network namespace, through
// rtnetlink for addresses and an AF_PACKET socket for gratuitous ARP.
type Netlink struct {
	ifname string
	h      *netlink.Handle
	ns     netns.NsHandle // -1 (netns.None()): the process's namespace
}

var _ Net = (*Netlink)(nil)

// NewNetlink returns the Net of interface ifname in namespace ns; pass
// netns.None() for the namespace the process runs in (what shoal vip
// does). ns stays owned by the caller and must stay open while the Netlink
// is used. The interface need not exist yet: each call looks it up, so an
// interface that is recreated (a bond reconfigured) is followed by name.
func NewNetlink(ns netns.NsHandle, ifname string) (*Netlink, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("vip: netlink handle: %w", err)
	}
	return &Netlink{ifname: ifname, h: h, ns: ns}, nil
}

// Close releases the netlink socket.
func (n *Netlink) Close() { n.h.Close() }

func (n *Netlink) link() (netlink.Link, error) {
	l, err := n.h.LinkByName(n.ifname)
	if err != nil {
		return nil, fmt.Errorf("vip: interface %s: %w", n.ifname, err)
	}
	return l, nil
}

// noLink reports whether err says the interface does not exist: then it
// carries no address, which is what HasAddr and DelAddr want to know, and
// the supervisor must not stay stuck retrying a removal.
func noLink(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// HasAddr implements Net.
func (n *Netlink) HasAddr(p netip.Prefix) (bool, error) {
	l, err := n.link()
	if noLink(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	addrs, err := n.h.AddrList(l, family(p))
	if err != nil {
		return false, fmt.Errorf("vip: list addresses of %s: %w", n.ifname, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == p.Addr() {
			return true, nil
		}
	}
	return false, nil
}

func nlAddr(p netip.Prefix) *netlink.Addr {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}}
}

// AddAddr implements Net.
func (n *Netlink) AddAddr(p netip.Prefix) error {
	l, err := n.link()
	if err != nil {
		return err
	}
	if err := n.h.AddrAdd(l, nlAddr(p)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("vip: add %s to %s: %w", p, n.ifname, err)
	}
	return nil
}

// DelAddr implements Net. It removes the address whatever prefix length
// it was added with, so that a stale address from a configuration with
// another mask is removed too.
func (n *Netlink) DelAddr(p netip.Prefix) error {
	l, err := n.link()
	if noLink(err) {
		return nil
	}
	if err != nil {
		return err
	}
	addrs, err := n.h.AddrList(l, family(p))
	if err != nil {
		return fmt.Errorf("vip: list addresses of %s: %w", n.ifname, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap() != p.Addr() {
			continue
		}
		if err := n.h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("vip: remove %s from %s: %w", a.IPNet, n.ifname, err)
		}
	}
	return nil
}

// Announce implements Net: one ARP announcement, broadcast on the
// interface from its hardware address.
func (n *Netlink) Announce(ip netip.Addr) error {
	l, err := n.link()
	if err != nil {
		return err
	}
	frame, err := arpAnnouncement(l.Attrs().HardwareAddr, ip)
	if err != nil {
		return fmt.Errorf("vip: announce on %s: %w", n.ifname, err)
	}
	fd, err := packetSocketAt(n.ns, 0)
	if err != nil {
		return fmt.Errorf("vip: announce on %s: %w", n.ifname, err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{
		Protocol: htons(etherTypeARP),
		Ifindex:  l.Attrs().Index,
		Halen:    6,
		Addr:     [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	}
	if err := unix.Sendto(fd, frame, 0, to); err != nil {
		return fmt.Errorf("vip: send gratuitous ARP on %s: %w", n.ifname, err)
	}
	return nil
}

// htons converts v to network byte order in a uint16, as sockaddr_ll's
// protocol and socket(2)'s protocol argument want it.
func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// packetSocketAt opens a raw AF_PACKET socket in namespace ns (the
// process's own for netns.None()). A socket belongs to the namespace of the
// thread that created it, so the socket is created on a thread of its own
// that enters ns and is never handed back to the Go scheduler: the thread
// ends with the goroutine, and no other goroutine ever runs in ns by
// accident. proto 0 makes a send-only socket (it receives nothing).
func packetSocketAt(ns netns.NsHandle, proto uint16) (int, error) {
	open := func() (int, error) {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(proto)))
		if err != nil {
			return -1, fmt.Errorf("packet socket: %w", err)
		}
		return fd, nil
	}
	if !ns.IsOpen() {
		return open()
	}
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread has left the process's
		// namespace, so it must die with this goroutine.
		if err := netns.Set(ns); err != nil {
			done <- result{-1, fmt.Errorf("enter network namespace: %w", err)}
			return
		}
		fd, err := open()
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}
