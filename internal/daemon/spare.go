package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/network"
	"github.com/k7-dev/k7/internal/store"
)

// Spares: a networked fork child needs a network namespace of its own
// holding its parent's address, and on gVisor a container created in that
// namespace ("runsc create"), before the capture can be loaded into it. Both
// are the same for every child of a parent, so after a fork of a networked
// sandbox the daemon prepares them off the request path for one more child
// under a fresh sandbox ID (a spare), and the parent's next fork starts its
// first child there. (Making the spare during the first fork's capture
// instead was measured: the fork was no faster and the source's pause grew
// from ≈ 100 to ≈ 165 ms on a 2-vCPU VM, even with the spare niced.) Spares have no store record: a daemon restart deletes
// them as orphans (engine sandboxes and networks without a record).

const (
	// spareCap bounds the spares held or being made at once; when it is
	// reached the oldest spare gives way.
	spareCap = 4
	// spareHostname is the host name a spare's network is set up with;
	// the child that takes it gets its own /etc/hosts.
	spareHostname = "k7-spare"
)

// spareWait bounds how long a fork waits for its parent's spare while it
// is being made (takeSpare).
const spareWait = 5 * time.Second

// spareTimeout bounds the making of one spare.
const spareTimeout = time.Minute

// spareDelay is how long after a fork the next spare is started: the
// children's first requests (typically an exec into each, right away)
// should not share the CPUs with its "runsc create" (measured: a first
// fork → child exec went from ≈ 1.24 s to ≈ 1.02 s through the CLI). A fork
// that comes sooner waits for the spare being made (waitSpare) or makes
// its first child itself.
const spareDelay = time.Second

// spare is a sandbox ID with its network set up and its engine sandbox
// pre-created (engine.Precreator) for the next fork child of parent.
type spare struct {
	parent string
	id     string
	engine string
	rootfs string
	res    store.Resources
	plan   netPlan
	inner  netip.Addr
	att    *network.Attachment
	net    *store.Network
	made   time.Time
}

type spareFill struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// spares are the daemon's spares, at most one per parent.
type spares struct {
	mu      sync.Mutex
	ready   map[string]*spare     // by parent ID
	filling map[string]*spareFill // by parent ID
	closed  bool
}

// matches reports whether sp can become a child with this engine, rootfs,
// resources and network.
func (sp *spare) matches(eng string, rootfs string, res store.Resources, plan netPlan, inner netip.Addr) bool {
	return sp.engine == eng && sp.rootfs == rootfs && sp.res == res && sp.inner == inner &&
		sp.plan.policy == plan.policy && slices.Equal(sp.plan.allow, plan.allow) && slices.Equal(sp.plan.ports, plan.ports)
}

// waitSpare waits (at most spareWait) for parent's spare if it is being
// made: its work, network setup and engine pre-create, is what the fork
// would otherwise do itself, and is under way. A fork waits before it
// captures the parent, without its lock, so that the parent's pause does
// not share the CPUs with the spare's "runsc create".
func (d *Daemon) waitSpare(ctx context.Context, parent string) {
	d.spares.mu.Lock()
	fill := d.spares.filling[parent]
	d.spares.mu.Unlock()
	if fill == nil {
		return
	}
	t := time.NewTimer(spareWait)
	defer t.Stop()
	select {
	case <-fill.done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// takeSpare removes and returns parent's spare, or nil.
func (d *Daemon) takeSpare(parent string) *spare {
	d.spares.mu.Lock()
	defer d.spares.mu.Unlock()
	sp := d.spares.ready[parent]
	delete(d.spares.ready, parent)
	return sp
}

// discardSpare deletes sp's engine sandbox and network.
func (d *Daemon) discardSpare(sp *spare) {
	ctx, cancel := d.cleanupContext()
	defer cancel()
	if eng, err := d.engine(sp.engine); err == nil {
		if err := eng.Delete(ctx, sp.id); err != nil {
			d.sbLog(sp.id).Warn("deleting spare", "parent", sp.parent, "err", err)
		}
	}
	d.teardownNetwork(ctx, sp.id, sp.net)
	d.sbLog(sp.id).Debug("spare discarded", "parent", sp.parent)
}

// discardSpareLater discards sp in the background.
func (d *Daemon) discardSpareLater(sp *spare) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.discardSpare(sp)
	}()
}

