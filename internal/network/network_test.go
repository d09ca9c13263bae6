package network

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/testutil"
)

// testInner is every test manager's inner subnet; it only exists inside
// namespaces the tests create.
var testInner = netip.MustParsePrefix("172.30.0.0/24")

// freeSubnet returns a random 10.2xx.y.0/bits prefix that overlaps no host
// route.
func freeSubnet(t *testing.T, bits int) netip.Prefix {
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		b := make([]byte, 3)
		rand.Read(b)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200 + b[0]%50, b[1], b[2]}), bits).Masked()
		ok := true
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			a, _ := netip.AddrFromSlice(r.Dst.IP.To4())
			if ones > 0 && netip.PrefixFrom(a, ones).Overlaps(p) {
				ok = false
			}
		}
		if ok {
			return p
		}
	}
	t.Fatal("no free test subnet")
	return netip.Prefix{}
}

func testPrefix() string {
	b := make([]byte, 2)
	rand.Read(b)
	return "kt" + hex.EncodeToString(b)
}

func testConfig(t *testing.T) Config {
	return Config{
		Prefix:        testPrefix(),
		Subnet:        freeSubnet(t, 24),
		Inner:         testInner,
		StateDir:      t.TempDir(),
		DNS:           []netip.Addr{},
		KeepIPForward: true,
	}
}

func newManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	testutil.RequiresRoot(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	m, err := New(cfg, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.RemoveAll(context.Background()); err != nil {
			t.Errorf("RemoveAll: %v", err)
		}
	})
	return m
}

func setup(t *testing.T, m *Manager, req Request) *Attachment {
	t.Helper()
	a, err := m.Setup(context.Background(), req)
	if err != nil {
		t.Fatalf("Setup(%s): %v", req.ID, err)
	}
	return a
}

// inPath runs fn on a thread inside the namespace at path.
func inPath(t *testing.T, path string, fn func() error) error {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	defer ns.Close()
	return inNS(ns, fn)
}

// serve listens on addr inside the namespace at path and greets every
// connection with greeting.
func serve(t *testing.T, path string, addr netip.AddrPort, greeting string) netip.AddrPort {
	t.Helper()
	var ln net.Listener
	listen := func() (err error) {
		ln, err = net.Listen("tcp4", addr.String())
		return err
	}
	var err error
	if path == "" {
		err = listen()
	} else {
		err = inPath(t, path, listen)
	}
	if err != nil {
		t.Fatalf("listening on %s in %q: %v", addr, path, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(greeting))
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// greet dials addr (from the namespace at path, or the host for "") and
// returns what the server says.
func greet(t *testing.T, path string, addr string) (string, error) {
	t.Helper()
	var c net.Conn
	dial := func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, 300*time.Millisecond)
		return err
	}
	var err error
	if path == "" {
		err = dial()
	} else {
		err = inPath(t, path, dial)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

func hostPortAddr(a *Attachment, i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.Ports[i].HostPort))
}

