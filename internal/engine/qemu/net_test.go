package qemu

import (
	"bufio"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/testutil"
)

// testGwMAC is the MAC of every test router's gw, as the daemon's network
// manager gives all its routers one MAC.
var testGwMAC = net.HardwareAddr{0x02, 0x6b, 0x37, 0x00, 0x00, 0x01}

// sandboxNet is a pair of namespaces the test makes, like the daemon's: S
// with eth0 (addr, default route via gw) and R with gw, eth0's peer.
type sandboxNet struct {
	s, r string // names under /run/netns
}

func (n *sandboxNet) path() string { return "/run/netns/" + n.s }

// newSandboxNet makes S and R; with gw invalid, S gets eth0 without a
// default route. The test deletes both.
func newSandboxNet(t *testing.T, addr, gw string) *sandboxNet {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	n := &sandboxNet{s: "k7tqs" + id, r: "k7tqr" + id}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = orig.Close() }()
	defer func() { _ = netns.Set(orig) }()
	var hs, hr *netlink.Handle
	for _, name := range []string{n.s, n.r} {
		ns, err := netns.NewNamed(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netns.DeleteNamed(name) })
		h, err := netlink.NewHandleAt(ns)
		_ = ns.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		if name == n.s {
			hs = h
		} else {
			hr = h
		}
		lo, _ := h.LinkByName("lo")
		_ = h.LinkSetUp(lo)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	sns, err := netns.GetFromName(n.s)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sns.Close() }()
	if err := hr.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "gw", HardwareAddr: testGwMAC},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(sns)}); err != nil {
		t.Fatal(err)
	}
	a := netlink.Addr{IPNet: mustCIDR(t, addr)}
	ones, _ := a.Mask.Size()
	g, _ := hr.LinkByName("gw")
	e, _ := hs.LinkByName("eth0")
	if gw != "" {
		if err := hr.AddrAdd(g, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(gw).To4(), Mask: net.CIDRMask(ones, 32)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := hs.AddrAdd(e, &a); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		h *netlink.Handle
		l netlink.Link
	}{{hr, g}, {hs, e}} {
		if err := p.h.LinkSetUp(p.l); err != nil {
			t.Fatal(err)
		}
	}
	if gw != "" {
		if err := hs.RouteAdd(&netlink.Route{LinkIndex: e.Attrs().Index, Gw: net.ParseIP(gw).To4()}); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func mustCIDR(t *testing.T, s string) *net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip.To4()
	return n
}

// inNetns runs fn on a thread in the named namespace.
func inNetns(t *testing.T, name string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := netns.GetFromName(name)
		if err != nil {
			t.Error(err)
			return
		}
		defer func() { _ = ns.Close() }()
		if err := netns.Set(ns); err != nil {
			t.Error(err)
			return
		}
		fn()
	}()
	<-done
}

// getFrom fetches http://addr/ (or http://addr/path with addr "host:port/path")
// from the router namespace r. The connection
// is made on the namespace's thread (an http.Client would dial from
// another goroutine, in the host's namespace).
func getFrom(t *testing.T, r, addr string) (string, error) {
	t.Helper()
	addr, path, _ := strings.Cut(addr, "/")
	var conn net.Conn
	var err error
	inNetns(t, r, func() { conn, err = net.DialTimeout("tcp", addr, 3*time.Second) })
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET /%s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// guestAddr is where the test guests' httpd listens (their inner address).
const guestAddr = "10.77.0.2:8080"

// waitGet polls http://guestAddr/ from r until it serves want.
func waitGet(t *testing.T, r, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := getFrom(t, r, guestAddr)
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET http://%s/ from %s = %q, %v; want %q", guestAddr, r, got, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// linkNames lists the links of the named namespace ("" is the host's).
func linkNames(t *testing.T, name string) []string {
	t.Helper()
	h := &netlink.Handle{}
	if name != "" {
		ns, err := netns.GetFromName(name)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ns.Close() }()
		if h, err = netlink.NewHandleAt(ns); err != nil {
			t.Fatal(err)
		}
		defer h.Close()
	}
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		out = append(out, l.Attrs().Name)
	}
	return out
}

