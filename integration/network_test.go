package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/budget"
)

// inspect returns the sandbox as `k7 inspect -o json` prints it.
func (d *daemon) inspect(id string) v1.Sandbox {
	d.t.Helper()
	var sbs []v1.Sandbox
	if err := json.Unmarshal([]byte(d.must("inspect", "-o", "json", id)), &sbs); err != nil || len(sbs) != 1 {
		d.t.Fatalf("inspect -o json %s: %v %d sandboxes", id, err, len(sbs))
	}
	return sbs[0]
}

// httpGet fetches http://127.0.0.1:port/ from the host.
func httpGet(port int) (string, error) {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(b), err
}

// waitPage polls 127.0.0.1:port until it serves want.
func waitPage(t *testing.T, port int, want string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() error {
		got, err := httpGet(port)
		if err != nil {
			return fmt.Errorf("GET 127.0.0.1:%d: %w", port, err)
		}
		if got != want {
			return fmt.Errorf("GET 127.0.0.1:%d = %q, want %q", port, got, want)
		}
		return nil
	})
}

// startHttpd serves page from /www on port 8080 of sandbox id, detached.
func (d *daemon) startHttpd(id, page string) {
	d.t.Helper()
	d.execOut(id, "sh", "-c", "mkdir -p /www && printf %s '"+page+"' > /www/index.html")
	d.must("exec", "-d", id, "--", "httpd", "-f", "-p", "8080", "-h", "/www")
	eventually(d.t, 10*time.Second, func() error {
		r := d.k7(nil, "exec", id, "--", "wget", "-q", "-O-", "http://127.0.0.1:8080/")
		if r.code != 0 || r.stdout != page {
			return fmt.Errorf("httpd in %s not serving yet: %+v", id, r)
		}
		return nil
	})
}

// fetch runs wget for url in sandbox id, killed after 4 s, and returns its
// output and exit code. (busybox wget -T crashes under gVisor; timeout
// does the job.)
func (d *daemon) fetch(id, url string) (string, int) {
	d.t.Helper()
	r := d.k7(nil, "exec", id, "--", "timeout", "4", "wget", "-q", "-O-", url)
	return r.stdout, r.code
}

// reaches reports whether sandbox id fetches want from url; a wget that
// crashed instead of failing fails the test (it would prove nothing).
func (d *daemon) reaches(id, url, want string) bool {
	d.t.Helper()
	out, code := d.fetch(id, url)
	if code == 139 {
		d.t.Fatalf("wget %s in %s crashed", url, id)
	}
	return code == 0 && out == want
}

// TestNetworkPublishedPortsAndFork: a published httpd answers from the
// host; fork children answer on their own host ports with the parent's
// page and keep the parent's in-sandbox address; a daemon restart
// re-opens the ports.
func TestNetworkPublishedPortsAndFork(t *testing.T) {
	d := startDaemon(t)
	parent := d.create("--name", "web", "-p", "8080")
	d.startHttpd(parent, "parent page")
	psb := d.inspect(parent)
	if psb.Network == nil || psb.Network.Policy != "isolated" || psb.Network.Address == "" || psb.Network.Outer == "" {
		t.Fatalf("parent network = %+v, want isolated with an address", psb.Network)
	}
	if len(psb.Ports) != 1 || psb.Ports[0].Port != 8080 || psb.Ports[0].HostPort == 0 {
		t.Fatalf("parent ports = %+v, want one 8080 on a host port", psb.Ports)
	}
	waitPage(t, psb.Ports[0].HostPort, "parent page", 10*time.Second)
	ls := d.must("ls")
	if want := fmt.Sprintf("127.0.0.1:%d->8080", psb.Ports[0].HostPort); !strings.Contains(ls, want) {
		t.Errorf("k7 ls lacks %q:\n%s", want, ls)
	}
	hosts := d.execOut(parent, "cat", "/etc/hosts")
	if !strings.Contains(hosts, psb.Network.Address+"\tweb") {
		t.Errorf("/etc/hosts of web = %q, want %s mapped to web", hosts, psb.Network.Address)
	}
	if _, err := d.client.GetSandbox(context.Background(), parent); err != nil {
		t.Fatal(err)
	}

	children := d.forkServes(psb, "parent page", 5*time.Second, func(c string, csb v1.Sandbox) {
		if h := d.execOut(c, "cat", "/etc/hosts"); !strings.Contains(h, "\t"+csb.Name) {
			t.Errorf("child %s /etc/hosts = %q, want its own name %s", c, h, csb.Name)
		}
	})

	// A restarted daemon re-opens the published ports.
	d.stop()
	if _, err := httpGet(psb.Ports[0].HostPort); err == nil {
		t.Errorf("published port answers while k7d is stopped")
	}
	d.start()
	waitPage(t, psb.Ports[0].HostPort, "parent page", 10*time.Second)

	// Removing a sandbox closes its port.
	port := d.inspect(children[1]).Ports[0].HostPort
	d.must("rm", "-f", children[1])
	if _, err := httpGet(port); err == nil {
		t.Errorf("port %d still answers after k7 rm", port)
	}
}