func TestPublishedPort(t *testing.T) {
	m := newManager(t, testConfig(t))
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fixed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	a := setup(t, m, Request{ID: "web", Ports: []Port{{Port: 8080}, {HostPort: fixed, Port: 9090}}})
	if a.Policy != PolicyIsolated || a.Ports[0].HostPort == 0 || a.Ports[1].HostPort != fixed {
		t.Fatalf("attachment = %+v, want isolated with host ports [free, %d]", a, fixed)
	}
	if !testInner.Contains(a.Inner.Addr()) || a.Gateway != nth(testInner, 1) || !m.cfg.Subnet.Contains(a.Outer) {
		t.Fatalf("addresses = inner %s gw %s outer %s", a.Inner, a.Gateway, a.Outer)
	}
	serve(t, a.NetnsPath, netip.AddrPortFrom(a.Inner.Addr(), 8080), "hello 8080")
	serve(t, a.NetnsPath, netip.AddrPortFrom(a.Inner.Addr(), 9090), "hello 9090")
	for i, want := range []string{"hello 8080", "hello 9090"} {
		if got, err := greet(t, "", hostPortAddr(a, i)); got != want || err != nil {
			t.Errorf("port %+v: got %q, %v; want %q", a.Ports[i], got, err, want)
		}
	}
	if _, err := m.Setup(context.Background(), Request{ID: "web"}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Setup(web) = %v, want ErrAlreadyExists", err)
	}
	if _, err := m.Setup(context.Background(), Request{ID: "clash", Ports: []Port{{HostPort: fixed, Port: 1}}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Setup with a taken host port = %v, want ErrConflict", err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, m.sName("clash"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed Setup left its namespace: %v", err)
	}
	if !bytes.Contains(a.Hosts, []byte(a.Inner.Addr().String()+"\tweb\n")) {
		t.Errorf("hosts = %q, want a line for web", a.Hosts)
	}
}

func TestForkChildrenShareInnerAddress(t *testing.T) {
	m := newManager(t, testConfig(t))
	parent := setup(t, m, Request{ID: "parent", Ports: []Port{{Port: 80}}})
	inner := parent.Inner.Addr()
	serve(t, parent.NetnsPath, netip.AddrPortFrom(inner, 80), "parent")
	var kids []*Attachment
	for _, id := range []string{"child1", "child2"} {
		a := setup(t, m, Request{ID: id, InnerAddr: inner, Ports: []Port{{Port: 80}}})
		if a.Inner != parent.Inner || a.Outer == parent.Outer {
			t.Fatalf("%s: inner %s outer %s; want inner %s and an outer other than %s", id, a.Inner, a.Outer, parent.Inner, parent.Outer)
		}
		serve(t, a.NetnsPath, netip.AddrPortFrom(inner, 80), id)
		kids = append(kids, a)
	}
	for _, a := range append([]*Attachment{parent}, kids...) {
		for range 3 {
			if got, err := greet(t, "", hostPortAddr(a, 0)); got != a.ID || err != nil {
				t.Errorf("%s via %s: got %q, %v", a.ID, hostPortAddr(a, 0), got, err)
			}
		}
	}
	// Tearing one child down leaves the others answering.
	if err := m.Teardown(context.Background(), "child1"); err != nil {
		t.Fatal(err)
	}
	for _, a := range []*Attachment{parent, kids[1]} {
		if got, err := greet(t, "", hostPortAddr(a, 0)); got != a.ID || err != nil {
			t.Errorf("after teardown of child1, %s: got %q, %v", a.ID, got, err)
		}
	}
}

func TestIsolated(t *testing.T) {
	m := newManager(t, testConfig(t))
	a := setup(t, m, Request{ID: "a", Ports: []Port{{Port: 80}}})
	b := setup(t, m, Request{ID: "b", Ports: []Port{{Port: 80}}})
	serve(t, a.NetnsPath, netip.AddrPortFrom(a.Inner.Addr(), 80), "a")
	serve(t, b.NetnsPath, netip.AddrPortFrom(b.Inner.Addr(), 80), "b")
	bridge := m.bridgeAddr
	onBridge := serve(t, "", netip.AddrPortFrom(bridge, 0), "host")
	onLo := serve(t, "", netip.MustParseAddrPort("127.0.0.1:0"), "host")
	if got, err := greet(t, "", onBridge.String()); got != "host" || err != nil {
		t.Fatalf("host listener on the bridge: got %q, %v", got, err)
	}
	if got, err := greet(t, "", hostPortAddr(a, 0)); got != "a" || err != nil {
		t.Fatalf("host to a: got %q, %v", got, err)
	}
	if got, err := greet(t, "", hostPortAddr(b, 0)); got != "b" || err != nil {
		t.Fatalf("host to b: got %q, %v", got, err)
	}
	for _, target := range []string{
		netip.AddrPortFrom(b.Outer, 80).String(),        // another sandbox
		netip.AddrPortFrom(b.Inner.Addr(), 80).String(), // its inner address
		onBridge.String(),  // the host on the bridge
		onLo.String(),      // host loopback (is a's own)
		hostPortAddr(b, 0), // b's published port
		netip.AddrPortFrom(a.Gateway, 80).String(), // the router
	} {
		if got, err := greet(t, a.NetnsPath, target); err == nil {
			t.Errorf("from isolated a, %s answered %q; want no connection", target, got)
		}
	}
}