// TestNetwork: a sandbox created in a netns owns eth0's address there
// (an httpd in the guest answers from the router namespace, 2 MiB go
// either way intact; S's eth0 has no address left); two fork children, in namespaces of their own with the
// same address, answer with the parent's page (one restored into a fresh
// QEMU, one into a fork-pool QEMU) and reach the gateway at once; no tap
// is ever on the host, and a killed or deleted QEMU leaves none in S.
func TestNetwork(t *testing.T) {
	requireQEMU(t)
	rootfs := filepath.Join(testRoot, "rootfs")
	rootfsOnce.Do(func() { busyboxRootfs(t, rootfs) })
	e, err := New(Config{Root: filepath.Join(testRoot, "engine"), AgentPath: testutil.Binary(t, "k7-agent"),
		Accel: os.Getenv("K7_QEMU_ACCEL"), ForkPool: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	if !e.Capabilities().Network {
		t.Fatal("Capabilities().Network = false")
	}
	ctx := context.Background()
	const addr, gw = "10.77.0.2/24", "10.77.0.1"
	pn := newSandboxNet(t, addr, gw)
	t0 := time.Now()
	if err := e.Create(ctx, &engine.CreateRequest{ID: "net", Rootfs: rootfs, Netns: pn.path()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Delete(context.Background(), "net") })
	t.Logf("create with a network: %v", time.Since(t0))
	c := connect(t, e, "net")
	if out, _ := run(t, c, "ip", "-4", "-o", "addr", "show", "eth0"); !strings.Contains(out, addr) {
		t.Errorf("guest eth0: %q, want %s", out, addr)
	}
	if out, _ := run(t, c, "ip", "route"); !strings.Contains(out, "default via "+gw) {
		t.Errorf("guest routes: %q, want a default via %s", out, gw)
	}
	if out, code := run(t, c, "ping", "-c", "1", "-W", "5", "127.0.0.1"); code != 0 {
		t.Errorf("guest loopback: %q", out)
	}
	if _, code := run(t, c, "sh", "-c", "mkdir -p /www && printf parent > /www/index.html"); code != 0 {
		t.Fatal("writing the page")
	}
	if _, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"httpd", "-f", "-p", "8080", "-h", "/www"}, Detach: true}, client.Stdio{}); err != nil {
		t.Fatal(err)
	}
	waitGet(t, pn.r, "parent")
	// Large segments (the guest's TSO, through the tap's vnet header).
	if _, code := run(t, c, "dd", "if=/dev/urandom", "of=/www/big", "bs=1024", "count=2048"); code != 0 {
		t.Fatal("writing a 2 MiB file")
	}
	want, _ := run(t, c, "md5sum", "/www/big")
	if big, err := getFrom(t, pn.r, guestAddr+"/big"); err != nil || len(big) != 2<<20 || fmt.Sprintf("%x  /www/big\n", md5.Sum([]byte(big))) != want {
		t.Errorf("GET /big from S: %d bytes, %v; want 2 MiB with md5 %q", len(big), err, want)
	}
	// And the other way: the guest downloads 2 MiB from the router.
	blob := make([]byte, 2<<20)
	_, _ = rand.Read(blob)
	var bl net.Listener
	inNetns(t, pn.r, func() { bl, err = net.Listen("tcp", gw+":9001") })
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(blob) })}
	go func() { _ = srv.Serve(bl) }()
	defer func() { _ = srv.Close() }()
	if got, _ := run(t, c, "sh", "-c", "wget -q -O- http://"+gw+":9001/ | md5sum"); got != fmt.Sprintf("%x  -\n", md5.Sum(blob)) {
		t.Errorf("guest download of 2 MiB: md5 %q, want %x", got, md5.Sum(blob))
	}
	if slices.Contains(linkNames(t, ""), tapIf) {
		t.Errorf("a %s on the host", tapIf)
	}
	if got := linkNames(t, pn.s); !slices.Contains(got, tapIf) {
		t.Errorf("links in S: %v, want %s there", got, tapIf)
	}
	if n, err := readNetns(pn.path()); err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("S's eth0 after create: %+v, %v; want no address left", n, err)
	}

	capDir := t.TempDir()
	if _, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: "net", Dir: capDir}); err != nil {
		t.Fatal(err)
	}
	var kids []*sandboxNet
	var kidClients []*client.Client
	for i := range 2 {
		id := fmt.Sprintf("netkid%d", i)
		kn := newSandboxNet(t, addr, gw)
		if i == 1 {
			// The first restore started a pool QEMU for the capture's shape.
			deadline := time.Now().Add(30 * time.Second)
			for e.poolLen() == 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if e.poolLen() == 0 {
				t.Fatal("no fork-pool QEMU after 30s")
			}
		}
		t0 := time.Now()
		if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: id, Rootfs: rootfs, Netns: kn.path()}, From: capDir}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Delete(context.Background(), id) })
		t.Logf("restore %s with a network: %v", id, time.Since(t0))
		if i == 1 && e.poolLen() != 0 {
			t.Errorf("%s did not take the fork-pool QEMU", id)
		}
		waitGet(t, kn.r, "parent")
		// The guest reaches out to its gateway, right away.
		got := make(chan struct{}, 1)
		var l net.Listener
		inNetns(t, kn.r, func() { l, err = net.Listen("tcp", gw+":9000") })
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			if conn, err := l.Accept(); err == nil {
				got <- struct{}{}
				_ = conn.Close()
			}
		}()
		kc := connect(t, e, id)
		if out, code := run(t, kc, "sh", "-c", "echo | timeout 5 nc "+gw+" 9000"); code != 0 {
			t.Errorf("%s connecting to its gateway: exit %d: %q", id, code, out)
		}
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Errorf("%s: no connection at the gateway", id)
		}
		_ = l.Close()
		kids = append(kids, kn)
		kidClients = append(kidClients, kc)
	}
	run(t, kidClients[0], "sh", "-c", "printf kid0 > /www/index.html")
	waitGet(t, kids[0].r, "kid0")
	waitGet(t, kids[1].r, "parent")
	waitGet(t, pn.r, "parent")
	if slices.Contains(linkNames(t, ""), tapIf) {
		t.Errorf("a %s on the host", tapIf)
	}

	// Deleted: the tap goes with QEMU. Killed: the same.
	if err := e.Delete(ctx, "netkid1"); err != nil {
		t.Fatal(err)
	}
	if got := linkNames(t, kids[1].s); slices.Contains(got, tapIf) {
		t.Errorf("links in S after Delete: %v", got)
	}
	st, err := e.readState("netkid0")
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(st.PID, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for slices.Contains(linkNames(t, kids[0].s), tapIf) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still in S 10s after QEMU was killed", tapIf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNetworkRejects: a netns whose eth0 has no default route is refused
// and leaves nothing; a capture with a NIC needs a netns with its address.
func TestNetworkRejects(t *testing.T) {
	e, rootfs := newEngine(t)
	ctx := context.Background()
	bad := newSandboxNet(t, "10.78.0.2/24", "")
	err := e.Create(ctx, &engine.CreateRequest{ID: "badnet", Rootfs: rootfs, Netns: bad.path()})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("create in a netns without a default route: %v, want ErrInvalidArgument", err)
	}
	if _, err := os.Stat(e.dir("badnet")); !os.IsNotExist(err) {
		t.Errorf("sandbox dir after a failed create: %v", err)
	}
	m := &manifest{Net: &guestNet{}}
	if _, err := restoreNet(m, ""); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("restoring a networked capture without a netns: %v, want ErrFailedPrecondition", err)
	}
	other := newSandboxNet(t, "10.78.0.3/24", "10.78.0.1")
	m.Net.Addr, m.Net.Gateway = mustPrefix("10.78.0.2/24"), mustAddr("10.78.0.1")
	if _, err := restoreNet(m, other.path()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("restoring into a netns with another address: %v, want ErrFailedPrecondition", err)
	}
}

func (e *Engine) poolLen() int {
	e.pool.mu.Lock()
	defer e.pool.mu.Unlock()
	return len(e.pool.idle)
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }
