package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/network"
)

// testNetworks is an in-memory Networks: it allocates addresses and host
// ports and records what the daemon asked for.
type testNetworks struct {
	mu         sync.Mutex
	atts       map[string]*network.Attachment
	next       int
	failSetup  error
	reconciled [][]string
}

func newTestNetworks() *testNetworks { return &testNetworks{atts: map[string]*network.Attachment{}} }

func (n *testNetworks) Setup(ctx context.Context, req network.Request) (*network.Attachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.failSetup; err != nil {
		n.failSetup = nil
		return nil, err
	}
	if _, ok := n.atts[req.ID]; ok {
		return nil, fmt.Errorf("network %s: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	n.next++
	inner := req.InnerAddr
	if !inner.IsValid() {
		inner = netip.AddrFrom4([4]byte{10, 78, 0, byte(1 + n.next)})
	}
	att := &network.Attachment{
		ID: req.ID, Policy: req.Policy, NetnsPath: "/run/netns/test-s-" + req.ID, Interface: "eth0",
		Inner: netip.PrefixFrom(inner, 16), Gateway: netip.MustParseAddr("10.78.0.1"),
		Outer:      netip.AddrFrom4([4]byte{10, 77, 0, byte(1 + n.next)}),
		ResolvConf: []byte("# test\n"), Hosts: fmt.Appendf(nil, "%s\t%s\n", inner, req.Hostname),
	}
	for i, p := range req.Ports {
		if p.HostPort == 0 {
			p.HostPort = 40000 + 10*n.next + i
		}
		att.Ports = append(att.Ports, p)
	}
	n.atts[req.ID] = att
	return att, nil
}

func (n *testNetworks) Teardown(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.atts, id)
	return nil
}

func (n *testNetworks) Reconcile(ctx context.Context, keep []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.reconciled = append(n.reconciled, slices.Clone(keep))
	for id := range n.atts {
		if !slices.Contains(keep, id) {
			delete(n.atts, id)
		}
	}
	return nil
}

func (n *testNetworks) RemoveAll(ctx context.Context) error { return n.Reconcile(ctx, nil) }
func (n *testNetworks) Close() error                        { return nil }

func (n *testNetworks) has(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.atts[id]
	return ok
}

func TestNetworkPlumbing(t *testing.T) {
	eng := newTestEngine(true)
	eng.network = true
	nets := newTestNetworks()
	cfg := testConfig(t, t.TempDir())
	h := startDaemonNet(t, cfg, eng, nets)

	var web v1.Sandbox
	if code, e := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: "web", Ports: []v1.Port{{Port: 8080}}}, &web); code != 201 {
		t.Fatalf("create: %d %+v", code, e)
	}
	if web.Network == nil || web.Network.Policy != "isolated" || web.Network.Address == "" || len(web.Ports) != 1 || web.Ports[0].HostPort == 0 {
		t.Fatalf("web network %+v ports %+v, want isolated with a published port", web.Network, web.Ports)
	}
	eng.mu.Lock()
	ns, hosts := eng.sbs[web.ID].netns, string(eng.sbs[web.ID].files["/etc/hosts"])
	eng.mu.Unlock()
	if ns != "/run/netns/test-s-"+web.ID {
		t.Errorf("engine netns = %q, want the attachment's", ns)
	}
	if !strings.Contains(hosts, "\tweb") {
		t.Errorf("/etc/hosts = %q, want the sandbox's name", hosts)
	}

	var res v1.ForkResult
	if code, e := h.do("POST", "/v1/sandboxes/web/fork", v1.ForkRequest{Count: 2}, &res); code/100 != 2 {
		t.Fatalf("fork: %d %+v", code, e)
	}
	ports := map[int]bool{web.Ports[0].HostPort: true}
	for _, c := range res.Children {
		if c.Sandbox.Network == nil || c.Sandbox.Network.Address != web.Network.Address || c.Sandbox.Network.Outer == web.Network.Outer {
			t.Errorf("child network %+v, want the parent's address %s and its own outer", c.Sandbox.Network, web.Network.Address)
		}
		if len(c.Sandbox.Ports) != 1 || c.Sandbox.Ports[0].Port != 8080 || ports[c.Sandbox.Ports[0].HostPort] {
			t.Errorf("child ports %+v, want 8080 on a host port of its own", c.Sandbox.Ports)
		}
		ports[c.Sandbox.Ports[0].HostPort] = true
		eng.mu.Lock()
		hosts := string(eng.sbs[c.Sandbox.ID].files["/etc/hosts"])
		eng.mu.Unlock()
		if !strings.Contains(hosts, "\t"+c.Sandbox.Name) {
			t.Errorf("child /etc/hosts = %q, want its own name %s", hosts, c.Sandbox.Name)
		}
	}

	bad := []struct {
		name string
		path string
		body any
	}{
		{"fork with a fixed host port for 2", "/v1/sandboxes/web/fork", v1.ForkRequest{Count: 2, Ports: []v1.Port{{HostPort: 5555, Port: 80}}}},
		{"unknown policy", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Network: "open"}},
		{"allow without egress", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Allow: []string{"10.0.0.0/8"}}},
		{"bad allow", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Network: "egress", Allow: []string{"nope"}}},
		{"ports with none", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Network: "none", Ports: []v1.Port{{Port: 80}}}},
		{"bad port", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Ports: []v1.Port{{Port: 70000}}}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if code, e := h.do("POST", tc.path, tc.body, nil); code != 400 {
				t.Errorf("got %d %+v, want 400", code, e)
			}
		})
	}

	var none v1.Sandbox
	if code, e := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Network: "none"}, &none); code != 201 {
		t.Fatalf("create none: %d %+v", code, e)
	}
	if none.Network == nil || none.Network.Policy != "none" || nets.has(none.ID) {
		t.Errorf("none sandbox network %+v (set up: %v), want policy none and no setup", none.Network, nets.has(none.ID))
	}

	// A failed create tears its network down.
	eng.mu.Lock()
	eng.failCreate = fmt.Errorf("boom")
	eng.mu.Unlock()
	if code, _ := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: "failing"}, nil); code == 201 {
		t.Fatalf("create with a failing engine succeeded")
	}
	nets.mu.Lock()
	n := len(nets.atts)
	nets.mu.Unlock()
	if n != 3 {
		t.Errorf("%d networks after a failed create, want 3 (web and its children)", n)
	}
	// A failed network setup leaves no record.
	nets.mu.Lock()
	nets.failSetup = fmt.Errorf("no: %w", errdefs.ErrResourceExhausted)
	nets.mu.Unlock()
	if code, _ := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: "nonet"}, nil); code == 201 {
		t.Fatalf("create with a failing network succeeded")
	}
	if _, code := h.get("nonet"); code != 404 {
		t.Errorf("sandbox of a failed network setup: %d, want 404", code)
	}

	// A snapshot restores with the same address.
	if code, e := h.do("POST", "/v1/sandboxes/web/snapshots", v1.SnapshotRequest{Name: "snap"}, nil); code/100 != 2 {
		t.Fatalf("snapshot: %d %+v", code, e)
	}
	var rres v1.ForkResult
	if code, e := h.do("POST", "/v1/snapshots/snap/restore", v1.RestoreRequest{}, &rres); code/100 != 2 {
		t.Fatalf("restore: %d %+v", code, e)
	}
	if got := rres.Children[0].Sandbox.Network; got == nil || got.Address != web.Network.Address {
		t.Errorf("restored network %+v, want address %s", got, web.Network.Address)
	}

	// Delete tears down; a restart reconciles with the records it keeps.
	child := res.Children[0].Sandbox.ID
	if code, e := h.do("DELETE", "/v1/sandboxes/"+child, nil, nil); code/100 != 2 {
		t.Fatalf("delete: %d %+v", code, e)
	}
	if nets.has(child) {
		t.Errorf("network of deleted %s still set up", child)
	}
	h.stop()
	h = startDaemonNet(t, cfg, eng, nets)
	nets.mu.Lock()
	last := nets.reconciled[len(nets.reconciled)-1]
	nets.mu.Unlock()
	want := []string{web.ID, res.Children[1].Sandbox.ID, rres.Children[0].Sandbox.ID}
	slices.Sort(last)
	slices.Sort(want)
	if !slices.Equal(last, want) {
		t.Errorf("Reconcile kept %v, want %v", last, want)
	}
}