func TestPolicyNone(t *testing.T) {
	m := newManager(t, testConfig(t))
	a := setup(t, m, Request{ID: "n", Policy: PolicyNone})
	if a.Outer.IsValid() || a.Inner.IsValid() || a.Interface != "" {
		t.Fatalf("attachment = %+v, want no addresses", a)
	}
	var names []string
	if err := inPath(t, a.NetnsPath, func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"lo"}) {
		t.Errorf("links in a none sandbox = %v, want [lo]", names)
	}
	if _, err := m.Setup(context.Background(), Request{ID: "np", Policy: PolicyNone, Ports: []Port{{Port: 1}}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("none with ports = %v, want ErrInvalidArgument", err)
	}
}

// targetNS creates a namespace standing for "the outside world": a veth from
// the host (<prefix>t0, 1st address of p) to two addresses (2nd and 3rd).
func targetNS(t *testing.T, prefix string, p netip.Prefix) (path string, addrs [2]netip.Addr) {
	t.Helper()
	name := prefix + "-target"
	ns, err := createNS(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	hostIf := prefix + "t0"
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
		_ = deleteNS(name)
	})
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	host, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	addrs = [2]netip.Addr{nth(p, 2), nth(p, 3)}
	for _, err := range []error{
		addrUp(host, hostIf, netip.PrefixFrom(nth(p, 1), p.Bits())),
		writeSysctls(netns.None(), "net/ipv4/conf/"+hostIf+"/forwarding", "1"),
		linkUp(h, "lo"),
		addrUp(h, "eth0", netip.PrefixFrom(addrs[0], p.Bits())),
		addrUp(h, "eth0", netip.PrefixFrom(addrs[1], p.Bits())),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(netnsDir, name), addrs
}

func TestEgressAllowList(t *testing.T) {
	cfg := testConfig(t)
	m := newManager(t, cfg)
	tpath, taddrs := targetNS(t, cfg.Prefix, freeSubnet(t, 29))
	for _, a := range taddrs {
		serve(t, tpath, netip.AddrPortFrom(a, 7000), "world "+a.String())
	}
	other := setup(t, m, Request{ID: "other", Ports: []Port{{Port: 80}}})
	serve(t, other.NetnsPath, netip.AddrPortFrom(other.Inner.Addr(), 80), "other")

	allowed := setup(t, m, Request{ID: "out", Policy: PolicyEgress, Allow: []Allow{{Prefix: netip.PrefixFrom(taddrs[0], 32), Port: 7000}}})
	want := "world " + taddrs[0].String()
	if got, err := greet(t, allowed.NetnsPath, netip.AddrPortFrom(taddrs[0], 7000).String()); got != want || err != nil {
		t.Errorf("egress to allowed %s: got %q, %v; want %q", taddrs[0], got, err, want)
	}
	for _, target := range []string{
		netip.AddrPortFrom(taddrs[1], 7000).String(),
		netip.AddrPortFrom(other.Outer, 80).String(),
		netip.AddrPortFrom(m.bridgeAddr, 22).String(),
	} {
		if got, err := greet(t, allowed.NetnsPath, target); err == nil {
			t.Errorf("egress (allow list) to %s answered %q; want no connection", target, got)
		}
	}

	open := setup(t, m, Request{ID: "open", Policy: PolicyEgress})
	want = "world " + taddrs[1].String()
	if got, err := greet(t, open.NetnsPath, netip.AddrPortFrom(taddrs[1], 7000).String()); got != want || err != nil {
		t.Errorf("egress (no list) to %s: got %q, %v; want %q", taddrs[1], got, err, want)
	}
	if got, err := greet(t, open.NetnsPath, netip.AddrPortFrom(other.Outer, 80).String()); err == nil {
		t.Errorf("egress (no list) reached another sandbox: %q", got)
	}
}

