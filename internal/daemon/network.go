package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/network"
	"github.com/k7-dev/k7/internal/store"
)

// Networks is what the daemon needs of the network manager
// (*network.Manager); tests replace it with an in-memory double.
type Networks interface {
	Setup(ctx context.Context, req network.Request) (*network.Attachment, error)
	Teardown(ctx context.Context, id string) error
	Reconcile(ctx context.Context, keep []string) error
	RemoveAll(ctx context.Context) error
	Close() error
}

// derivedPool is where daemons with a state dir other than the default
// take their outer subnet: one /24 chosen by a hash of the state dir, so
// that daemons side by side do not collide.
var derivedPool = netip.MustParsePrefix("10.80.0.0/12")

// networkConfig derives the network manager's configuration from the
// daemon's: the default state dir uses prefix "k7" and network.DefaultSubnet;
// any other uses "k7" plus 4 hex digits of a hash of the state dir and a /24
// of derivedPool, chosen once (avoiding host addresses) and kept in
// StateDir/network/subnet. --subnet overrides the subnet.
func networkConfig(cfg *Config) (network.Config, error) {
	dir := filepath.Join(cfg.StateDir, "network")
	nc := network.Config{StateDir: dir}
	if cfg.Subnet != "" {
		p, err := netip.ParsePrefix(cfg.Subnet)
		if err != nil {
			return nc, fmt.Errorf("--subnet %q: %v: %w", cfg.Subnet, err, errdefs.ErrInvalidArgument) //nolint:errorlint // classified by the sentinel alone: err's own class must not leak
		}
		nc.Subnet = p
	}
	if cfg.StateDir == DefaultConfig().StateDir {
		nc.Prefix = network.DefaultPrefix
		return nc, nil
	}
	sum := sha256.Sum256([]byte(cfg.StateDir))
	nc.Prefix = network.DefaultPrefix + hex.EncodeToString(sum[:2])
	if nc.Subnet.IsValid() {
		return nc, nil
	}
	file := filepath.Join(dir, "subnet")
	if b, err := os.ReadFile(file); err == nil {
		if p, err := netip.ParsePrefix(strings.TrimSpace(string(b))); err == nil {
			nc.Subnet = p
			return nc, nil
		}
	}
	used := hostPrefixes()
	slots := uint32(1) << (24 - derivedPool.Bits())
	start := binary.BigEndian.Uint32(sum[2:6]) % slots
	base := binary.BigEndian.Uint32(derivedPool.Addr().AsSlice())
	for i := range slots {
		n := base + ((start+i)%slots)<<8
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], n)
		p := netip.PrefixFrom(netip.AddrFrom4(a), 24)
		if !slices.ContainsFunc(used, p.Overlaps) {
			nc.Subnet = p
			break
		}
	}
	if !nc.Subnet.IsValid() {
		return nc, fmt.Errorf("no free /24 in %s for the sandbox network; set --subnet: %w", derivedPool, errdefs.ErrResourceExhausted)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nc, err
	}
	if err := os.WriteFile(file, []byte(nc.Subnet.String()+"\n"), 0o600); err != nil {
		return nc, err
	}
	return nc, nil
}

// hostPrefixes returns the IPv4 prefixes of the host's interfaces.
func hostPrefixes() []netip.Prefix {
	addrs, _ := net.InterfaceAddrs()
	var out []netip.Prefix
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok && n.IP.To4() != nil {
				ones, _ := n.Mask.Size()
				out = append(out, netip.PrefixFrom(ip, ones).Masked())
			}
		}
	}
	return out
}

// initNetwork prepares the network manager: the one opts gave, else a
// network.Manager opened now if an earlier run left network state (so
// that Reconcile can clean up), else on first use (networks), so that a
// daemon whose sandboxes have no network never touches the host's.
func (d *Daemon) initNetwork(given Networks) {
	if given != nil {
		d.net = given
		d.netInfo = &v1.NetworkInfo{Bridge: "test", Subnet: "test", Inner: network.DefaultInner.String()}
		return
	}
	if _, err := os.Stat(filepath.Join(d.cfg.StateDir, "network")); err == nil {
		_, _ = d.networks()
	}
}

