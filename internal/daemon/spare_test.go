package daemon

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// precreatingEngine is a testEngine with engine.Precreator: a pre-created
// sandbox is listed (state creating) until a Restore of its ID takes it.
type precreatingEngine struct {
	*testEngine
	pre  map[string]engine.CreateRequest
	used []string // IDs restored into their pre-created sandbox
}

var _ engine.Precreator = (*precreatingEngine)(nil)

func (e *precreatingEngine) Precreate(ctx context.Context, req *engine.CreateRequest) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.sbs[req.ID]; ok {
		return fmt.Errorf("sandbox %s: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	e.sbs[req.ID] = &testSandbox{id: req.ID, state: engine.StateCreating, files: map[string][]byte{}, netns: req.Netns}
	e.pre[req.ID] = *req
	return nil
}

func (e *precreatingEngine) Restore(ctx context.Context, req *engine.RestoreRequest) error {
	e.mu.Lock()
	if p, ok := e.pre[req.ID]; ok {
		delete(e.pre, req.ID)
		delete(e.sbs, req.ID)
		if p.Rootfs == req.Rootfs && p.Netns == req.Netns && p.Resources == req.Resources {
			e.used = append(e.used, req.ID)
		}
	}
	e.mu.Unlock()
	return e.testEngine.Restore(ctx, req)
}

func (e *precreatingEngine) Delete(ctx context.Context, id string) error {
	e.mu.Lock()
	delete(e.pre, id)
	e.mu.Unlock()
	return e.testEngine.Delete(ctx, id)
}

// spares returns the IDs pre-created and not restored.
func (e *precreatingEngine) spares() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Sorted(maps.Keys(e.pre))
}

// waitSpares polls until the engine holds one pre-created sandbox.
func waitSpares(t *testing.T, e *precreatingEngine) []string {
	t.Helper()
	const n = 1
	deadline := time.Now().Add(10 * time.Second)
	for {
		ids := e.spares()
		if len(ids) == n {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("pre-created sandboxes: got %v, want %d", ids, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestForkSpare(t *testing.T) {
	eng := &precreatingEngine{testEngine: newTestEngine(true), pre: map[string]engine.CreateRequest{}}
	eng.network = true
	nets := newTestNetworks()
	cfg := testConfig(t, t.TempDir())
	h := startDaemonNet(t, cfg, eng, nets)
	defer h.stop()

	var web v1.Sandbox
	if code, e := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: "web", Ports: []v1.Port{{Port: 8080}}}, &web); code != 201 {
		t.Fatalf("create: %d %+v", code, e)
	}
	if got := eng.spares(); len(got) != 0 {
		t.Errorf("spares after create: %v, want none (made after the first fork)", got)
	}
	fork := func(req v1.ForkRequest) v1.ForkResult {
		t.Helper()
		var res v1.ForkResult
		if code, e := h.do("POST", "/v1/sandboxes/web/fork", req, &res); code/100 != 2 {
			t.Fatalf("fork: %d %+v", code, e)
		}
		return res
	}
	fork(v1.ForkRequest{})
	spare := waitSpares(t, eng)[0]
	if !nets.has(spare) {
		t.Errorf("spare %s has no network", spare)
	}

	// The second fork's first child is the spare; the others are made as
	// usual.
	res := fork(v1.ForkRequest{Count: 3})
	if got := res.Children[0].Sandbox.ID; got != spare {
		t.Errorf("first child: got %s, want the spare %s", got, spare)
	}
	eng.mu.Lock()
	used := slices.Clone(eng.used)
	eng.mu.Unlock()
	if !slices.Equal(used, []string{spare}) {
		t.Errorf("restored into pre-created sandboxes: got %v, want [%s]", used, spare)
	}
	hostPorts := map[int]bool{web.Ports[0].HostPort: true}
	for _, c := range res.Children {
		sb := c.Sandbox
		if sb.State != v1.StateRunning || sb.Network == nil || sb.Network.Address != web.Network.Address || sb.Network.Policy != "isolated" {
			t.Errorf("child %s: state %s network %+v, want running with the parent's address %s", sb.Name, sb.State, sb.Network, web.Network.Address)
		}
		if len(sb.Ports) != 1 || sb.Ports[0].Port != 8080 || hostPorts[sb.Ports[0].HostPort] {
			t.Errorf("child %s ports %+v, want 8080 on a host port of its own", sb.Name, sb.Ports)
		}
		hostPorts[sb.Ports[0].HostPort] = true
		eng.mu.Lock()
		hosts := string(eng.sbs[sb.ID].files["/etc/hosts"])
		eng.mu.Unlock()
		if !strings.Contains(hosts, "\t"+sb.Name+"\n") {
			t.Errorf("child %s /etc/hosts = %q, want its own name", sb.Name, hosts)
		}
		if got, code := h.get(sb.ID); code != 200 || got.Name != sb.Name || got.Parent != web.ID {
			t.Errorf("GET child %s: %d %+v", sb.ID, code, got)
		}
	}

	// A fork whose network differs from the spare's does not take it.
	spare = waitSpares(t, eng)[0]
	res = fork(v1.ForkRequest{Ports: []v1.Port{{Port: 9090}}})
	if got := res.Children[0].Sandbox.ID; got == spare {
		t.Errorf("a fork publishing other ports took the spare")
	}
	if res.Children[0].Sandbox.Ports[0].Port != 9090 {
		t.Errorf("child ports %+v, want 9090", res.Children[0].Sandbox.Ports)
	}
	spare = waitSpares(t, eng)[0]
	if nets.has(res.Children[0].Sandbox.ID) == false {
		t.Errorf("child has no network")
	}

	// Deleting the parent deletes its spare, engine sandbox and network.
	if code, e := h.do("DELETE", "/v1/sandboxes/web", nil, nil); code/100 != 2 {
		t.Fatalf("delete: %d %+v", code, e)
	}
	if eng.has(spare) || nets.has(spare) {
		t.Errorf("spare %s of the deleted parent left: engine %v, network %v", spare, eng.has(spare), nets.has(spare))
	}

	// A child forked twice gets a spare of its own; shutdown deletes it.
	child := res.Children[0].Sandbox.ID
	for range 2 {
		if code, e := h.do("POST", "/v1/sandboxes/"+child+"/fork", v1.ForkRequest{}, nil); code/100 != 2 {
			t.Fatalf("fork child: %d %+v", code, e)
		}
	}
	spare = waitSpares(t, eng)[0]
	h.stop()
	if eng.has(spare) || nets.has(spare) {
		t.Errorf("spare %s left after shutdown: engine %v, network %v", spare, eng.has(spare), nets.has(spare))
	}
}