func TestNetworkPolicyDefaultsToNoneWithoutEngineSupport(t *testing.T) {
	eng := newTestEngine(false) // no Capabilities.Network
	nets := newTestNetworks()
	h := startDaemonNet(t, testConfig(t, t.TempDir()), eng, nets)
	var sb v1.Sandbox
	if code, e := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox"}, &sb); code != 201 {
		t.Fatalf("create: %d %+v", code, e)
	}
	if sb.Network == nil || sb.Network.Policy != "none" {
		t.Errorf("network %+v, want none", sb.Network)
	}
	code, e := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Network: "isolated"}, nil)
	if code != 400 || !strings.Contains(e.Error, "supports --network none only") {
		t.Errorf("isolated on an engine without networking: %d %+v, want 400 naming the limit", code, e)
	}
}

func TestNetworkConfigDerived(t *testing.T) {
	a := DefaultConfig()
	a.StateDir = t.TempDir()
	b := DefaultConfig()
	b.StateDir = t.TempDir()
	na, err := networkConfig(&a)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := networkConfig(&b)
	if err != nil {
		t.Fatal(err)
	}
	// Distinct with high probability (a hash); a bridge already on the
	// host is always avoided.
	if na.Prefix == nb.Prefix {
		t.Errorf("two state dirs share a prefix: %+v %+v", na, nb)
	}
	for _, nc := range []network.Config{na, nb} {
		if nc.Subnet.Bits() != 24 || !derivedPool.Contains(nc.Subnet.Addr()) {
			t.Errorf("derived subnet %s, want a /24 of %s", nc.Subnet, derivedPool)
		}
	}
	if err := na.Validate(); err != nil {
		t.Errorf("derived config invalid: %v", err)
	}
	again, _ := networkConfig(&a)
	if again.Subnet != na.Subnet || again.Prefix != na.Prefix {
		t.Errorf("derived config not stable: %+v then %+v", na, again)
	}
	def := DefaultConfig()
	nd, _ := networkConfig(&def)
	if nd.Prefix != "k7" || nd.Subnet.IsValid() {
		t.Errorf("default state dir: %+v, want prefix k7 and the default subnet", nd)
	}
}
