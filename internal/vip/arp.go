package vip

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// Gratuitous ARP, written by hand: the frame is 42 bytes of fixed layout,
// and a raw socket sends it on any Linux without a helper binary.

const (
	etherTypeARP  = 0x0806
	etherTypeIPv4 = 0x0800
	arpHWEthernet = 1
	arpOpRequest  = 1
	// ethMinFrame is the shortest Ethernet frame without its checksum;
	// shorter frames are padded, which some drivers leave to the sender.
	ethMinFrame = 60
)

// arpAnnouncement returns an Ethernet frame carrying an ARP announcement
// (RFC 5227, section 2.3) of ip at mac: a broadcast ARP request whose
// sender and target protocol addresses are both ip. Neighbours that have
// ip in their cache replace its hardware address with mac; Linux does so
// for an entry older than its locktime (1s by default), which is why the
// supervisor sends several, spaced.
func arpAnnouncement(mac net.HardwareAddr, ip netip.Addr) ([]byte, error) {
	if len(mac) != 6 {
		return nil, fmt.Errorf("arp: hardware address %v is not Ethernet", mac)
	}
	if !ip.Is4() {
		return nil, fmt.Errorf("arp: %v is not an IPv4 address", ip)
	}
	f := make([]byte, ethMinFrame)
	// Ethernet header: broadcast destination, our source, ARP.
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:14], etherTypeARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:2], arpHWEthernet)
	binary.BigEndian.PutUint16(a[2:4], etherTypeIPv4)
	a[4] = 6 // hardware address length
	a[5] = 4 // protocol address length
	binary.BigEndian.PutUint16(a[6:8], arpOpRequest)
	ip4 := ip.As4()
	copy(a[8:14], mac)     // sender hardware address
	copy(a[14:18], ip4[:]) // sender protocol address
	// a[18:24], the target hardware address, stays zero: it is ignored
	// in a request.
	copy(a[24:28], ip4[:]) // target protocol address
	return f, nil
}
