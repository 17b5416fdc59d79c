package vip

import (
	"net/netip"
)

// Net is the host side of a supervisor: the one network interface the
// service address lives on. Every method is idempotent, because the
// supervisor repeats an action whose outcome it does not know (a call that
// failed half way, a restart after a crash).
//
// The implementation in this package is [Netlink], bound to one network
// namespace; tests bind two of them to two namespaces standing for two
// hosts.
type Net interface {
	// HasAddr reports whether the interface carries the address (the IP
	// with any prefix length).
	HasAddr(addr netip.Prefix) (bool, error)
	// AddAddr adds the address; an address already present is success.
	AddAddr(addr netip.Prefix) error
	// DelAddr removes the address; an address already absent is success.
	DelAddr(addr netip.Prefix) error
	// Announce sends one gratuitous ARP for the address, so that the
	// neighbours replace the hardware address they cached for it (that of
	// the previous holder) without waiting for their entry to go stale.
	Announce(addr netip.Addr) error
}
