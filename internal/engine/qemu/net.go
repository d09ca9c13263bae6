package qemu

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/errdefs"
)

// Networking. The daemon's sandbox netns S (CreateRequest.Netns) holds eth0,
// a veth with the inner address X and a default route via the gateway G.
// Under QEMU the guest must own X, so the engine turns S into a wire:
//
//	router R  gw ═══ eth0 ──tc mirred── tap0 ── QEMU virtio-net ── guest eth0 X
//	                 (no address)        (S)                       default via G
//
//   - QEMU starts in a network namespace of its own (empty; it dies with
//     QEMU) and creates tap0 there from "-netdev tap,ifname=tap0". Once
//     its monitor answers, the engine moves tap0 into S. The tap is not
//     persistent: it disappears when QEMU exits, wherever it is, so no
//     tap is ever on the host and a killed QEMU leaves nothing.
//   - In S the engine removes X and the default route from eth0 (S's own
//     stack must not answer for X) and redirects every frame between eth0
//     and tap0 with an ingress qdisc and a match-all u32 filter whose
//     action is mirred egress redirect, both ways. Everything it adds
//     lives on S's links and goes when the daemon deletes S.
//   - The guest's NIC has eth0's MAC, so R sees the same MAC as it would
//     with gVisor; vminit gives the guest's eth0 X and the default route
//     from the kernel command line (k7.net=X/prefix,G).
//
// Forks: a child is a migration restore, so its guest wakes with X, the
// route and the MAC already configured in RAM. The child's S (made by the
// daemon, with the parent's X) is wired the same way and its eth0 gets the
// guest's MAC. The child's QEMU command line (and so its device list)
// equals the parent's, NIC included. The fork pool's idle QEMUs start
// before the child's S is known: that is why QEMU creates its tap in a
// namespace of its own and the engine moves it at claim time, which works
// the same for a pooled process as for a fresh one.

// Interface names and the initramfs file of the network modules.
const (
	tapIf      = "tap0"
	sandboxIf  = "eth0"
	netModules = "/etc/k7-net-modules" // in the initramfs, loaded by vminit only with k7.net
)

// NetModules are the kernel modules a guest with a network interface loads
// (vminit, from /etc/k7-net-modules), with their dependencies, when the
// kernel does not have them built in.
var NetModules = []string{"virtio_net"}

// guestNet is a guest's network interface, taken over from eth0 of the
// sandbox netns: address, gateway and MAC.
type guestNet struct {
	Addr    netip.Prefix `json:"addr"` // X/prefix
	Gateway netip.Addr   `json:"gateway"`
	MAC     string       `json:"mac"`
}

// String is the value of the guest's k7.net kernel parameter.
func (n *guestNet) String() string { return n.Addr.String() + "," + n.Gateway.String() }

// readNetns returns what eth0 of the namespace at path holds: its first IPv4
// address, the gateway of its default route and its MAC. A namespace
// without eth0 is loopback only: nil, nil.
func readNetns(path string) (*guestNet, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("opening netns %s: %w: %w", path, err, errdefs.ErrInvalidArgument)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(sandboxIf)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, fmt.Errorf("looking up %s in %s: %w", sandboxIf, path, err)
	}
	n := &guestNet{MAC: l.Attrs().HardwareAddr.String()}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s in %s has no IPv4 address: %w", sandboxIf, path, errdefs.ErrInvalidArgument)
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	ones, _ := addrs[0].Mask.Size()
	n.Addr = netip.PrefixFrom(a, ones)
	routes, err := h.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		if r.Gw != nil && isDefault(r.Dst) {
			n.Gateway, _ = netip.AddrFromSlice(r.Gw.To4())
		}
	}
	if !n.Gateway.IsValid() {
		return nil, fmt.Errorf("%s in %s has no default route: %w", sandboxIf, path, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}

// attachTap moves tap0 from the network namespace of QEMU process pid into
// the sandbox netns at path and wires it to eth0 there (see above). n is the
// guest's interface; eth0 gets its MAC. It may not be repeated, and when
// it fails S may be half wired: the caller kills QEMU (the tap goes with
// it) and S is not reused (the daemon deletes a failed sandbox's netns).
func attachTap(pid int, path string, n *guestNet) error {
	qns, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("opening QEMU's netns: %w", err)
	}
	defer func() { _ = qns.Close() }()
	hq, err := netlink.NewHandleAt(qns)
	if err != nil {
		return err
	}
	defer hq.Close()
	sns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("opening netns %s: %w", path, err)
	}
	defer func() { _ = sns.Close() }()
	tap, err := hq.LinkByName(tapIf)
	if err != nil {
		return fmt.Errorf("looking up QEMU's %s: %w", tapIf, err)
	}
	if err := hq.LinkSetNsFd(tap, int(sns)); err != nil {
		return fmt.Errorf("moving %s into %s: %w", tapIf, path, err)
	}
	h, err := netlink.NewHandleAt(sns)
	if err != nil {
		return err
	}
	defer h.Close()
	if tap, err = h.LinkByName(tapIf); err != nil {
		return err
	}
	eth0, err := h.LinkByName(sandboxIf)
	if err != nil {
		return fmt.Errorf("looking up %s in %s: %w", sandboxIf, path, err)
	}
	// S's own stack lets go of X: the guest answers for it.
	def := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
	if err := h.RouteDel(def); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("removing the default route from %s: %w", sandboxIf, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.Addr.Addr().AsSlice(), Mask: net.CIDRMask(n.Addr.Bits(), 32)}}
	if err := h.AddrDel(eth0, addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("removing %s from %s: %w", n.Addr, sandboxIf, err)
	}
	if mac, err := net.ParseMAC(n.MAC); err == nil && mac.String() != eth0.Attrs().HardwareAddr.String() {
		if err := h.LinkSetHardwareAddr(eth0, mac); err != nil {
			return fmt.Errorf("setting the MAC of %s: %w", sandboxIf, err)
		}
	}
	// No IPv6 link-local address on the tap: S's stack stays silent there.
	_ = h.LinkSetIP6AddrGenMode(tap, 1) // IN6_ADDR_GEN_MODE_NONE
	if err := h.LinkSetMTU(tap, eth0.Attrs().MTU); err != nil {
		return err
	}
	for _, p := range [][2]netlink.Link{{eth0, tap}, {tap, eth0}} {
		from, to := p[0].Attrs().Index, p[1].Attrs().Index
		q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: from,
			Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
		if err := h.QdiscAdd(q); err != nil {
			return fmt.Errorf("adding an ingress qdisc: %w", err)
		}
		f := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: from, Parent: netlink.MakeHandle(0xffff, 0),
			Priority: 1, Protocol: unix.ETH_P_ALL}, RedirIndex: to} // nil Sel: match all
		if err := h.FilterAdd(f); err != nil {
			return fmt.Errorf("adding a redirect filter: %w", err)
		}
	}
	for _, l := range []netlink.Link{tap, eth0} {
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
	}
	return nil
}
