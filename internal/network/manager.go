package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/errdefs"
)

// Interface names inside the namespaces.
const (
	eth0If = "eth0" // in S, the sandbox's interface
	gwIf   = "gw"   // in R, eth0's peer, carries the gateway
	upIf   = "up"   // in R, the host veth's peer, carries the outer address
)

// gwMAC is the MAC of every router's gw. A fork child's guest kernel (QEMU)
// wakes with the gateway's MAC in its neighbour cache; with the same MAC in
// every R it stays right. Routers never share a segment, so they never
// clash.
var gwMAC = net.HardwareAddr{0x02, 0x6b, 0x37, 0x00, 0x00, 0x01}

// Manager owns the sandbox networks of one daemon: the bridge, the host
// nftables table, the namespaces and the published-port proxies. It is safe
// for concurrent use.
type Manager struct {
	cfg        Config
	log        *slog.Logger
	bridge     string
	bridgeAddr netip.Addr
	gateway    netip.Addr

	mu      sync.Mutex
	recs    map[string]*record
	proxies map[string][]*proxy
	fwdDone bool
}

// New returns a Manager for cfg, creating the bridge and the host nftables
// table if needed and loading the persisted allocations. It may be called
// again after a restart: existing sandboxes are kept; call Reconcile next.
// Published ports are not re-opened until Reconcile.
func New(cfg Config, log *slog.Logger) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg:        cfg,
		log:        log,
		bridge:     cfg.Prefix + "br",
		bridgeAddr: nth(cfg.Subnet, 1),
		gateway:    nth(cfg.Inner, 1),
		proxies:    map[string][]*proxy{},
	}
	recs, err := loadState(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	m.recs = recs
	if err := ensureNetnsDir(); err != nil {
		return nil, err
	}
	if err := m.ensureBridge(); err != nil {
		return nil, err
	}
	if err := hostRules(cfg.Prefix, m.bridge, cfg.Subnet); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Manager) ensureBridge() error {
	l, err := netlink.LinkByName(m.bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("looking up bridge %s: %w", m.bridge, err)
		}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: m.bridge}}); err != nil {
			return fmt.Errorf("creating bridge %s: %w", m.bridge, err)
		}
		if l, err = netlink.LinkByName(m.bridge); err != nil {
			return fmt.Errorf("looking up bridge %s: %w", m.bridge, err)
		}
	}
	addr := &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(m.bridgeAddr, m.cfg.Subnet.Bits()))}
	if err := netlink.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("addressing bridge %s: %w", m.bridge, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bringing up bridge %s: %w", m.bridge, err)
	}
	return writeSysctls(netns.None(), "net/ipv4/conf/"+m.bridge+"/forwarding", "1")
}

func (m *Manager) sName(id string) string { return m.cfg.Prefix + "-s-" + id }
func (m *Manager) rName(id string) string { return m.cfg.Prefix + "-r-" + id }
func (m *Manager) alias(id string) string { return m.cfg.Prefix + ":" + id }
func (m *Manager) hostIf(outer netip.Addr) string {
	return fmt.Sprintf("%sv%x", m.cfg.Prefix, offset(m.cfg.Subnet, outer))
}

