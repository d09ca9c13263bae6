package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// setupNet brings lo up and, when spec ("X/N,G", k7.net) is set, loads the
// network modules and gives eth0 the address X/N and the default route via G.
func setupNet(spec string) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("looking up lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	if spec == "" {
		return nil
	}
	as, gs, _ := strings.Cut(spec, ",")
	addr, err := netip.ParsePrefix(as)
	if err != nil {
		return fmt.Errorf("k7.net address: %w", err)
	}
	gw, err := netip.ParseAddr(gs)
	if err != nil {
		return fmt.Errorf("k7.net gateway: %w", err)
	}
	if err := loadModules("/etc/k7-net-modules"); err != nil {
		return err
	}
	var eth0 netlink.Link
	for deadline := time.Now().Add(10 * time.Second); ; {
		if eth0, err = netlink.LinkByName("eth0"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no eth0: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// No IPv6 on eth0: the sandbox network is IPv4 (the router drops v6).
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", []byte("1"), 0o644)
	ipnet := &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}
	if err := netlink.AddrAdd(eth0, &netlink.Addr{IPNet: ipnet}); err != nil {
		return fmt.Errorf("adding %s to eth0: %w", addr, err)
	}
	if err := netlink.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("bringing up eth0: %w", err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("adding the default route via %s: %w", gw, err)
	}
	return nil
}