// snapshot returns the host's link list, named namespaces and nftables
// ruleset as text.
func snapshot(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	out, err := exec.Command("ip", "-o", "link").CombinedOutput()
	if err != nil {
		t.Fatalf("ip -o link: %v\n%s", err, out)
	}
	b.Write(out)
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		fmt.Fprintf(&b, "netns %s\n", e.Name())
	}
	if out, err := exec.Command("nft", "list", "ruleset").CombinedOutput(); err == nil {
		b.Write(out)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(tables, func(i, j int) bool { return tables[i].Name < tables[j].Name })
	for _, tb := range tables {
		fmt.Fprintf(&b, "table %d %s\n", tb.Family, tb.Name)
	}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "chain %s %s rules %d\n", ch.Table.Name, ch.Name, len(rules))
	}
	return b.String()
}

func TestCyclesLeaveNoTrace(t *testing.T) {
	testutil.RequiresRoot(t)
	cfg := testConfig(t)
	before := snapshot(t)
	m, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 50
	var setups, teardowns []time.Duration
	for i := range n {
		id := fmt.Sprintf("c%d", i)
		pol := []Policy{PolicyIsolated, PolicyEgress, PolicyNone}[i%3]
		req := Request{ID: id, Policy: pol}
		if pol != PolicyNone {
			req.Ports = []Port{{Port: 80}}
		}
		start := time.Now()
		if _, err := m.Setup(ctx, req); err != nil {
			_ = m.RemoveAll(ctx)
			t.Fatalf("cycle %d: Setup: %v", i, err)
		}
		setups = append(setups, time.Since(start))
		start = time.Now()
		if err := m.Teardown(ctx, id); err != nil {
			_ = m.RemoveAll(ctx)
			t.Fatalf("cycle %d: Teardown: %v", i, err)
		}
		teardowns = append(teardowns, time.Since(start))
		if err := m.Teardown(ctx, id); err != nil {
			t.Fatalf("cycle %d: second Teardown: %v", i, err)
		}
	}
	m.mu.Lock()
	left := len(m.recs)
	m.mu.Unlock()
	if left != 0 {
		t.Errorf("%d records left after %d cycles", left, n)
	}
	if err := m.RemoveAll(ctx); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t); after != before {
		t.Errorf("host state changed after %d cycles:\nbefore:\n%s\nafter:\n%s", n, before, after)
	}
	stats := func(d []time.Duration) string {
		s := slices.Clone(d)
		slices.Sort(s)
		return fmt.Sprintf("median %v, range %v-%v, n=%d", s[len(s)/2], s[0], s[len(s)-1], len(s))
	}
	t.Logf("setup (isolated/egress/none mixed): %s", stats(setups))
	t.Logf("teardown: %s", stats(teardowns))
}