// refillSpare starts making a spare for rec, a sandbox just forked, in the
// background, unless rec has no network, its engine cannot pre-create, or
// it has a spare ready or being made. It never blocks on the work.
func (d *Daemon) refillSpare(rec *store.Sandbox) {
	if rec.Network == nil || rec.Network.Policy == string(network.PolicyNone) {
		return
	}
	eng, err := d.engine(rec.Engine)
	if err != nil {
		return
	}
	if _, ok := eng.(engine.Precreator); !ok {
		return
	}
	s := &d.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.ready[rec.ID] != nil || s.filling[rec.ID] != nil {
		return
	}
	// Under s.mu: deleteLocked removes the record before it drops the
	// parent's spares, so a fill either sees no record or is dropped.
	if _, err := d.store.GetSandbox(rec.ID); err != nil {
		return
	}
	var evict *spare
	if len(s.ready)+len(s.filling) >= spareCap {
		for _, sp := range s.ready {
			if evict == nil || sp.made.Before(evict.made) {
				evict = sp
			}
		}
		if evict == nil {
			return // every slot is being filled
		}
		delete(s.ready, evict.parent)
	}
	ctx, cancel := context.WithTimeout(d.ctx, spareTimeout)
	fill := &spareFill{cancel: cancel, done: make(chan struct{})}
	s.filling[rec.ID] = fill
	parent := *rec
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(fill.done)
		defer cancel()
		if evict != nil {
			d.discardSpare(evict)
		}
		sp, err := d.makeSpare(ctx, &parent)
		s.mu.Lock()
		delete(s.filling, parent.ID)
		keep := err == nil && !s.closed && ctx.Err() == nil
		if keep {
			// Under s.mu: deleteLocked removes the record before it
			// drops the parent's spares.
			_, gerr := d.store.GetSandbox(parent.ID)
			keep = gerr == nil
		}
		if keep {
			s.ready[parent.ID] = sp
		}
		s.mu.Unlock()
		switch {
		case err != nil:
			if ctx.Err() == nil {
				d.sbLog(parent.ID).Warn("making a spare for the next fork", "err", err)
			}
		case !keep:
			d.discardSpare(sp)
		default:
			d.sbLog(parent.ID).Debug("spare ready", "spare", sp.id, "took", time.Since(sp.made))
		}
	}()
}

// refillSpareLater calls refillSpare for parent spareDelay from now, if it
// still runs then.
func (d *Daemon) refillSpareLater(parent string) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTimer(spareDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-d.ctx.Done():
			return
		}
		if rec, err := d.store.GetSandbox(parent); err == nil && rec.State == v1.StateRunning {
			d.refillSpare(rec)
		}
	}()
}

// makeSpare sets up the network and pre-creates the engine sandbox of a
// spare for the next fork child of parent. On error nothing is left.
func (d *Daemon) makeSpare(ctx context.Context, parent *store.Sandbox) (*spare, error) {
	start := time.Now()
	eng, err := d.engine(parent.Engine)
	if err != nil {
		return nil, err
	}
	pc, ok := eng.(engine.Precreator)
	if !ok {
		return nil, fmt.Errorf("engine %s cannot pre-create: %w", eng.Name(), errdefs.ErrFailedPrecondition)
	}
	plan, inner, err := d.childPlan(eng, parent.Network, nil, 1)
	if err != nil {
		return nil, err
	}
	img, rootfs, err := d.childRootfs(ctx, parent.Image, parent.ImageID)
	if err != nil {
		return nil, err
	}
	id := store.NewID()
	att, sn, err := d.setupNetwork(ctx, id, spareHostname, plan, inner)
	if err != nil {
		return nil, err
	}
	sp := &spare{parent: parent.ID, id: id, engine: eng.Name(), rootfs: rootfs, res: parent.Resources,
		plan: plan, inner: inner, att: att, net: sn, made: start}
	err = pc.Precreate(ctx, &engine.CreateRequest{
		ID:        id,
		Hostname:  spareHostname,
		Rootfs:    rootfs,
		Env:       mergeEnv(img.Env, parent.Env),
		Resources: engineResources(parent.Resources),
		Netns:     att.NetnsPath,
	})
	if err != nil {
		cctx, cancel := d.cleanupContext()
		d.teardownNetwork(cctx, id, sn)
		cancel()
		return nil, err
	}
	return sp, nil
}

// dropSpares removes parent's spare, waiting for one being made. The
// caller has deleted parent's record.
func (d *Daemon) dropSpares(parent string) {
	s := &d.spares
	s.mu.Lock()
	sp := s.ready[parent]
	delete(s.ready, parent)
	fill := s.filling[parent]
	s.mu.Unlock()
	if fill != nil {
		fill.cancel()
		<-fill.done
	}
	if sp != nil {
		d.discardSpare(sp)
	}
}

// closeSpares stops making spares and deletes every spare. It may be
// repeated.
func (d *Daemon) closeSpares() {
	s := &d.spares
	s.mu.Lock()
	s.closed = true
	ready := s.ready
	s.ready = map[string]*spare{}
	var fills []*spareFill
	for _, f := range s.filling {
		fills = append(fills, f)
	}
	s.mu.Unlock()
	for _, f := range fills {
		f.cancel()
		<-f.done
	}
	for _, sp := range ready {
		d.discardSpare(sp)
	}
}
