package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// linkUp sets the link named name up.
func linkUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("bringing up %s: %w", name, err)
	}
	return nil
}

// addrUp gives the link named name the address p (if it lacks it) and sets
// it up.
func addrUp(h *netlink.Handle, name string, p netip.Prefix) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(p)}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding %s to %s: %w", p, name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("bringing up %s: %w", name, err)
	}
	return nil
}

// defaultRoute sets the default route via gw on the link named name.
func defaultRoute(h *netlink.Handle, name string, gw netip.Addr) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice(), Dst: prefixNet(netip.MustParsePrefix("0.0.0.0/0"))}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("adding default route via %s: %w", gw, err)
	}
	return nil
}