func TestReconcileAfterCrash(t *testing.T) {
	cfg := testConfig(t)
	m1 := newManager(t, cfg)
	ctx := context.Background()
	keep := setup(t, m1, Request{ID: "keep", Ports: []Port{{Port: 80}}})
	gone := setup(t, m1, Request{ID: "gone", Ports: []Port{{Port: 80}}})
	_ = m1.Close() // the daemon dies: proxies go, namespaces stay
	ghost, err := createNS(m1.sName("ghost"))
	if err != nil {
		t.Fatal(err)
	}
	ghost.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: cfg.Prefix + "vfff0"}, PeerName: cfg.Prefix + "vfff1"}); err != nil {
		t.Fatal(err)
	}

	m2 := newManager(t, cfg)
	ids, err := m2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ghost", "gone", "keep"}; !slices.Equal(ids, want) {
		t.Fatalf("List after restart = %v, want %v", ids, want)
	}
	if err := m2.Reconcile(ctx, []string{"keep"}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if ids, _ := m2.List(ctx); !slices.Equal(ids, []string{"keep"}) {
		t.Errorf("List after Reconcile = %v, want [keep]", ids)
	}
	for _, n := range []string{cfg.Prefix + "vfff0", m1.hostIf(gone.Outer)} {
		if _, err := netlink.LinkByName(n); err == nil {
			t.Errorf("link %s survived Reconcile", n)
		}
	}
	if _, err := os.Stat(filepath.Join(netnsDir, m2.rName("gone"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("router namespace of gone survived: %v", err)
	}
	got, err := m2.Get(ctx, "keep")
	if err != nil || got.Ports[0].HostPort != keep.Ports[0].HostPort || got.Outer != keep.Outer {
		t.Fatalf("Get(keep) = %+v, %v; want ports and addresses of %+v", got, err, keep)
	}
	serve(t, keep.NetnsPath, netip.AddrPortFrom(keep.Inner.Addr(), 80), "kept")
	if got, err := greet(t, "", hostPortAddr(keep, 0)); got != "kept" || err != nil {
		t.Errorf("re-published port of keep: got %q, %v", got, err)
	}
	// gone's addresses are back in the pool.
	again := setup(t, m2, Request{ID: "again"})
	if again.Outer != gone.Outer || again.Inner != gone.Inner {
		t.Errorf("new sandbox got %s/%s, want gone's freed %s/%s", again.Outer, again.Inner, gone.Outer, gone.Inner)
	}
	if err := m2.Reconcile(ctx, []string{"keep", "again"}); err != nil {
		t.Errorf("repeated Reconcile: %v", err)
	}
}

func TestPrepareRestore(t *testing.T) {
	m := newManager(t, testConfig(t))
	a := setup(t, m, Request{ID: "r", Ports: []Port{{Port: 80}}})
	// What runsc does on start: take the address away.
	ns, err := netns.GetFromPath(a.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrDel(l, &netlink.Addr{IPNet: prefixNet(a.Inner)}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := m.PrepareRestore(context.Background(), "r"); err != nil {
			t.Fatalf("PrepareRestore: %v", err)
		}
	}
	serve(t, a.NetnsPath, netip.AddrPortFrom(a.Inner.Addr(), 80), "restored")
	if got, err := greet(t, "", hostPortAddr(a, 0)); got != "restored" || err != nil {
		t.Errorf("after PrepareRestore: got %q, %v", got, err)
	}
}

func TestConcurrentSetup(t *testing.T) {
	m := newManager(t, testConfig(t))
	const n = 8
	errc := make(chan error, n)
	atts := make([]*Attachment, n)
	for i := range n {
		go func() {
			var err error
			atts[i], err = m.Setup(context.Background(), Request{ID: fmt.Sprintf("p%d", i), Ports: []Port{{Port: 80}}})
			errc <- err
		}()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Fatalf("concurrent Setup: %v", err)
		}
	}
	seen := map[netip.Addr]bool{}
	for _, a := range atts {
		if seen[a.Outer] || seen[a.Inner.Addr()] {
			t.Fatalf("address handed out twice: %+v", a)
		}
		seen[a.Outer], seen[a.Inner.Addr()] = true, true
		serve(t, a.NetnsPath, netip.AddrPortFrom(a.Inner.Addr(), 80), a.ID)
	}
	for _, a := range atts {
		if got, err := greet(t, "", hostPortAddr(a, 0)); got != a.ID || err != nil {
			t.Errorf("%s: got %q, %v", a.ID, got, err)
		}
	}
}