// networks returns the network manager, opening it on first use. Without
// one (no root, no nftables) only policy "none" works; the error says why.
func (d *Daemon) networks() (Networks, error) {
	d.netMu.Lock()
	defer d.netMu.Unlock()
	if d.net != nil || d.netErr != nil {
		return d.net, d.netErr
	}
	nc, err := networkConfig(&d.cfg)
	if err == nil {
		var m *network.Manager
		if m, err = network.New(nc, d.log.With("component", "network")); err == nil {
			d.net = m
			subnet := nc.Subnet
			if !subnet.IsValid() {
				subnet = network.DefaultSubnet
			}
			bridge := netip.PrefixFrom(subnet.Addr().Next(), subnet.Bits())
			d.netInfo = &v1.NetworkInfo{
				Bridge:  nc.Prefix + "br",
				Address: bridge.Addr().String(),
				Subnet:  bridge.Masked().String(),
				Inner:   network.DefaultInner.String(),
			}
			d.log.Info("sandbox network ready", "bridge", d.netInfo.Bridge, "subnet", d.netInfo.Subnet)
			return d.net, nil
		}
	}
	d.log.Warn("sandbox networking unavailable; only --network none works", "err", err)
	d.netErr = err
	d.netInfo = &v1.NetworkInfo{Reason: err.Error()}
	return nil, err
}

// openedNetworks returns the network manager if it is open, else nil.
func (d *Daemon) openedNetworks() Networks {
	d.netMu.Lock()
	defer d.netMu.Unlock()
	return d.net
}

// networkInfo describes the network for Info; nil before first use.
func (d *Daemon) networkInfo() *v1.NetworkInfo {
	d.netMu.Lock()
	defer d.netMu.Unlock()
	if d.netInfo == nil {
		return nil
	}
	n := *d.netInfo
	return &n
}

// netPlan is a validated network request.
type netPlan struct {
	policy network.Policy
	allow  []network.Allow
	ports  []network.Port
}

// planNetwork validates a sandbox's network request for engine eng. An
// empty policy is "isolated" on engines that join a namespace, else "none".
func (d *Daemon) planNetwork(eng engine.Engine, policy string, allow []string, ports []v1.Port) (netPlan, error) {
	var p netPlan
	if policy == "" && !eng.Capabilities().Network {
		policy = string(network.PolicyNone)
	}
	var err error
	if p.policy, err = network.ParsePolicy(policy); err != nil {
		return p, err
	}
	if p.policy != network.PolicyNone && !eng.Capabilities().Network {
		return p, fmt.Errorf("the %s engine supports --network none only: %w", eng.Name(), errdefs.ErrInvalidArgument)
	}
	for _, s := range allow {
		a, err := network.ParseAllow(s)
		if err != nil {
			return p, err
		}
		p.allow = append(p.allow, a)
	}
	if len(p.allow) > 0 && p.policy != network.PolicyEgress {
		return p, fmt.Errorf("--allow needs --network egress: %w", errdefs.ErrInvalidArgument)
	}
	if p.ports, err = planPorts(ports); err != nil {
		return p, err
	}
	if len(p.ports) > 0 && p.policy == network.PolicyNone {
		return p, fmt.Errorf("published ports need a network policy other than none: %w", errdefs.ErrInvalidArgument)
	}
	if p.policy != network.PolicyNone {
		if _, err := d.networks(); err != nil {
			return p, fmt.Errorf("network policy %s: sandbox networking is unavailable on this daemon: %v: %w", p.policy, err, errdefs.ErrUnavailable) //nolint:errorlint // classified by the sentinel alone: err's own class must not leak
		}
	}
	return p, nil
}

func planPorts(ports []v1.Port) ([]network.Port, error) {
	var out []network.Port
	seen := map[int]bool{}
	for _, vp := range ports {
		s := fmt.Sprintf("%d:%d", vp.HostPort, vp.Port)
		if vp.Protocol != "" {
			s += "/" + vp.Protocol
		}
		p, err := network.ParsePort(s)
		if err != nil {
			return nil, err
		}
		if p.HostPort != 0 && seen[p.HostPort] {
			return nil, fmt.Errorf("host port %d published twice: %w", p.HostPort, errdefs.ErrInvalidArgument)
		}
		seen[p.HostPort] = true
		out = append(out, p)
	}
	return out, nil
}