// Setup creates the network of sandbox req.ID: its namespace, router,
// addresses, rules and published ports. When it fails nothing is left. The
// caller removes the network with Teardown. An ID already set up is
// ErrAlreadyExists.
func (m *Manager) Setup(ctx context.Context, req Request) (_ *Attachment, retErr error) {
	rec, err := m.reserve(req)
	if err != nil {
		return nil, err
	}
	log := m.log.With("sandbox", req.ID)
	var steps []any
	step := func(name string, fn func() error) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		start := time.Now()
		err := fn()
		steps = append(steps, name, time.Since(start))
		if err != nil {
			return fmt.Errorf("setting up network of sandbox %q: %s: %w", req.ID, name, err)
		}
		return nil
	}
	var proxies []*proxy
	defer func() {
		if retErr == nil {
			return
		}
		for _, p := range proxies {
			p.close()
		}
		if err := m.removeNet(req.ID, rec); err != nil {
			log.Warn("cleaning up failed network setup", "err", err)
		}
		m.mu.Lock()
		delete(m.recs, req.ID)
		m.mu.Unlock()
	}()

	sNS, rNS := netns.None(), netns.None()
	defer func() {
		if sNS != netns.None() {
			sNS.Close()
		}
		if rNS != netns.None() {
			rNS.Close()
		}
	}()
	var hS, hR *netlink.Handle
	defer func() {
		if hS != nil {
			hS.Close()
		}
		if hR != nil {
			hR.Close()
		}
	}()

	if err := step("sandbox-netns", func() (err error) {
		if sNS, err = createNS(m.sName(req.ID)); err != nil {
			return err
		}
		if hS, err = netlink.NewHandleAt(sNS); err != nil {
			return err
		}
		return linkUp(hS, "lo")
	}); err != nil {
		return nil, err
	}
	if rec.Policy != PolicyNone {
		if err := step("router-netns", func() (err error) {
			if rNS, err = createNS(m.rName(req.ID)); err != nil {
				return err
			}
			if err := writeSysctls(rNS,
				"net/ipv6/conf/all/disable_ipv6", "1",
				"net/ipv6/conf/default/disable_ipv6", "1",
				"net/ipv4/ip_forward", "1"); err != nil {
				return err
			}
			if hR, err = netlink.NewHandleAt(rNS); err != nil {
				return err
			}
			return linkUp(hR, "lo")
		}); err != nil {
			return nil, err
		}
		if err := step("inner-veth", func() error {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: gwIf, HardwareAddr: gwMAC}, PeerName: eth0If, PeerNamespace: netlink.NsFd(sNS)}
			if err := hR.LinkAdd(v); err != nil {
				return err
			}
			if err := addrUp(hR, gwIf, netip.PrefixFrom(m.gateway, m.cfg.Inner.Bits())); err != nil {
				return err
			}
			if err := addrUp(hS, eth0If, netip.PrefixFrom(rec.Inner, m.cfg.Inner.Bits())); err != nil {
				return err
			}
			return defaultRoute(hS, eth0If, m.gateway)
		}); err != nil {
			return nil, err
		}
		if err := step("outer-veth", func() error {
			br, err := netlink.LinkByName(m.bridge)
			if err != nil {
				return err
			}
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: rec.HostIf, MasterIndex: br.Attrs().Index},
				PeerName: upIf, PeerNamespace: netlink.NsFd(rNS)}
			if err := netlink.LinkAdd(v); err != nil {
				return err
			}
			if err := netlink.LinkSetAlias(v, m.alias(req.ID)); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(v); err != nil {
				return err
			}
			if err := addrUp(hR, upIf, netip.PrefixFrom(rec.Outer, m.cfg.Subnet.Bits())); err != nil {
				return err
			}
			return defaultRoute(hR, upIf, m.bridgeAddr)
		}); err != nil {
			return nil, err
		}
		if err := step("rules", func() error {
			if rec.Policy == PolicyEgress {
				m.enableForwarding(log)
			}
			return routerRules(rNS, routerSpec{table: m.cfg.Prefix, inner: rec.Inner, outer: rec.Outer,
				policy: rec.Policy, allow: rec.Allow, ports: rec.Ports, subnet: m.cfg.Subnet, dns: m.cfg.DNS})
		}); err != nil {
			return nil, err
		}
		if err := step("ports", func() error {
			var err error
			proxies, err = m.openPorts(rec, log)
			return err
		}); err != nil {
			return nil, err
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	rec.pending = false
	if err := saveState(m.cfg.StateDir, m.recs); err != nil {
		rec.pending = true
		return nil, err
	}
	if len(proxies) > 0 {
		m.proxies[req.ID] = proxies
	}
	log.Debug("network set up", steps...)
	return m.attachment(rec), nil
}

