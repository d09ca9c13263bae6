package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/budget"
)

// TestQEMUEndToEnd drives the qemu engine (TCG here) from the CLI: create,
// exec with exit code, a fork that carries the marker and the running
// counter to two children that share the template's pages, and removal
// that leaves no QEMU process or memory file behind.
func TestQEMUEndToEnd(t *testing.T) {
	d := startDaemon(t, "gvisor", "qemu")
	info, err := d.client.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range info.Engines {
		if e.Name == "qemu" {
			if !e.Available {
				t.Fatalf("qemu engine unavailable: %s", e.Reason)
			}
			if !strings.Contains(e.Reason, "accel tcg") && !strings.Contains(e.Reason, "accel kvm") {
				t.Errorf("k7 info does not say which acceleration qemu uses and why: %q", e.Reason)
			}
		}
	}
	vm := d.create("--engine", "qemu", "--memory", "256M", "--name", "vm")
	r := d.k7(nil, "exec", vm, "--", "sh", "-c", "echo hi; exit 3")
	if r.code != 3 || r.stdout != "hi\n" {
		t.Fatalf("exec in qemu sandbox: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	d.execOut(vm, "sh", "-c", "echo vm-marker > /tmp/marker")
	d.startCounter(vm)

	children := strings.Fields(d.must("fork", "-q", "-n", "2", "vm"))
	if len(children) != 2 {
		t.Fatalf("fork printed %v, want 2 IDs", children)
	}
	atFork := d.counter(vm)
	var pss int64
	for _, c := range children {
		if got := strings.TrimSpace(d.execOut(c, "cat", "/tmp/marker")); got != "vm-marker" {
			t.Errorf("child %s marker %q", c, got)
		}
		a := d.counter(c)
		eventually(t, 20*time.Second, func() error {
			if b := d.counter(c); b <= a {
				return fmt.Errorf("child %s counter stuck at %d", c, b)
			}
			return nil
		})
		// A restored VM wakes with its capture's clock; the agent steps it.
		var guest int64
		_, _ = fmt.Sscan(d.execOut(c, "date", "+%s"), &guest)
		if off := time.Now().Unix() - guest; off > 2 || off < -2 {
			t.Errorf("child %s clock is off by %d s", c, off)
		}
		sb, err := d.client.GetSandbox(context.Background(), c)
		if err != nil || sb.Stats == nil || sb.Stats.MemoryBytes <= 0 {
			t.Fatalf("child %s stats: %+v %v", c, sb, err)
		}
		pss += sb.Stats.MemoryBytes
	}
	t.Logf("children's PSS: %d MiB total for 2 × 256 MiB guests (counter at fork %d)", pss>>20, atFork)
	if pss >= 2*256<<20 {
		t.Errorf("children's PSS sum %d MiB is not below 2 × 256 MiB: template pages are not shared", pss>>20)
	}
	d.execOut(children[0], "sh", "-c", "echo x > /tmp/only-here")
	if r := d.k7(nil, "exec", children[1], "--", "cat", "/tmp/only-here"); r.code == 0 {
		t.Errorf("a sibling sees the other child's file")
	}

	d.must(append([]string{"rm", "-f", vm}, children...)...)
	list, _ := d.client.ListSandboxes(context.Background())
	for _, sb := range list {
		if sb.State != v1.StateDead {
			t.Errorf("sandbox %s still listed after rm", sb.ID)
		}
	}
	eventually(t, 10*time.Second, func() error {
		for _, id := range append([]string{vm}, children...) {
			if p := processesMentioning(id); len(p) > 0 {
				return fmt.Errorf("QEMU processes of %s left: %v", id, p)
			}
			if m, _ := filepath.Glob("/dev/shm/*" + id + "*"); len(m) > 0 {
				return fmt.Errorf("memory files of %s left: %v", id, m)
			}
		}
		if m, _ := filepath.Glob(filepath.Join(d.stateDir, "engines", "qemu", "sandboxes", "*")); len(m) > 0 {
			return fmt.Errorf("sandbox dirs left: %v", m)
		}
		return nil
	})
}

// processesMentioning returns the PIDs whose command line contains s.
func processesMentioning(s string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestQEMUNetwork: a qemu sandbox with a published port serves from the
// host through 127.0.0.1; `k7 fork -n 2` children answer on their own host
// ports with the parent's in-sandbox address (inspect and the guest agree);
// an isolated VM reaches neither another sandbox nor anything outside; an
// egress VM reaches what --allow lists and nothing else; removal leaves no
// QEMU and no tap on the host.
func TestQEMUNetwork(t *testing.T) {
	d := startDaemon(t, "gvisor", "qemu")
	vm := d.create("--engine", "qemu", "--name", "web", "-p", "8080")
	psb := d.inspect(vm)
	if psb.Network == nil || psb.Network.Policy != "isolated" || psb.Network.Address == "" || len(psb.Ports) != 1 {
		t.Fatalf("qemu sandbox network %+v ports %+v, want isolated (the default) with an address and a port", psb.Network, psb.Ports)
	}
	guestAddr := func(id string) string {
		// "2: eth0    inet 10.x.y.z/nn brd ..." -> 10.x.y.z
		f := strings.Fields(d.execOut(id, "ip", "-4", "-o", "addr", "show", "eth0"))
		for i := range f {
			if f[i] == "inet" && i+1 < len(f) {
				a, _, _ := strings.Cut(f[i+1], "/")
				return a
			}
		}
		return ""
	}
	if got := guestAddr(vm); got != psb.Network.Address {
		t.Errorf("guest eth0 has %q, inspect says %s", got, psb.Network.Address)
	}
	d.startHttpd(vm, "vm page")
	waitPage(t, psb.Ports[0].HostPort, "vm page", 20*time.Second)

	children := d.forkServes(psb, "vm page", 10*time.Second, func(c string, _ v1.Sandbox) {
		if got := guestAddr(c); got != psb.Network.Address {
			t.Errorf("child %s guest eth0 has %q, want the parent's %s", c, got, psb.Network.Address)
		}
	})

	// Isolation, with a positive control on the same wget.
	tn := newTestNetns(t, "198.18.78.1/29", "198.18.78.2/29", "198.18.78.3/29")
	iso := d.create("--engine", "qemu", "--name", "iso")
	for _, addr := range []string{psb.Network.Address, psb.Network.Outer} {
		if d.reaches(iso, "http://"+addr+":8080/", "vm page") {
			t.Errorf("isolated qemu sandbox reached sandbox web at %s:8080", addr)
		}
	}
	if d.reaches(iso, fmt.Sprintf("http://198.18.78.2:%d/", tn.port), "ok") {
		t.Errorf("isolated qemu sandbox reached the test namespace")
	}
	if !d.reaches(vm, "http://127.0.0.1:8080/", "vm page") {
		t.Errorf("web does not reach its own httpd through loopback")
	}
	eg := d.create("--engine", "qemu", "--name", "eg", "--network", "egress", "--allow", "198.18.78.2")
	if !d.reaches(eg, fmt.Sprintf("http://198.18.78.2:%d/", tn.port), "ok") {
		t.Errorf("egress qemu sandbox did not reach the allowed 198.18.78.2:%d", tn.port)
	}
	if d.reaches(eg, fmt.Sprintf("http://198.18.78.3:%d/", tn.port), "ok") {
		t.Errorf("egress qemu sandbox reached 198.18.78.3, which is not allowed")
	}

	all := append([]string{vm, iso, eg}, children...)
	d.must(append([]string{"rm", "-f"}, all...)...)
	eventually(t, 10*time.Second, func() error {
		for _, id := range all {
			if p := processesMentioning(id); len(p) > 0 {
				return fmt.Errorf("QEMU processes of %s left: %v", id, p)
			}
		}
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if _, ok := l.(*netlink.Tuntap); ok || strings.HasPrefix(l.Attrs().Name, "tap") {
				return fmt.Errorf("tap %s on the host", l.Attrs().Name)
			}
		}
		return nil
	})
}

// TestQEMUNetworkCost checks the daemon's network setup step and the qemu
// engine's "attach tap" step against their budgets and logs what
// networking adds to a qemu create and fork (networkCost).
func TestQEMUNetworkCost(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement; skipped with -short")
	}
	d := startDaemon(t, "gvisor", "qemu")
	steps := networkCost(t, d, "qemu", 3, "network", "attach tap") // TCG boots take seconds: a few runs
	budget.Check(t, "qemu", budget.NetworkSetup, steps["network"])
	budget.Check(t, "qemu", budget.TapAttach, steps["attach tap"])
}