// forkServes forks psb, which serves page on its published port 8080 with
// an httpd in /www, into two children and checks each: the parent's inner
// address, an outer address of its own, 8080 published on a host port of
// its own that serves page right after the fork (the parent's listener
// listens in the child), then check. Then the children diverge: child 0
// serves a page of its own, child 1 and the parent still serve page. It
// returns the children's IDs; wait bounds each wait for a page.
func (d *daemon) forkServes(psb v1.Sandbox, page string, wait time.Duration, check func(c string, csb v1.Sandbox)) []string {
	t := d.t
	t.Helper()
	children := strings.Fields(d.must("fork", "-q", "-n", "2", psb.ID))
	if len(children) != 2 {
		t.Fatalf("fork -q -n 2 printed %v, want 2 IDs", children)
	}
	seen := map[int]bool{psb.Ports[0].HostPort: true}
	for _, c := range children {
		csb := d.inspect(c)
		if csb.Network == nil || csb.Network.Address != psb.Network.Address {
			t.Errorf("child %s network %+v, want the parent's address %s", c, csb.Network, psb.Network.Address)
		}
		if csb.Network != nil && csb.Network.Outer == psb.Network.Outer {
			t.Errorf("child %s shares the parent's outer address %s", c, csb.Network.Outer)
		}
		if len(csb.Ports) != 1 || csb.Ports[0].Port != 8080 || seen[csb.Ports[0].HostPort] {
			t.Fatalf("child %s ports %+v, want 8080 on a host port of its own", c, csb.Ports)
		}
		seen[csb.Ports[0].HostPort] = true
		waitPage(t, csb.Ports[0].HostPort, page, wait)
		check(c, csb)
	}
	d.execOut(children[0], "sh", "-c", "printf child0 > /www/index.html")
	waitPage(t, d.inspect(children[0]).Ports[0].HostPort, "child0", wait)
	waitPage(t, d.inspect(children[1]).Ports[0].HostPort, page, wait)
	waitPage(t, psb.Ports[0].HostPort, page, wait)
	return children
}

// TestNetworkIsolation: an isolated sandbox reaches neither another
// sandbox nor the host; a none sandbox has only loopback.
func TestNetworkIsolation(t *testing.T) {
	d := startDaemon(t)
	a := d.create("--name", "a", "-p", "8080")
	d.startHttpd(a, "a page")
	asb := d.inspect(a)
	waitPage(t, asb.Ports[0].HostPort, "a page", 10*time.Second)
	b := d.create("--name", "b")
	bsb := d.inspect(b)
	if bsb.Network == nil || bsb.Network.Policy != "isolated" || bsb.Network.Address == asb.Network.Address {
		t.Fatalf("b network %+v (a: %+v), want isolated with another address", bsb.Network, asb.Network)
	}
	for _, addr := range []string{asb.Network.Address, asb.Network.Outer} {
		if d.reaches(b, "http://"+addr+":8080/", "a page") {
			t.Errorf("isolated b reached sandbox a at %s:8080", addr)
		}
	}
	info, err := d.client.Info(context.Background())
	if err != nil || info.Network == nil || info.Network.Address == "" {
		t.Fatalf("info network = %+v, %v", info.Network, err)
	}
	// A host service on the bridge address (where the daemon's API or any
	// other host service would answer a sandbox).
	l, err := net.Listen("tcp", net.JoinHostPort(info.Network.Address, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan struct{}, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			got <- struct{}{}
			c.Close()
		}
	}()
	if out, code := d.fetch(b, "http://"+l.Addr().String()+"/"); code == 0 || code == 139 {
		t.Errorf("wget of the host at %s from isolated b: exit %d, output %q; want a failure", l.Addr(), code, out)
	}
	// The positive control: the same wget works for a's own page.
	if !d.reaches(a, "http://127.0.0.1:8080/", "a page") {
		t.Errorf("a does not reach its own httpd with the test's wget")
	}
	select {
	case <-got:
		t.Errorf("host listener on %s accepted a connection from isolated b", l.Addr())
	default:
	}

	n := d.create("--name", "n", "--network", "none")
	nsb := d.inspect(n)
	if nsb.Network == nil || nsb.Network.Policy != "none" || nsb.Network.Address != "" || len(nsb.Ports) != 0 {
		t.Errorf("none sandbox network %+v ports %+v, want policy none only", nsb.Network, nsb.Ports)
	}
	var ifs []string
	for _, line := range strings.Split(d.execOut(n, "cat", "/proc/net/dev"), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok {
			ifs = append(ifs, strings.TrimSpace(name))
		}
	}
	if !slices.Equal(ifs, []string{"lo"}) {
		t.Errorf("none sandbox interfaces %v, want [lo]", ifs)
	}
	if r := d.k7(nil, "create", "--network", "none", "-p", "80", "busybox"); r.code == 0 {
		t.Errorf("create --network none -p 80 succeeded, want an error")
	}
}