// reserve validates req and records its allocation as pending.
func (m *Manager) reserve(req Request) (*record, error) {
	if !idRE.MatchString(req.ID) {
		return nil, fmt.Errorf("sandbox id %q: %w", req.ID, errdefs.ErrInvalidArgument)
	}
	pol, err := ParsePolicy(string(req.Policy))
	if err != nil {
		return nil, err
	}
	host := req.Hostname
	if host == "" {
		host = req.ID
		if !hostnameRE.MatchString(host) {
			host = "sandbox"
		}
	}
	if !hostnameRE.MatchString(host) {
		return nil, fmt.Errorf("hostname %q: %w", host, errdefs.ErrInvalidArgument)
	}
	if len(req.Allow) > 0 && pol != PolicyEgress {
		return nil, fmt.Errorf("an egress allow list needs policy egress, not %s: %w", pol, errdefs.ErrInvalidArgument)
	}
	if len(req.Ports) > 0 && pol == PolicyNone {
		return nil, fmt.Errorf("published ports need a network, policy is none: %w", errdefs.ErrInvalidArgument)
	}
	ports := make([]Port, len(req.Ports))
	for i, p := range req.Ports {
		if err := p.validate(); err != nil {
			return nil, err
		}
		p.Protocol = "tcp"
		ports[i] = p
	}
	for _, a := range req.Allow {
		if !a.Prefix.IsValid() || !a.Prefix.Addr().Is4() || a.Port < 0 || a.Port > 65535 {
			return nil, fmt.Errorf("egress allow %v: %w", a, errdefs.ErrInvalidArgument)
		}
	}
	if req.InnerAddr.IsValid() && !usable(m.cfg.Inner, req.InnerAddr) {
		return nil, fmt.Errorf("inner address %s: not a host address in %s: %w", req.InnerAddr, m.cfg.Inner, errdefs.ErrInvalidArgument)
	}
	rec := &record{ID: req.ID, Policy: pol, Hostname: host, Ports: ports, pending: true}
	for _, a := range req.Allow {
		rec.Allow = append(rec.Allow, Allow{Prefix: a.Prefix.Masked(), Port: a.Port})
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[req.ID]; ok {
		return nil, fmt.Errorf("network of sandbox %q: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	if pol != PolicyNone {
		inner, outer := map[netip.Addr]bool{}, map[netip.Addr]bool{}
		for _, r := range m.recs {
			inner[r.Inner], outer[r.Outer] = true, true
		}
		rec.Inner = req.InnerAddr
		if !rec.Inner.IsValid() {
			if rec.Inner, err = allocate(m.cfg.Inner, inner); err != nil {
				return nil, err
			}
		}
		if rec.Outer, err = allocate(m.cfg.Subnet, outer); err != nil {
			return nil, err
		}
		rec.HostIf = m.hostIf(rec.Outer)
	}
	m.recs[req.ID] = rec
	return rec, nil
}

// openPorts starts rec's published-port proxies, filling in free host ports.
func (m *Manager) openPorts(rec *record, log *slog.Logger) ([]*proxy, error) {
	var out []*proxy
	for i, p := range rec.Ports {
		px, err := listenProxy(p.HostPort, netip.AddrPortFrom(rec.Outer, uint16(p.Port)), log)
		if err != nil {
			for _, o := range out {
				o.close()
			}
			return nil, err
		}
		rec.Ports[i].HostPort = px.hostPort()
		out = append(out, px)
	}
	return out, nil
}

func (m *Manager) enableForwarding(log *slog.Logger) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.KeepIPForward || m.fwdDone {
		return
	}
	m.fwdDone = true
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return
	}
	if err := writeSysctls(netns.None(), "net/ipv4/ip_forward", "1"); err != nil {
		log.Warn("enabling net.ipv4.ip_forward for egress", "err", err)
		return
	}
	log.Info("enabled net.ipv4.ip_forward for egress")
}

