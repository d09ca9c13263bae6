package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/network"
	"github.com/k7-dev/k7/internal/store"
)

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// minMemory is the smallest memory limit a sandbox may ask for.
const minMemory = 16 << 20

func validName(kind, name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("invalid %s name %q: want 1-63 characters of [a-zA-Z0-9_.-] starting with a letter or digit: %w", kind, name, errdefs.ErrInvalidArgument)
	}
	return nil
}

func validEnv(env []string) error {
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("invalid env entry %q: want KEY=VALUE: %w", e, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func validResources(r v1.Resources) error {
	if r.CPUs < 0 || r.MemoryBytes < 0 || r.PIDs < 0 {
		return fmt.Errorf("resources must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	if r.MemoryBytes != 0 && r.MemoryBytes < minMemory {
		return fmt.Errorf("memory_bytes %d is below the minimum of 16 MiB: %w", r.MemoryBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

func toAPI(r *store.Sandbox) v1.Sandbox {
	net, ports := apiNetwork(r.Network)
	return v1.Sandbox{
		ID:        r.ID,
		Name:      r.Name,
		Image:     r.Image,
		ImageID:   r.ImageID,
		Engine:    r.Engine,
		State:     r.State,
		Reason:    r.Reason,
		Hostname:  r.Hostname,
		Env:       r.Env,
		Resources: v1.Resources(r.Resources),
		Parent:    r.Parent,
		Created:   r.Created,
		Network:   net,
		Ports:     ports,
	}
}

func engineResources(r store.Resources) engine.Resources {
	return engine.Resources{CPUs: r.CPUs, MemoryBytes: r.MemoryBytes, PIDs: r.PIDs}
}

// mergeEnv returns base with over's keys replacing base's.
func mergeEnv(base, over []string) []string {
	out := slices.Clone(base)
	for _, e := range over {
		k, _, _ := strings.Cut(e, "=")
		out = slices.DeleteFunc(out, func(b string) bool { bk, _, _ := strings.Cut(b, "="); return bk == k })
		out = append(out, e)
	}
	return out
}

func (d *Daemon) sbLog(id string) *slog.Logger { return d.log.With("sandbox", id) }

// CreateSandbox validates req, resolves its image and starts the sandbox.
// Once validated, the work runs on the daemon's context: a request that
// goes away leaves either a running sandbox or nothing.
func (d *Daemon) CreateSandbox(ctx context.Context, req *v1.CreateSandboxRequest) (*v1.Sandbox, error) {
	start := time.Now()
	if req.Image == "" {
		return nil, fmt.Errorf("image is required: %w", errdefs.ErrInvalidArgument)
	}
	if req.Name != "" {
		if err := validName("sandbox", req.Name); err != nil {
			return nil, err
		}
	}
	if err := validEnv(req.Env); err != nil {
		return nil, err
	}
	if err := validResources(req.Resources); err != nil {
		return nil, err
	}
	engName := req.Engine
	if engName == "" {
		engName = d.cfg.DefaultEngine
	}
	eng, err := d.engine(engName)
	if err != nil {
		return nil, err
	}
	plan, err := d.planNetwork(eng, req.Network, req.Allow, req.Ports)
	if err != nil {
		return nil, err
	}
	img, rootfs, err := d.images.Rootfs(ctx, req.Image)
	if err != nil {
		return nil, fmt.Errorf("resolving image %q: %w", req.Image, err)
	}
	id := store.NewID()
	name := req.Name
	if name == "" {
		name = id[:12]
	}
	rec := &store.Sandbox{
		ID:        id,
		Name:      name,
		Image:     req.Image,
		ImageID:   img.ID,
		Engine:    eng.Name(),
		State:     v1.StateCreating,
		Hostname:  name,
		Env:       req.Env,
		Resources: store.Resources(req.Resources),
		Created:   time.Now().UTC(),
	}
	sb := d.entry(id)
	_ = sb.acquire(ctx) // fresh ID: never contended
	defer sb.release()
	if err := d.store.CreateSandbox(rec); err != nil {
		d.forget(id)
		return nil, err
	}
	octx, cancel := d.opContext()
	defer cancel()
	creq := &engine.CreateRequest{
		ID:        id,
		Hostname:  rec.Hostname,
		Rootfs:    rootfs,
		Env:       mergeEnv(img.Env, req.Env),
		Resources: engineResources(rec.Resources),
	}
	var att *network.Attachment
	if plan.policy != network.PolicyNone {
		err = step(octx, d.sbLog(id), "network", func(ctx context.Context) error {
			var err error
			att, rec.Network, err = d.setupNetwork(ctx, id, rec.Hostname, plan, netip.Addr{})
			return err
		})
		if err != nil {
			_ = d.store.DeleteSandbox(id, false)
			d.forget(id)
			d.metrics.ObserveOp("create", eng.Name(), time.Since(start), err)
			return nil, fmt.Errorf("creating sandbox %s: %w", name, err)
		}
		creq.Netns = att.NetnsPath
	}
	err = d.bringUp(octx, sb, eng, rec, func(ctx context.Context) error { return eng.Create(ctx, creq) }, false, dnsFiles(att, rec.Hostname))
	d.metrics.ObserveOp("create", eng.Name(), time.Since(start), err)
	if err != nil {
		cctx, cancel := d.cleanupContext()
		d.teardownNetwork(cctx, id, rec.Network)
		cancel()
		d.forget(id)
		return nil, fmt.Errorf("creating sandbox %s: %w", name, err)
	}
	out := toAPI(rec)
	d.sbLog(id).Info("sandbox created", "name", name, "image", req.Image, "engine", eng.Name(), "took", time.Since(start))
	return &out, nil
}

// bringUp starts a recorded sandbox with start (engine Create or Restore),
// connects its agent, configures the host name, writes files (the DNS
// configuration) and records it running. On error everything is undone,
// the record included, but not the sandbox's network (the caller's). With
// ping, it returns when the agent answered its first ping.
func (d *Daemon) bringUp(ctx context.Context, sb *sandbox, eng engine.Engine, rec *store.Sandbox, start func(context.Context) error, ping bool, files map[string][]byte) error {
	log := d.sbLog(rec.ID)
	cu := cleanup{log: log}
	defer func() {
		cctx, cancel := d.cleanupContext()
		defer cancel()
		cu.run(cctx)
	}()
	cu.add("delete record", func(context.Context) error { return d.store.DeleteSandbox(rec.ID, false) })
	cu.add("delete engine sandbox", func(ctx context.Context) error { return eng.Delete(ctx, rec.ID) })
	if err := step(ctx, log, "start", start); err != nil {
		return err
	}
	var a Agent
	if err := step(ctx, log, "connect agent", func(ctx context.Context) error {
		var err error
		a, err = d.connect(ctx, eng, rec.ID)
		return err
	}); err != nil {
		return err
	}
	cu.add("close agent", func(context.Context) error { return a.Close() })
	if err := step(ctx, log, "configure", func(ctx context.Context) error { return a.Configure(ctx, rec.Hostname) }); err != nil {
		return err
	}
	if len(files) > 0 {
		_ = step(ctx, log, "dns files", func(ctx context.Context) error { d.writeDNS(ctx, a, rec.ID, files); return nil })
	}
	if ping {
		if err := step(ctx, log, "ping", func(ctx context.Context) error {
			_, err := a.Ping(ctx)
			return err
		}); err != nil {
			return err
		}
	}
	rec.State = v1.StateRunning
	if err := d.store.UpdateSandbox(rec); err != nil {
		return err
	}
	cu.release()
	d.attach(sb, a)
	return nil
}

// connect opens the agent stream of id and handshakes.
func (d *Daemon) connect(ctx context.Context, eng engine.Engine, id string) (Agent, error) {
	rw, err := eng.Connect(ctx, id)
	if err != nil {
		return nil, err
	}
	a := d.newAgent(rw)
	if _, err := a.Handshake(ctx); err != nil {
		_ = a.Close()
		return nil, fmt.Errorf("handshake with agent: %w", err)
	}
	return a, nil
}

// attach makes a the agent of sb and watches it.
func (d *Daemon) attach(sb *sandbox, a Agent) {
	sb.setAgent(a)
	d.wg.Add(1)
	go d.watch(sb, a)
}

// ListSandboxes returns every sandbox, oldest first.
func (d *Daemon) ListSandboxes(ctx context.Context) ([]v1.Sandbox, error) {
	recs, err := d.store.ListSandboxes()
	if err != nil {
		return nil, err
	}
	out := make([]v1.Sandbox, 0, len(recs))
	for i := range recs {
		out = append(out, toAPI(&recs[i]))
	}
	return out, nil
}

// GetSandbox returns the sandbox ref (ID, unique ID prefix or name) with
// its current stats when it runs.
func (d *Daemon) GetSandbox(ctx context.Context, ref string) (*v1.Sandbox, error) {
	rec, err := d.store.FindSandbox(ref)
	if err != nil {
		return nil, err
	}
	out := toAPI(rec)
	if rec.State == v1.StateRunning || rec.State == v1.StatePaused {
		if eng, err := d.engine(rec.Engine); err == nil {
			if st, err := eng.Stats(ctx, rec.ID); err == nil {
				out.Stats = &v1.Stats{CPUNS: int64(st.CPU), MemoryBytes: st.MemoryBytes, PIDs: st.PIDs}
			}
		}
	}
	return &out, nil
}

// PauseSandbox freezes a running sandbox. Pausing a sandbox that is not
// running (paused included) is errdefs.ErrFailedPrecondition.
func (d *Daemon) PauseSandbox(ctx context.Context, ref string) (*v1.OpResult, error) {
	return d.setRunState(ctx, ref, "pause", v1.StateRunning, v1.StatePaused)
}

// ResumeSandbox continues a paused sandbox. Resuming a sandbox that is not
// paused is errdefs.ErrFailedPrecondition.
func (d *Daemon) ResumeSandbox(ctx context.Context, ref string) (*v1.OpResult, error) {
	return d.setRunState(ctx, ref, "resume", v1.StatePaused, v1.StateRunning)
}

func (d *Daemon) setRunState(ctx context.Context, ref, op, from, to string) (*v1.OpResult, error) {
	start := time.Now()
	sb, rec, unlock, err := d.lockSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rec.State != from {
		return nil, fmt.Errorf("cannot %s sandbox %s: it is %s: %w", op, rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	eng, err := d.engine(rec.Engine)
	if err != nil {
		return nil, err
	}
	octx, cancel := d.opContext()
	defer cancel()
	if op == "pause" {
		err = eng.Pause(octx, rec.ID)
	} else {
		err = eng.Resume(octx, rec.ID)
	}
	d.metrics.ObserveOp(op, rec.Engine, time.Since(start), err)
	if err != nil {
		return nil, fmt.Errorf("%s sandbox %s: %w", op+"ing", rec.ID, err)
	}
	rec.State, rec.Reason = to, ""
	if err := d.store.UpdateSandbox(rec); err != nil {
		return nil, err
	}
	if to == v1.StateRunning && sb.getAgent() == nil {
		if a, err := d.connect(octx, eng, rec.ID); err == nil {
			d.attach(sb, a)
		} else {
			d.sbLog(rec.ID).Warn("reconnecting agent after resume", "err", err)
		}
	}
	d.sbLog(rec.ID).Info("sandbox "+to, "took", time.Since(start))
	return &v1.OpResult{ID: rec.ID, State: to}, nil
}

// DeleteSandbox stops and removes a sandbox in any state and keeps a
// tombstone for the fork tree. If the engine fails, the record stays
// (errdefs.ErrUnavailable) unless force is set.
func (d *Daemon) DeleteSandbox(ctx context.Context, ref string, force bool) (*v1.OpResult, error) {
	start := time.Now()
	sb, rec, unlock, err := d.lockSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	err = d.deleteLocked(sb, rec, force)
	d.metrics.ObserveOp("delete", rec.Engine, time.Since(start), err)
	if err != nil {
		return nil, err
	}
	return &v1.OpResult{ID: rec.ID, State: "deleted"}, nil
}

func (d *Daemon) deleteLocked(sb *sandbox, rec *store.Sandbox, force bool) error {
	log := d.sbLog(rec.ID)
	sb.setAgent(nil)
	octx, cancel := d.opContext()
	defer cancel()
	// Its spare (spare.go) goes at the same time; one started meanwhile
	// goes after the record.
	spares := make(chan struct{})
	go func() {
		defer close(spares)
		d.dropSpares(rec.ID)
	}()
	defer func() { <-spares }()
	if eng, err := d.engine(rec.Engine); err != nil {
		if !force {
			return fmt.Errorf("deleting sandbox %s: %w", rec.ID, err)
		}
	} else if err := eng.Delete(octx, rec.ID); err != nil {
		if !force {
			return fmt.Errorf("deleting sandbox %s: %w: %w", rec.ID, errdefs.ErrUnavailable, err)
		}
		log.Warn("engine failed to delete sandbox; removing the record anyway (force)", "err", err)
	}
	d.teardownNetwork(octx, rec.ID, rec.Network)
	if err := d.store.DeleteSandbox(rec.ID, true); err != nil {
		return err
	}
	<-spares
	d.dropSpares(rec.ID)
	d.forget(rec.ID)
	log.Info("sandbox deleted", "name", rec.Name)
	return nil
}

// Prune deletes every sandbox of this daemon and returns their IDs.
func (d *Daemon) Prune(ctx context.Context) ([]string, error) {
	recs, err := d.store.ListSandboxes()
	if err != nil {
		return nil, err
	}
	out := []string{}
	var errs []error
	for _, r := range recs {
		if _, err := d.DeleteSandbox(ctx, r.ID, true); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			errs = append(errs, err)
			continue
		}
		out = append(out, r.ID)
	}
	return out, errors.Join(errs...)
}

// readyAgent checks that rec can run commands and returns its agent.
func (d *Daemon) readyAgent(sb *sandbox, rec *store.Sandbox) (Agent, error) {
	switch rec.State {
	case v1.StateRunning:
	case v1.StatePaused:
		return nil, fmt.Errorf("sandbox %s is paused: %w", rec.ID, errdefs.ErrFailedPrecondition)
	default:
		msg := fmt.Sprintf("sandbox %s is %s", rec.ID, rec.State)
		if rec.Reason != "" {
			msg += " (" + rec.Reason + ")"
		}
		return nil, fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
	}
	a := sb.getAgent()
	if a == nil {
		return nil, fmt.Errorf("agent of sandbox %s is not connected: %w", rec.ID, errdefs.ErrUnavailable)
	}
	return a, nil
}

// agentFor resolves ref, checks that it runs and returns its agent without
// holding the sandbox's lock afterwards (for long transfers).
func (d *Daemon) agentFor(ctx context.Context, ref string) (Agent, *store.Sandbox, error) {
	sb, rec, unlock, err := d.lockSandbox(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	a, err := d.readyAgent(sb, rec)
	return a, rec, err
}

// Exec starts a command in the sandbox ref. The returned process's Wait
// records the exec latency. ctx bounds the start only; the caller kills
// the command if it must not outlive its client.
func (d *Daemon) Exec(ctx context.Context, ref string, req *v1.ExecRequest, stdio client.Stdio) (client.Process, error) {
	start := time.Now()
	if len(req.Args) == 0 || req.Args[0] == "" {
		return nil, fmt.Errorf("exec: args are required: %w", errdefs.ErrInvalidArgument)
	}
	if err := validEnv(req.Env); err != nil {
		return nil, err
	}
	if req.TimeoutNS < 0 {
		return nil, fmt.Errorf("exec: negative timeout: %w", errdefs.ErrInvalidArgument)
	}
	sb, rec, unlock, err := d.lockSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	a, err := d.readyAgent(sb, rec)
	if err != nil {
		return nil, err
	}
	creq := &client.ExecRequest{
		Args:    req.Args,
		Env:     req.Env,
		Cwd:     req.Cwd,
		User:    req.User,
		TTY:     req.TTY,
		Rows:    req.Rows,
		Cols:    req.Cols,
		Stdin:   req.Stdin || req.StdinData != nil,
		Detach:  req.Detach,
		Timeout: time.Duration(req.TimeoutNS),
	}
	p, err := a.Exec(ctx, creq, stdio)
	if err != nil {
		d.metrics.ObserveOp("exec", rec.Engine, time.Since(start), err)
		return nil, fmt.Errorf("exec in sandbox %s: %w", rec.ID, err)
	}
	d.sbLog(rec.ID).Debug("exec started", "args", req.Args, "pid", p.PID(), "detach", req.Detach)
	return &process{Process: p, d: d, engine: rec.Engine, start: start}, nil
}

type process struct {
	client.Process
	d      *Daemon
	engine string
	start  time.Time
}

func (p *process) Wait(ctx context.Context) (client.ExitStatus, error) {
	st, err := p.Process.Wait(ctx)
	p.d.metrics.ObserveOp("exec", p.engine, time.Since(p.start), err)
	return st, err
}

// CheckPath rejects relative paths and paths with "..".
func CheckPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	if slices.Contains(strings.Split(p, "/"), "..") {
		return fmt.Errorf("path %q contains \"..\": %w", p, errdefs.ErrInvalidArgument)
	}
	return nil
}

// PutFile writes r to path in the sandbox ref.
func (d *Daemon) PutFile(ctx context.Context, ref, path string, mode uint32, r io.Reader) error {
	if err := CheckPath(path); err != nil {
		return err
	}
	a, rec, err := d.agentFor(ctx, ref)
	if err != nil {
		return err
	}
	if err := a.PutFile(ctx, path, mode, r); err != nil {
		return fmt.Errorf("writing %s in sandbox %s: %w", path, rec.ID, err)
	}
	return nil
}

// GetFile streams the file at path in the sandbox ref to w.
func (d *Daemon) GetFile(ctx context.Context, ref, path string, w io.Writer) error {
	if err := CheckPath(path); err != nil {
		return err
	}
	a, rec, err := d.agentFor(ctx, ref)
	if err != nil {
		return err
	}
	if err := a.GetFile(ctx, path, w); err != nil {
		return fmt.Errorf("reading %s in sandbox %s: %w", path, rec.ID, err)
	}
	return nil
}

// logPoll is how often a followed log is polled for new bytes.
const logPoll = 200 * time.Millisecond

// Logs copies the console log of the sandbox ref to w. With follow, it
// keeps polling for new bytes until ctx ends or the sandbox is deleted;
// flush is called after each batch. start is called once the sandbox is
// found, before any byte is written.
func (d *Daemon) Logs(ctx context.Context, ref string, follow bool, w io.Writer, start, flush func()) error {
	rec, err := d.store.FindSandbox(ref)
	if err != nil {
		return err
	}
	eng, err := d.engine(rec.Engine)
	if err != nil {
		return err
	}
	rc, err := eng.Logs(ctx, rec.ID)
	if err != nil {
		return fmt.Errorf("opening logs of sandbox %s: %w", rec.ID, err)
	}
	defer rc.Close()
	start()
	t := time.NewTicker(logPoll)
	defer t.Stop()
	for {
		n, err := io.Copy(w, rc)
		if err != nil {
			return err
		}
		if n > 0 {
			flush()
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := d.store.GetSandbox(rec.ID); err != nil {
			_, _ = io.Copy(w, rc)
			flush()
			return nil
		}
	}
}