// testNetns is a namespace the test makes: a veth to the host with
// hostAddr on the host side and addrs inside, each serving "ok" over HTTP.
type testNetns struct {
	name, hostIf string
	port         int
}

func newTestNetns(t *testing.T, hostAddr string, addrs ...string) *testNetns {
	t.Helper()
	var b [3]byte
	rand.Read(b[:])
	tn := &testNetns{name: "k7t" + hex.EncodeToString(b[:]), hostIf: "k7t" + hex.EncodeToString(b[:]) + "h"}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(tn.name) // switches this thread into it
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	back := func() {
		if err := netns.Set(orig); err != nil {
			panic(err)
		}
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(tn.hostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
		_ = netns.DeleteNamed(tn.name)
	})
	lo, _ := netlink.LinkByName("lo")
	_ = netlink.LinkSetUp(lo)
	back()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tn.hostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	hl, _ := netlink.LinkByName(tn.hostIf)
	ha, _ := netlink.ParseAddr(hostAddr)
	if err := netlink.AddrAdd(hl, ha); err != nil {
		t.Fatal(err)
	}
	_ = netlink.LinkSetUp(hl)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	e, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		na, _ := netlink.ParseAddr(a)
		if err := h.AddrAdd(e, na); err != nil {
			t.Fatal(err)
		}
	}
	_ = h.LinkSetUp(e)
	gw := net.ParseIP(strings.Split(hostAddr, "/")[0])
	if err := h.RouteAdd(&netlink.Route{LinkIndex: e.Attrs().Index, Gw: gw}); err != nil {
		t.Fatal(err)
	}
	// A listener made inside the namespace stays there.
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "0.0.0.0:0")
	back()
	if err != nil {
		t.Fatal(err)
	}
	tn.port = l.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return tn
}

// TestNetworkEgressAllow: an egress sandbox with --allow reaches the
// allowed address of a test namespace and nothing else; an isolated one
// reaches neither.
func TestNetworkEgressAllow(t *testing.T) {
	d := startDaemon(t)
	tn := newTestNetns(t, "198.18.77.1/29", "198.18.77.2/29", "198.18.77.3/29")
	e := d.create("--name", "e", "--network", "egress", "--allow", "198.18.77.2")
	esb := d.inspect(e)
	if esb.Network == nil || esb.Network.Policy != "egress" || !slices.Equal(esb.Network.Allow, []string{"198.18.77.2/32"}) {
		t.Fatalf("egress network %+v", esb.Network)
	}
	if !d.reaches(e, fmt.Sprintf("http://198.18.77.2:%d/", tn.port), "ok") {
		t.Errorf("egress sandbox did not reach the allowed 198.18.77.2:%d", tn.port)
	}
	if d.reaches(e, fmt.Sprintf("http://198.18.77.3:%d/", tn.port), "ok") {
		t.Errorf("egress sandbox reached 198.18.77.3, which is not allowed")
	}
	i := d.create("--name", "i")
	if d.reaches(i, fmt.Sprintf("http://198.18.77.2:%d/", tn.port), "ok") {
		t.Errorf("isolated sandbox reached 198.18.77.2")
	}
	if r := d.execOut(e, "cat", "/etc/resolv.conf"); r == "" {
		t.Errorf("egress sandbox has an empty /etc/resolv.conf")
	}
}