func (m *Manager) attachment(rec *record) *Attachment {
	a := &Attachment{
		ID:         rec.ID,
		Policy:     rec.Policy,
		NetnsPath:  netnsDir + "/" + m.sName(rec.ID),
		Ports:      slices.Clone(rec.Ports),
		ResolvConf: resolvConf(rec.Policy, m.cfg.DNS),
		Hosts:      hostsFile(rec.Hostname, rec.Inner),
	}
	if rec.Policy != PolicyNone {
		a.Interface = eth0If
		a.Inner = netip.PrefixFrom(rec.Inner, m.cfg.Inner.Bits())
		a.Gateway = m.gateway
		a.Outer = rec.Outer
	}
	return a
}

// Get returns the attachment of sandbox id as recorded, or ErrNotFound.
func (m *Manager) Get(ctx context.Context, id string) (*Attachment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok || rec.pending {
		return nil, fmt.Errorf("network of sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return m.attachment(rec), nil
}

// Teardown removes the network of sandbox id: proxies, namespaces, veths and
// its addresses. It is idempotent and also removes leftovers of an id the
// Manager has no record of. The sandbox's processes should be gone first;
// a process still holding the sandbox namespace keeps it (and nothing else)
// alive.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	m.mu.Lock()
	rec := m.recs[id]
	if rec != nil && rec.pending {
		m.mu.Unlock()
		return fmt.Errorf("tearing down network of sandbox %q: setup in progress: %w", id, errdefs.ErrConflict)
	}
	ps := m.proxies[id]
	delete(m.proxies, id)
	m.mu.Unlock()
	for _, p := range ps {
		p.close()
	}
	if err := m.removeNet(id, rec); err != nil {
		return fmt.Errorf("tearing down network of sandbox %q: %w", id, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec == nil {
		return nil
	}
	delete(m.recs, id)
	return saveState(m.cfg.StateDir, m.recs)
}

// removeNet deletes id's host veth and namespaces. rec may be nil.
func (m *Manager) removeNet(id string, rec *record) error {
	var errs []error
	var names []string
	if rec != nil && rec.HostIf != "" {
		names = append(names, rec.HostIf)
	}
	if rec == nil {
		links, err := netlink.LinkList()
		if err != nil {
			errs = append(errs, err)
		}
		for _, l := range links {
			if l.Attrs().Alias == m.alias(id) && m.ownsLinkName(l.Attrs().Name) {
				names = append(names, l.Attrs().Name)
			}
		}
	}
	for _, n := range names {
		if l, err := netlink.LinkByName(n); err == nil {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("deleting %s: %w", n, err))
			}
		}
	}
	if err := deleteNS(m.rName(id)); err != nil {
		errs = append(errs, err)
	}
	if err := deleteNS(m.sName(id)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ownsLinkName reports whether name is one of this Manager's host veths.
func (m *Manager) ownsLinkName(name string) bool {
	rest, ok := strings.CutPrefix(name, m.cfg.Prefix+"v")
	if !ok || rest == "" {
		return false
	}
	for _, c := range rest {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// List returns the IDs that have a network, recorded or left over (a
// namespace or host veth carrying the prefix), sorted.
func (m *Manager) List(ctx context.Context) ([]string, error) {
	set := map[string]bool{}
	m.mu.Lock()
	for id, r := range m.recs {
		if !r.pending {
			set[id] = true
		}
	}
	pending := map[string]bool{}
	for id, r := range m.recs {
		if r.pending {
			pending[id] = true
		}
	}
	m.mu.Unlock()
	ents, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listing %s: %w", netnsDir, err)
	}
	for _, e := range ents {
		for _, p := range []string{m.sName(""), m.rName("")} {
			if id, ok := strings.CutPrefix(e.Name(), p); ok && id != "" && !pending[id] {
				set[id] = true
			}
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		if id, ok := strings.CutPrefix(l.Attrs().Alias, m.alias("")); ok && m.ownsLinkName(l.Attrs().Name) && !pending[id] {
			set[id] = true
		}
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Reconcile brings the host in line with keep, the sandboxes the daemon still
// has: it tears down every other network (returning its addresses to the
// pool), deletes stray host veths, and re-opens the published ports of kept
// sandboxes that have none open (after a daemon restart, on the same host
// ports). Kept IDs without a record are left alone and reported. It may be
// repeated.
func (m *Manager) Reconcile(ctx context.Context, keep []string) error {
	ids, err := m.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		if slices.Contains(keep, id) {
			continue
		}
		m.log.Info("removing network of unknown sandbox", "sandbox", id)
		if err := m.Teardown(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	// Host veths whose alias was never set (a crash mid-Setup).
	m.mu.Lock()
	owned := map[string]bool{}
	for _, r := range m.recs {
		owned[r.HostIf] = true
	}
	m.mu.Unlock()
	links, err := netlink.LinkList()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if n := l.Attrs().Name; m.ownsLinkName(n) && !owned[n] {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("deleting stray %s: %w", n, err))
			}
		}
	}
	for _, id := range keep {
		m.mu.Lock()
		rec := m.recs[id]
		_, open := m.proxies[id]
		m.mu.Unlock()
		if rec == nil || rec.pending {
			m.log.Warn("kept sandbox has no network record", "sandbox", id)
			errs = append(errs, fmt.Errorf("network of kept sandbox %q: %w", id, errdefs.ErrNotFound))
			continue
		}
		if open || len(rec.Ports) == 0 {
			continue
		}
		ps, err := m.openPorts(rec, m.log.With("sandbox", id))
		if err != nil {
			errs = append(errs, fmt.Errorf("re-publishing ports of sandbox %q: %w", id, err))
			continue
		}
		m.mu.Lock()
		m.proxies[id] = ps
		m.mu.Unlock()
	}
	return errors.Join(errs...)
}

// PrepareRestore readies sandbox id's namespace for a runsc restore into it:
// runsc took eth0's address when the previous sandbox started, so it is added
// back, with the link up and the default route. It may be repeated.
func (m *Manager) PrepareRestore(ctx context.Context, id string) error {
	m.mu.Lock()
	rec := m.recs[id]
	m.mu.Unlock()
	if rec == nil || rec.pending {
		return fmt.Errorf("network of sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if rec.Policy == PolicyNone {
		return nil
	}
	ns, err := openNS(m.sName(id))
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := addrUp(h, eth0If, netip.PrefixFrom(rec.Inner, m.cfg.Inner.Bits())); err != nil {
		return fmt.Errorf("preparing restore of sandbox %q: %w", id, err)
	}
	if err := defaultRoute(h, eth0If, m.gateway); err != nil {
		return fmt.Errorf("preparing restore of sandbox %q: %w", id, err)
	}
	return nil
}

// Close stops the published-port proxies and leaves every namespace, the
// bridge and the rules in place (a daemon shutdown). The Manager must not be
// used afterwards.
func (m *Manager) Close() error {
	m.mu.Lock()
	ps := m.proxies
	m.proxies = map[string][]*proxy{}
	m.mu.Unlock()
	for _, l := range ps {
		for _, p := range l {
			p.close()
		}
	}
	return nil
}

// RemoveAll tears down every network of this Manager's prefix, then the
// bridge, the host nftables table and the state file (k7d --cleanup). The
// Manager must not be used afterwards.
func (m *Manager) RemoveAll(ctx context.Context) error {
	errs := []error{m.Reconcile(ctx, nil)}
	_ = m.Close()
	if l, err := netlink.LinkByName(m.bridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("deleting bridge %s: %w", m.bridge, err))
		}
	}
	if err := deleteTable(netns.None(), m.cfg.Prefix); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(statePath(m.cfg.StateDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
