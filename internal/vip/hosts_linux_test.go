package vip

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The test network: three namespaces on one bridge. A and B stand for two
// MDS hosts, each with eth0 (10.9.0.1 and .2); C stands for an NFS client,
// whose br0 (10.9.0.3) connects them. The service address is 10.9.0.100.

var serviceAddr = netip.MustParsePrefix("10.9.0.100/24")

type host struct {
	name string // namespace name
	ns   netns.NsHandle
	net  *Netlink // eth0, or br0 in the client namespace
	mac  net.HardwareAddr
}

type network struct {
	a, b, c *host
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newNetwork creates the namespaces, deleted when the test ends, or skips
// the test if this process may not create them.
func newNetwork(t *testing.T) *network {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2) to create network namespaces")
	}
	base := fmt.Sprintf("shoalvip-%d-%s", os.Getpid(), strings.ToLower(strings.NewReplacer("/", "-").Replace(t.Name())))
	if len(base) > 40 {
		base = base[:40]
	}
	nw := &network{}
	for i, h := range []**host{&nw.a, &nw.b, &nw.c} {
		name := fmt.Sprintf("%s-%c", base, 'a'+i)
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			if i == 0 {
				t.Skipf("cannot create a network namespace: %v: %s", err, out)
			}
			t.Fatalf("ip netns add %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", name, err, out)
			}
		})
		*h = &host{name: name}
	}
	ip(t, "-n", nw.c.name, "link", "add", "br0", "type", "bridge")
	ip(t, "-n", nw.c.name, "addr", "add", "10.9.0.3/24", "dev", "br0")
	ip(t, "-n", nw.c.name, "link", "set", "br0", "up")
	for i, h := range []*host{nw.a, nw.b} {
		peer := fmt.Sprintf("p%d", i)
		ip(t, "link", "add", "eth0", "netns", h.name, "type", "veth", "peer", "name", peer, "netns", nw.c.name)
		ip(t, "-n", nw.c.name, "link", "set", peer, "master", "br0", "up")
		ip(t, "-n", h.name, "addr", "add", fmt.Sprintf("10.9.0.%d/24", i+1), "dev", "eth0")
		ip(t, "-n", h.name, "link", "set", "eth0", "up")
	}
	for _, h := range nwHosts(nw) {
		ns, err := netns.GetFromName(h.name)
		if err != nil {
			t.Fatalf("open namespace %s: %v", h.name, err)
		}
		t.Cleanup(func() { ns.Close() })
		h.ns = ns
		ifname := "eth0"
		if h == nw.c {
			ifname = "br0"
		}
		if h.net, err = NewNetlink(ns, ifname); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.net.Close)
		l, err := h.net.link()
		if err != nil {
			t.Fatal(err)
		}
		h.mac = l.Attrs().HardwareAddr
	}
	return nw
}

func nwHosts(nw *network) []*host {
	var hs []*host
	for _, h := range []*host{nw.a, nw.b, nw.c} {
		if h != nil {
			hs = append(hs, h)
		}
	}
	return hs
}

// holds reports whether h carries the service address.
func (h *host) holds(t *testing.T) bool {
	t.Helper()
	ok, err := h.net.HasAddr(serviceAddr)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// ledger records, across hosts and in one order, when each host starts
// adding the service address and when a removal has completed, and fails
// the test when a host starts adding it while another may still hold it.
// It wraps the real Net; it only watches.
type ledger struct {
	t       *testing.T
	mu      sync.Mutex
	holders map[string]bool
	events  []string
}

func newLedger(t *testing.T) *ledger { return &ledger{t: t, holders: map[string]bool{}} }

func (l *ledger) record(host, ev string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, host+" "+ev)
	switch ev {
	case "add":
		for other := range l.holders {
			if other != host {
				l.t.Errorf("%s adds the service address while %s may hold it; events: %v", host, other, l.events)
			}
		}
		l.holders[host] = true
	case "del":
		delete(l.holders, host)
	}
}

func (l *ledger) log() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// ledgerNet is a Net whose address changes are recorded in a ledger.
type ledgerNet struct {
	Net
	host  string
	l     *ledger
	onAdd func() // if set, runs before each add
}

func (n *ledgerNet) AddAddr(p netip.Prefix) error {
	if n.onAdd != nil {
		n.onAdd()
	}
	n.l.record(n.host, "add")
	return n.Net.AddAddr(p)
}

func (n *ledgerNet) DelAddr(p netip.Prefix) error {
	err := n.Net.DelAddr(p)
	if err == nil {
		n.l.record(n.host, "del")
	}
	return err
}

// arpCapture receives ARP frames on an interface of a namespace.
type arpCapture struct {
	fd int
}

func newARPCapture(t *testing.T, h *host) *arpCapture {
	t.Helper()
	fd, err := packetSocketAt(h.ns, etherTypeARP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	l, err := h.net.link()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(etherTypeARP), Ifindex: l.Attrs().Index}); err != nil {
		t.Fatalf("bind capture socket: %v", err)
	}
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return &arpCapture{fd: fd}
}

// waitAnnouncement reads frames until an ARP announcement of ip from mac
// arrives, reading at most a bounded number of times.
func (c *arpCapture) waitAnnouncement(t *testing.T, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	buf := make([]byte, 1500)
	for range 100 { // 100 reads of at most 200ms
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("capture: %v", err)
		}
		f := buf[:n]
		if len(f) < 42 || binary.BigEndian.Uint16(f[12:14]) != etherTypeARP {
			continue
		}
		a := f[14:]
		spa, _ := netip.AddrFromSlice(a[14:18])
		tpa, _ := netip.AddrFromSlice(a[24:28])
		if binary.BigEndian.Uint16(a[6:8]) == arpOpRequest && spa == ip && tpa == ip &&
			net.HardwareAddr(a[8:14]).String() == mac.String() && net.HardwareAddr(f[6:12]).String() == mac.String() {
			return
		}
	}
	t.Fatalf("no ARP announcement of %v from %v seen", ip, mac)
}

// neighbour returns the hardware address namespace h has cached for ip.
func (h *host) neighbour(t *testing.T, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	l, err := h.net.link()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := h.net.h.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n.HardwareAddr
		}
	}
	return nil
}

// setNeighbour makes h's cache map ip to mac, as if h had talked to ip's
// holder (the client mounted through the service address).
func (h *host) setNeighbour(t *testing.T, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	l, err := h.net.link()
	if err != nil {
		t.Fatal(err)
	}
	err = h.net.h.NeighSet(&netlink.Neigh{
		LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_STALE,
		IP: ip.AsSlice(), HardwareAddr: mac,
	})
	if err != nil {
		t.Fatalf("set neighbour: %v", err)
	}
}

// proxy forwards TCP connections to an etcd endpoint until cut, standing
// for the network between one host and etcd.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Go(func() { io.Copy(u, c); u.Close() })
			p.wg.Go(func() { io.Copy(c, u); c.Close() })
		}
	})
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// cut closes the listener and every connection: the host can no longer
// reach etcd, and connecting again is refused.
func (p *proxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// await polls cond until it holds, a bounded number of times, and fails
// the test with what if it never does.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1500 { // 15s at most
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting until %s", what)
}