// hostNetState lists what the daemon with network prefix p has on the
// host: its namespaces, links and nftables table.
func hostNetState(t *testing.T, p string) string {
	t.Helper()
	var out []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), p) {
			out = append(out, "netns "+e.Name())
		}
	}
	var links []netlink.Link
	eventually(t, 5*time.Second, func() (err error) {
		links, err = netlink.LinkList() // interrupted while other links come and go
		return err
	})
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, p) {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	sort.Strings(out)
	if nft, err := exec.LookPath("nft"); err == nil {
		b, err := exec.Command(nft, "list", "table", "ip", p).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list table ip %s: %v\n%s", p, err, b)
		}
		out = append(out, string(b))
	}
	return strings.Join(out, "\n")
}

// TestNetworkCreateDeleteLeavesNothing: 50 create/delete cycles with a
// published port leave the host's namespaces, links and nftables rules as
// they were.
func TestNetworkCreateDeleteLeavesNothing(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	warm := d.create("-p", "80")
	d.must("rm", "-f", warm)
	info, err := d.client.Info(ctx)
	if err != nil || info.Network == nil || info.Network.Bridge == "" {
		t.Fatalf("info network = %+v, %v", info.Network, err)
	}
	prefix := strings.TrimSuffix(info.Network.Bridge, "br")
	before := hostNetState(t, prefix)
	for i := range 50 {
		sb, err := d.client.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "busybox", Ports: []v1.Port{{Port: 80}}})
		if err != nil {
			t.Fatalf("cycle %d: create: %v", i, err)
		}
		if _, err := d.client.DeleteSandbox(ctx, sb.ID, false); err != nil {
			t.Fatalf("cycle %d: delete: %v", i, err)
		}
	}
	if after := hostNetState(t, prefix); after != before {
		t.Errorf("host network state changed after 50 cycles:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// A failed create leaves nothing either: the published host port is taken.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	if _, err := d.client.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "busybox", Ports: []v1.Port{{HostPort: taken, Port: 80}}}); err == nil {
		t.Errorf("create on a taken host port succeeded")
	}
	if after := hostNetState(t, prefix); after != before {
		t.Errorf("host network state changed after a failed create:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if l, _ := d.client.ListSandboxes(ctx); len(l) != 0 {
		t.Errorf("sandboxes left: %+v", l)
	}
}

// TestNetworkCost checks the daemon's network setup step against its budget
// and logs what networking adds to a create and a fork (networkCost).
func TestNetworkCost(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement; skipped with -short")
	}
	d := startDaemon(t)
	steps := networkCost(t, d, "gvisor", 7, "network", "start")
	budget.Check(t, "gvisor", budget.NetworkSetup, steps["network"])
}