// setupNetwork sets up the network of sandbox id per plan; inner is the
// in-sandbox address to keep (a fork child's), or zero. The caller tears it
// down with teardownNetwork.
func (d *Daemon) setupNetwork(ctx context.Context, id, hostname string, plan netPlan, inner netip.Addr) (*network.Attachment, *store.Network, error) {
	nets, err := d.networks()
	if err != nil {
		return nil, nil, err
	}
	att, err := nets.Setup(ctx, network.Request{
		ID: id, Policy: plan.policy, Allow: plan.allow, Ports: plan.ports,
		Hostname: hostname, InnerAddr: inner,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("setting up network: %w", err)
	}
	sn := &store.Network{Policy: att.Policy.String()}
	if att.Inner.IsValid() {
		sn.Address = att.Inner.String()
	}
	if att.Gateway.IsValid() {
		sn.Gateway = att.Gateway.String()
	}
	if att.Outer.IsValid() {
		sn.Outer = att.Outer.String()
	}
	for _, a := range plan.allow {
		sn.Allow = append(sn.Allow, a.String())
	}
	for _, p := range att.Ports {
		sn.Ports = append(sn.Ports, store.Port{HostPort: p.HostPort, Port: p.Port, Protocol: p.Protocol})
	}
	return att, sn, nil
}

// teardownNetwork removes sandbox id's network, if it has one, logging
// failures (a restart's Reconcile retries).
func (d *Daemon) teardownNetwork(ctx context.Context, id string, n *store.Network) {
	nets := d.openedNetworks()
	if n == nil || nets == nil {
		return
	}
	if err := nets.Teardown(ctx, id); err != nil {
		d.sbLog(id).Warn("tearing down network", "err", err)
	}
}

// childPlan is the network plan of a fork or restore child of a sandbox
// whose network was n: the same policy and allow list, and ports (default:
// n's ports on fresh host ports).
func (d *Daemon) childPlan(eng engine.Engine, n *store.Network, ports []v1.Port, count int) (netPlan, netip.Addr, error) {
	if n == nil {
		if len(ports) > 0 {
			return netPlan{}, netip.Addr{}, fmt.Errorf("published ports need a network policy other than none: %w", errdefs.ErrInvalidArgument)
		}
		return netPlan{policy: network.PolicyNone}, netip.Addr{}, nil
	}
	if ports == nil {
		for _, p := range n.Ports {
			ports = append(ports, v1.Port{Port: p.Port, Protocol: p.Protocol})
		}
	}
	if count > 1 && slices.ContainsFunc(ports, func(p v1.Port) bool { return p.HostPort != 0 }) {
		return netPlan{}, netip.Addr{}, fmt.Errorf("host ports must be 0 (free) when starting %d children: %w", count, errdefs.ErrInvalidArgument)
	}
	plan, err := d.planNetwork(eng, n.Policy, n.Allow, ports)
	if err != nil {
		return plan, netip.Addr{}, err
	}
	var inner netip.Addr
	if n.Address != "" {
		p, err := netip.ParsePrefix(n.Address)
		if err != nil {
			return plan, inner, fmt.Errorf("recorded address %q: %w", n.Address, err)
		}
		inner = p.Addr()
	}
	return plan, inner, nil
}

// dnsFiles returns the /etc/resolv.conf and /etc/hosts of a sandbox.
func dnsFiles(att *network.Attachment, hostname string) map[string][]byte {
	if att != nil {
		return map[string][]byte{"/etc/resolv.conf": att.ResolvConf, "/etc/hosts": att.Hosts}
	}
	return map[string][]byte{
		"/etc/resolv.conf": []byte("# k7: no DNS (network policy none)\n"),
		"/etc/hosts":       fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", hostname),
	}
}

// writeDNS writes a sandbox's DNS files through its agent. A sandbox
// whose image has no writable /etc keeps running: the failure is logged.
func (d *Daemon) writeDNS(ctx context.Context, a Agent, id string, files map[string][]byte) {
	for _, p := range slices.Sorted(maps.Keys(files)) {
		if err := a.PutFile(ctx, p, 0o644, bytes.NewReader(files[p])); err != nil {
			d.sbLog(id).Warn("writing "+p, "err", err)
		}
	}
}

// apiNetwork converts a stored network to the API's.
func apiNetwork(n *store.Network) (*v1.Network, []v1.Port) {
	if n == nil {
		return &v1.Network{Policy: string(network.PolicyNone)}, nil
	}
	out := &v1.Network{Policy: n.Policy, Gateway: n.Gateway, Outer: n.Outer, Allow: n.Allow}
	if p, err := netip.ParsePrefix(n.Address); err == nil {
		out.Address = p.Addr().String()
	}
	var ports []v1.Port
	for _, p := range n.Ports {
		ports = append(ports, v1.Port{HostPort: p.HostPort, Port: p.Port, Protocol: p.Protocol})
	}
	return out, ports
}

// reconcileNetworks tears down the networks of sandboxes the store no
// longer has and re-opens the published ports of the others.
func (d *Daemon) reconcileNetworks(ctx context.Context) {
	nets := d.openedNetworks()
	if nets == nil {
		return
	}
	recs, err := d.store.ListSandboxes()
	if err != nil {
		d.log.Warn("reconciling networks: listing sandboxes", "err", err)
		return
	}
	var keep []string
	for _, r := range recs {
		if r.Network != nil {
			keep = append(keep, r.ID)
		}
	}
	if err := nets.Reconcile(ctx, keep); err != nil && !errors.Is(err, context.Canceled) {
		d.log.Warn("reconciling networks", "err", err)
	}
}
