//go:build !linux

package vip

import (
	"errors"
	"net/netip"

	"github.com/vishvananda/netns"
)

// Netlink is Linux only: elsewhere NewNetlink fails.
type Netlink struct{}

var _ Net = (*Netlink)(nil)

var errNotLinux = errors.New("vip: the service address is managed on Linux only")

// NewNetlink fails: addresses and gratuitous ARP are done with Linux's
// rtnetlink and AF_PACKET.
func NewNetlink(netns.NsHandle, string) (*Netlink, error) { return nil, errNotLinux }

func (*Netlink) Close()                             {}
func (*Netlink) HasAddr(netip.Prefix) (bool, error) { return false, errNotLinux }
func (*Netlink) AddAddr(netip.Prefix) error         { return errNotLinux }
func (*Netlink) DelAddr(netip.Prefix) error         { return errNotLinux }
func (*Netlink) Announce(netip.Addr) error          { return errNotLinux }