// networkCost measures what networking adds to a create and to a fork on
// engine: policy none against isolated, interleaved, n runs after a
// warm-up. It logs the end-to-end times (client side, median and range)
// and the named steps of the isolated runs (k7d's own "step" lines and the
// engine's "start step" lines, from its debug log), and returns those
// steps' durations by name, creates and forks together.
func networkCost(t *testing.T, d *daemon, engine string, n int, stepNames ...string) map[string][]time.Duration {
	t.Helper()
	ctx := context.Background()
	policies := []string{"none", "isolated"}
	create := func(policy string) string {
		sb, err := d.client.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "busybox", Engine: engine, Network: policy})
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID
	}
	var report []string
	isolated := map[string][]string{} // op -> sandbox IDs of the isolated runs
	for _, op := range []string{"create", "fork"} {
		parents := map[string]string{}
		if op == "fork" {
			for _, policy := range policies {
				parents[policy] = create(policy)
			}
		}
		wall := map[string][]time.Duration{}
		for i := range n + 1 { // the first round warms up
			for _, policy := range policies {
				start := time.Now()
				var id string
				if op == "create" {
					id = create(policy)
				} else {
					res, err := d.client.ForkSandbox(ctx, parents[policy], v1.ForkRequest{Count: 1})
					if err != nil {
						t.Fatal(err)
					}
					id = res.Children[0].Sandbox.ID
				}
				took := time.Since(start)
				if _, err := d.client.DeleteSandbox(ctx, id, false); err != nil {
					t.Fatal(err)
				}
				if i > 0 {
					wall[policy] = append(wall[policy], took)
					if policy == "isolated" {
						isolated[op] = append(isolated[op], id)
					}
				}
			}
		}
		for _, policy := range policies {
			report = append(report, fmt.Sprintf("%-6s %-8s end to end %s", op, policy, summary(wall[policy])))
		}
		report = append(report, fmt.Sprintf("%-6s added by networking, end to end (median isolated - none): %.1f ms",
			op, ms(median(wall["isolated"])-median(wall["none"]))))
	}
	logged := logSteps(t, d.logPath)
	out := map[string][]time.Duration{}
	for _, op := range []string{"create", "fork"} {
		for _, name := range stepNames {
			var ds []time.Duration
			for _, id := range isolated[op] {
				if v, ok := logged[id+"/"+name]; ok {
					ds = append(ds, v)
				}
			}
			if len(ds) > 0 {
				report = append(report, fmt.Sprintf("%-6s isolated step %-10s %s", op, name, summary(ds)))
			}
			out[name] = append(out[name], ds...)
		}
	}
	t.Logf("%s networking cost:\n%s", engine, strings.Join(report, "\n"))
	return out
}

// stepLine matches k7d's step lines (msg=step) and the engines' (msg="start
// step") in its debug log.
var stepLine = regexp.MustCompile(`msg=(?:step|"start step") .*?sandbox=(\S+) .*?step=(?:"([^"]*)"|(\S+)) .*?took=(\S+)`)

// logSteps reads the step lines of a k7d debug log into ID/STEP -> took.
func logSteps(t *testing.T, path string) map[string]time.Duration {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Duration{}
	for _, m := range stepLine.FindAllStringSubmatch(string(b), -1) {
		if took, err := time.ParseDuration(m[4]); err == nil {
			out[m[1]+"/"+m[2]+m[3]] = took
		}
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func summary(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("median %7.1f ms  range %7.1f-%7.1f ms  n=%d", ms(s[len(s)/2]), ms(s[0]), ms(s[len(s)-1]), len(s))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// TestNetworkTwoDaemonsSideBySide: two daemons with their own state dirs
// network on one host at once: their sandboxes get distinct host-side
// addresses (each daemon has its own bridge and subnet), they
// answer on their own published ports, a sandbox of one cannot
// reach the other's, and cleaning one up leaves the other working.
func TestNetworkTwoDaemonsSideBySide(t *testing.T) {
	a, b := startDaemon(t), startDaemon(t)
	sa := a.create("-p", "8080")
	sb := b.create("-p", "8080")
	a.startHttpd(sa, "from-a")
	b.startHttpd(sb, "from-b")
	ia, ib := a.inspect(sa), b.inspect(sb)
	if len(ia.Ports) != 1 || len(ib.Ports) != 1 || ia.Ports[0].HostPort == ib.Ports[0].HostPort {
		t.Fatalf("published ports: a %+v, b %+v; want one each, on different host ports", ia.Ports, ib.Ports)
	}
	waitPage(t, ia.Ports[0].HostPort, "from-a", 10*time.Second)
	waitPage(t, ib.Ports[0].HostPort, "from-b", 10*time.Second)
	if ia.Network == nil || ib.Network == nil || ia.Network.Outer == "" || ia.Network.Outer == ib.Network.Outer {
		t.Fatalf("host-side addresses: a %+v, b %+v; want distinct", ia.Network, ib.Network)
	}
	if a.reaches(sa, "http://"+ib.Network.Outer+":8080/", "from-b") {
		t.Errorf("a sandbox of daemon a reaches daemon b's sandbox at %s", ib.Network.Outer)
	}
	// Removing daemon a's sandbox (and its network) leaves b's answering.
	a.must("rm", "-f", sa)
	waitPage(t, ib.Ports[0].HostPort, "from-b", 10*time.Second)
}

// sibling is one fork child in TestNetworkSiblingsNeverSeeEachOther.
type sibling struct {
	name   string // "A" or "B"
	id     string
	sb     v1.Sandbox
	sNS    string // path of its sandbox namespace S
	rNS    string // path of its router namespace R
	hostIf string // its host veth, a port of the bridge
	probe  net.IP // an unused inner address it ARPs for
	tok    string // prefix of its markers
	caps   [4]*capture
}

// The positions of a sibling's captures, in the order of its path.
const (
	capEth0 = iota // eth0 in S
	capGw          // gw in R, eth0's peer
	capUp          // up in R
	capHost        // the host veth, up's peer on the bridge
)

// A marker kind is one kind of traffic a sibling emits, carrying
// tok+kind (arp: an ARP request for probe).
var siblingMarkers = []struct {
	kind string
	what string
	// inside: the traffic starts in the sandbox and R drops it; it shows
	// on eth0 and gw only. Otherwise it comes from the host through the
	// published port and shows on the whole path and the bridge.
	inside bool
	// maybe: not a positive control. gVisor refuses UDP to a broadcast
	// address without SO_BROADCAST, which busybox nslookup does not set;
	// the ARP requests are the broadcast frames that do go out.
	maybe bool
}{
	{"gw", "UDP (DNS query) to the gateway", true, false},
	{"out", "UDP (DNS query) to the sibling's outer address", true, false},
	{"bc", "UDP (DNS query) to the inner subnet's broadcast address", true, true},
	{"lb", "UDP (DNS query) to 255.255.255.255", true, true},
	{"arp", "ARP request for an unused inner address", true, false},
	{"host", "HTTP request from the host to the published port", false, false},
}

func (s *sibling) match(kind string) func([]byte) bool {
	if kind == "arp" {
		return arpFor(s.probe)
	}
	return carries(s.tok + kind)
}

// TestNetworkSiblingsNeverSeeEachOther: fork children share the inner
// address (issue #5: "Siblings can never see each other's traffic"), so
// this looks at the wire, not at connectivity. Packet captures run on
// every interface of each child's path (eth0 in S, gw and up in R, the
// host veth) and on the bridge while each child sends marked traffic
// (UDP to its gateway, to its sibling's outer address, to broadcast
// addresses, an ARP request for an unused inner address) and the host
// sends marked requests to each child's published port. Each child's own
// markers show on its own path, which proves the captures work; its
// sibling's never do; and nothing the sandboxes send leaves their router.
func TestNetworkSiblingsNeverSeeEachOther(t *testing.T) {
	d := startDaemon(t)
	for _, policy := range []string{"isolated", "egress"} {
		d.checkSiblings(policy)
	}
}

// checkSiblings forks a sandbox of policy into two children, captures,
// sends, asserts and removes the three sandboxes; failures go to d.t.
func (d *daemon) checkSiblings(policy string) {
	t := d.t
	ctx := context.Background()
	args := []string{"--name", "sib-" + policy, "--network", policy, "-p", "8080"}
	if policy == "egress" {
		// TEST-NET-1: an allow list, so that nothing could go far; the
		// test sends nothing there.
		args = append(args, "--allow", "192.0.2.1")
	}
	parent := d.create(args...)
	d.startHttpd(parent, "parent page")
	psb := d.inspect(parent)
	kids := strings.Fields(d.must("fork", "-q", "-n", "2", parent))
	if len(kids) != 2 {
		t.Fatalf("%s: fork -q -n 2 printed %v, want 2 IDs", policy, kids)
	}
	info, err := d.client.Info(ctx)
	if err != nil || info.Network == nil || info.Network.Bridge == "" {
		t.Fatalf("info network = %+v, %v", info.Network, err)
	}
	prefix := strings.TrimSuffix(info.Network.Bridge, "br")
	inner, err := netip.ParsePrefix(info.Network.Inner)
	if err != nil {
		t.Fatal(err)
	}
	bcast := lastAddr(inner)
	var rb [4]byte
	rand.Read(rb[:])
	tok := "k7mark" + hex.EncodeToString(rb[:])

	var links []netlink.Link
	eventually(t, 5*time.Second, func() (err error) {
		links, err = netlink.LinkList() // interrupted while other links come and go
		return err
	})
	sibs := []*sibling{{name: "A"}, {name: "B"}}
	for i, s := range sibs {
		s.id = kids[i]
		s.sb = d.inspect(s.id)
		if s.sb.Network == nil || s.sb.Network.Policy != policy || s.sb.Network.Address != psb.Network.Address ||
			s.sb.Network.Gateway != psb.Network.Gateway || len(s.sb.Ports) != 1 {
			t.Fatalf("%s: child %s network %+v ports %+v, want %s with the parent's address %s and one port",
				policy, s.name, s.sb.Network, s.sb.Ports, policy, psb.Network.Address)
		}
		s.sNS = "/run/netns/" + prefix + "-s-" + s.id
		s.rNS = "/run/netns/" + prefix + "-r-" + s.id
		for _, l := range links {
			if l.Attrs().Alias == prefix+":"+s.id {
				s.hostIf = l.Attrs().Name
			}
		}
		if s.hostIf == "" {
			t.Fatalf("%s: no host veth with alias %s:%s", policy, prefix, s.id)
		}
		p := bcast
		for range i + 1 {
			p = p.Prev()
		}
		s.probe = net.IP(p.AsSlice())
		s.tok = tok + s.name
	}
	if sibs[0].sb.Network.Outer == sibs[1].sb.Network.Outer {
		t.Fatalf("%s: children share the outer address %s", policy, sibs[0].sb.Network.Outer)
	}

	bridge := openCapture(t, "bridge "+info.Network.Bridge, "", info.Network.Bridge)
	all := []*capture{bridge}
	for _, s := range sibs {
		s.caps = [4]*capture{
			openCapture(t, s.name+" S/eth0", s.sNS, "eth0"),
			openCapture(t, s.name+" R/gw", s.rNS, "gw"),
			openCapture(t, s.name+" R/up", s.rNS, "up"),
			openCapture(t, s.name+" host/"+s.hostIf, "", s.hostIf),
		}
		all = append(all, s.caps[:]...)
	}

	// The host's marked requests, through each child's published port:
	// busybox httpd answers 404, which is enough.
	for _, s := range sibs {
		url := fmt.Sprintf("http://127.0.0.1:%d/%shost", s.sb.Ports[0].HostPort, s.tok)
		eventually(t, 10*time.Second, func() error {
			c := &http.Client{Timeout: 3 * time.Second}
			resp, err := c.Get(url)
			if err != nil {
				return fmt.Errorf("%s: GET %s: %w", policy, url, err)
			}
			resp.Body.Close()
			return nil
		})
	}
	// The sandboxes' own marked traffic, each query in the background and
	// cut short: nothing answers.
	for i, s := range sibs {
		o := sibs[1-i]
		var script strings.Builder
		for _, q := range [][2]string{
			{"gw", s.sb.Network.Gateway},
			{"out", o.sb.Network.Outer},
			{"bc", bcast.String()},
			{"lb", "255.255.255.255"},
			{"arp", s.probe.String()},
		} {
			fmt.Fprintf(&script, "timeout 2 nslookup %s%s %s >/dev/null 2>&1 & ", s.tok, q[0], q[1])
		}
		script.WriteString("wait")
		if r := d.k7(nil, "exec", s.id, "--", "sh", "-c", script.String()); r.code != 0 {
			t.Logf("%s: %s's queries: exit %d %s", policy, s.name, r.code, r.stderr)
		}
	}
	// Wait for the positive controls, listen a little longer for stray
	// frames, then stop.
	eventually(t, 5*time.Second, func() error {
		for _, s := range sibs {
			for _, m := range siblingMarkers {
				if m.maybe {
					continue
				}
				for pos, c := range s.caps {
					if (!m.inside || pos <= capGw) && c.count(s.match(m.kind)) == 0 {
						return fmt.Errorf("%s: %s's %s not seen on %s", policy, s.name, m.what, c.label)
					}
				}
			}
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // a listening window, not a wait for a state
	for _, c := range all {
		c.stop()
		if c.err() != nil || c.drops != 0 {
			t.Errorf("%s: capture on %s: error %v, %d frames dropped", policy, c.label, c.err(), c.drops)
		}
	}

	// The findings, as a table: rows are captures, columns markers.
	var tab strings.Builder
	fmt.Fprintf(&tab, "%-22s", "capture")
	for _, s := range sibs {
		for _, m := range siblingMarkers {
			fmt.Fprintf(&tab, " %6s", s.name+":"+m.kind)
		}
	}
	for _, c := range all {
		fmt.Fprintf(&tab, "\n%-22s", c.label)
		for _, s := range sibs {
			for _, m := range siblingMarkers {
				fmt.Fprintf(&tab, " %6d", c.count(s.match(m.kind)))
			}
		}
	}
	t.Logf("%s: frames carrying each child's markers (A %s, B %s, inner address %s):\n%s",
		policy, sibs[0].id, sibs[1].id, psb.Network.Address, tab.String())

	for i, s := range sibs {
		o := sibs[1-i]
		for pos, c := range s.caps {
			for _, m := range siblingMarkers {
				if n := c.count(o.match(m.kind)); n != 0 {
					t.Errorf("%s: LEAK: %d frames of %s's %s on %s's path (%s)", policy, n, o.name, m.what, s.name, c.label)
				}
				if n := c.count(s.match(m.kind)); m.inside && pos > capGw && n != 0 {
					t.Errorf("%s: %d frames of %s's %s left its router (on %s)", policy, n, s.name, m.what, c.label)
				}
			}
		}
		for _, m := range siblingMarkers {
			n := bridge.count(s.match(m.kind))
			if m.inside && n != 0 {
				t.Errorf("%s: %d frames of %s's %s on the bridge", policy, n, s.name, m.what)
			}
			if !m.inside && n == 0 {
				t.Errorf("%s: %s's %s not seen on the bridge", policy, s.name, m.what)
			}
		}
	}

	// Neighbours: R's gw link knows only the inner address. S's eth0 link
	// address is logged next to the source address of the frames the
	// sandbox sent: children share the inner address, but each sends from
	// its own eth0's address.
	for _, s := range sibs {
		neigh, mac := siblingNeighbours(t, s)
		for _, n := range neigh {
			if n.IP.String() != s.sb.Network.Address {
				t.Errorf("%s: %s's router has a neighbour %s (%s) on gw, want only %s",
					policy, s.name, n.IP, n.HardwareAddr, s.sb.Network.Address)
			}
		}
		srcs, arpDst := map[string]int{}, map[string]int{}
		for _, f := range s.caps[capEth0].matching(s.match("gw")) {
			srcs[net.HardwareAddr(f[6:12]).String()]++
		}
		for _, f := range s.caps[capEth0].matching(s.match("arp")) {
			arpDst[net.HardwareAddr(f[0:6]).String()]++
		}
		t.Logf("%s: %s: eth0 link address %s, sends from %v, ARP requests to %v; gw neighbours %v",
			policy, s.name, mac, srcs, arpDst, neigh)
	}
	// The outer side is one L2 segment: ARP about a child's outer address
	// (the host's requests, its router's) is flooded to every port. Logged,
	// not asserted: it is the host's and the routers' traffic, never the
	// sandbox's, and R never passes it on.
	for i, s := range sibs {
		o := sibs[1-i]
		outer := net.ParseIP(o.sb.Network.Outer)
		for _, c := range s.caps[capUp:] {
			t.Logf("%s: ARP frames about %s's outer address %s on %s: %d", policy, o.name, outer, c.label, c.count(arpAbout(outer)))
		}
	}
	d.must("rm", "-f", kids[0], kids[1], parent)
}

// siblingNeighbours returns the IPv4 neighbours on gw in s's router and the
// link address of eth0 in s's sandbox namespace.
func siblingNeighbours(t *testing.T, s *sibling) ([]netlink.Neigh, net.HardwareAddr) {
	t.Helper()
	handle := func(path string) *netlink.Handle {
		ns, err := netns.GetFromPath(path)
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	hr := handle(s.rNS)
	defer hr.Close()
	gw, err := hr.LinkByName("gw")
	if err != nil {
		t.Fatal(err)
	}
	var neigh []netlink.Neigh
	eventually(t, 5*time.Second, func() (err error) {
		neigh, err = hr.NeighList(gw.Attrs().Index, netlink.FAMILY_V4)
		return err
	})
	hs := handle(s.sNS)
	defer hs.Close()
	eth0, err := hs.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return neigh, eth0.Attrs().HardwareAddr
}

// lastAddr returns the last address of p (its broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	bits := p.Bits()
	for i := range a {
		for b := 0; b < 8; b++ {
			if i*8+b >= bits {
				a[i] |= 0x80 >> b
			}
		}
	}
	return netip.AddrFrom4(a)
}
