package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/network"
	"github.com/k7-dev/k7/internal/store"
)

// maxChildren bounds one fork or restore.
const maxChildren = 64

// forker returns rec's engine as a Forker, or errdefs.ErrFailedPrecondition.
func (d *Daemon) forker(engName string) (engine.Engine, engine.Forker, error) {
	eng, err := d.engine(engName)
	if err != nil {
		return nil, nil, err
	}
	f, ok := eng.(engine.Forker)
	if !ok || !eng.Capabilities().Fork {
		return nil, nil, fmt.Errorf("engine %s cannot fork: %w", engName, errdefs.ErrFailedPrecondition)
	}
	return eng, f, nil
}

func engineVersion(eng engine.Engine) string {
	if v, ok := eng.(interface{ Version() string }); ok {
		return v.Version()
	}
	return ""
}

// childNames returns count names: PREFIX-1..N for an explicit prefix,
// else DEFAULT-n numbered after the highest name already used (live or
// deleted), so that repeated forks never collide.
func (d *Daemon) childNames(prefix, def string, count int, single string) ([]string, error) {
	if single != "" && count == 1 {
		return []string{single}, validName("sandbox", single)
	}
	if single != "" {
		prefix = single
	}
	if prefix != "" {
		var names []string
		for i := 1; i <= count; i++ {
			n := fmt.Sprintf("%s-%d", prefix, i)
			if err := validName("sandbox", n); err != nil {
				return nil, err
			}
			names = append(names, n)
		}
		return names, nil
	}
	if len(def) > 50 {
		def = def[:50]
	}
	next := 1
	live, _ := d.store.ListSandboxes()
	dead, _ := d.store.ListTombstones()
	for _, r := range append(live, dead...) {
		if rest, ok := strings.CutPrefix(r.Name, def+"-"); ok {
			if n, err := strconv.Atoi(rest); err == nil && n >= next {
				next = n + 1
			}
		}
	}
	var names []string
	for i := range count {
		names = append(names, fmt.Sprintf("%s-%d", def, next+i))
	}
	return names, nil
}

// childSpec is what the children of a fork or restore share.
type childSpec struct {
	engine    engine.Engine
	forker    engine.Forker
	from      string // capture directory
	parent    string // sandbox ID or snapshot name
	image     string
	imageID   string
	env       []string
	resources store.Resources
	// net is the source's network: every child gets the same policy and
	// in-sandbox address in a namespace of its own (nil: policy none).
	net *store.Network
	// ports are the children's published ports; nil: net's ports on free
	// host ports.
	ports []v1.Port
	// spare, if set, is taken by the first child when it matches, and
	// discarded otherwise (spare.go).
	spare *spare
	// fork: the children come from a live capture made just now, not a
	// snapshot, so their resolv.conf is current.
	fork bool
}

// childCount validates the number of children a fork or restore asks for
// (0 means 1).
func childCount(op string, n int) (int, error) {
	if n == 0 {
		return 1, nil
	}
	if n < 0 || n > maxChildren {
		return 0, fmt.Errorf("%s count %d: want 1 to %d: %w", op, n, maxChildren, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// childRootfs resolves the image of a fork or restore child: by reference
// first, then by the recorded image ID.
func (d *Daemon) childRootfs(ctx context.Context, image, imageID string) (*v1.Image, string, error) {
	img, rootfs, err := d.images.Rootfs(ctx, image)
	if err != nil && imageID != "" {
		img, rootfs, err = d.images.Rootfs(ctx, imageID)
	}
	if err != nil {
		return nil, "", fmt.Errorf("resolving image %q: %w", image, err)
	}
	return img, rootfs, nil
}

// spawnChildren records and restores one child per name from spec.from in
// parallel (at most GOMAXPROCS at once). It returns every child or, on any
// failure, none: children already made are deleted.
func (d *Daemon) spawnChildren(ctx context.Context, spec childSpec, names []string, start time.Time) ([]v1.ForkChild, error) {
	sp := spec.spare
	defer func() {
		if sp != nil { // not taken by a recorded child
			d.discardSpareLater(sp)
		}
	}()
	plan, inner, err := d.childPlan(spec.engine, spec.net, spec.ports, len(names))
	if err != nil {
		return nil, err
	}
	img, rootfs, err := d.childRootfs(ctx, spec.image, spec.imageID)
	if err != nil {
		return nil, err
	}
	if sp != nil && !sp.matches(spec.engine.Name(), rootfs, spec.resources, plan, inner) {
		d.sbLog(sp.id).Info("spare does not match the fork; discarding it", "parent", sp.parent)
		d.discardSpareLater(sp)
		sp = nil
	}
	// spareChild is the child that takes sp, if any: the first.
	var spareChild *spare
	// Record every child first: a name conflict fails before any work.
	recs := make([]*store.Sandbox, len(names))
	sbs := make([]*sandbox, len(names))
	undo := func(upto int) {
		cctx, cancel := d.cleanupContext()
		defer cancel()
		for i := range upto {
			if recs[i] == nil {
				continue
			}
			sbs[i].setAgent(nil)
			_ = spec.engine.Delete(cctx, recs[i].ID)
			d.teardownNetwork(cctx, recs[i].ID, recs[i].Network)
			_ = d.store.DeleteSandbox(recs[i].ID, false)
			sbs[i].release()
			d.forget(recs[i].ID)
		}
	}
	for i, name := range names {
		id := store.NewID()
		var net *store.Network
		if i == 0 && sp != nil {
			id, net = sp.id, sp.net
			spareChild, sp = sp, nil
		}
		rec := &store.Sandbox{
			ID:        id,
			Name:      name,
			Image:     spec.image,
			ImageID:   spec.imageID,
			Engine:    spec.engine.Name(),
			State:     v1.StateCreating,
			Hostname:  name,
			Env:       spec.env,
			Resources: spec.resources,
			Parent:    spec.parent,
			Created:   time.Now().UTC(),
			Network:   net,
		}
		sbs[i] = d.entry(rec.ID)
		_ = sbs[i].acquire(ctx) // fresh ID: never contended
		if err := d.store.CreateSandbox(rec); err != nil {
			sbs[i].release()
			d.forget(rec.ID)
			undo(i)
			if spareChild != nil && i == 0 {
				d.discardSpareLater(spareChild)
			}
			return nil, err
		}
		recs[i] = rec
	}

	children := make([]v1.ForkChild, len(names))
	errs := make([]error, len(names))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rec := recs[i]
			rreq := &engine.RestoreRequest{
				CreateRequest: engine.CreateRequest{
					ID:        rec.ID,
					Hostname:  rec.Hostname,
					Rootfs:    rootfs,
					Env:       mergeEnv(img.Env, rec.Env),
					Resources: engineResources(rec.Resources),
				},
				From: spec.from,
			}
			var att *network.Attachment
			if i == 0 && spareChild != nil {
				// The spare's network, with this child's host name.
				a := *spareChild.att
				a.Hosts = network.HostsFile(rec.Hostname, a.Inner.Addr())
				att = &a
				rreq.Netns = att.NetnsPath
				d.sbLog(rec.ID).Debug("taking the spare made for the fork", "parent", spec.parent)
			} else if plan.policy != network.PolicyNone {
				if err := step(ctx, d.sbLog(rec.ID), "network", func(ctx context.Context) error {
					var err error
					att, rec.Network, err = d.setupNetwork(ctx, rec.ID, rec.Hostname, plan, inner)
					return err
				}); err != nil {
					errs[i] = fmt.Errorf("child %d (%s): %w", i+1, rec.Name, err)
					return // undo removes the record
				}
				rreq.Netns = att.NetnsPath
			}
			files := dnsFiles(att, rec.Hostname)
			if spec.fork {
				// The source's resolv.conf, carried by the capture, is
				// what this daemon would write: only the host name differs.
				delete(files, "/etc/resolv.conf")
			}
			err := d.bringUp(ctx, sbs[i], spec.engine, rec, func(ctx context.Context) error { return spec.forker.Restore(ctx, rreq) }, true, files)
			if err != nil {
				cctx, cancel := d.cleanupContext()
				d.teardownNetwork(cctx, rec.ID, rec.Network)
				cancel()
				errs[i] = fmt.Errorf("child %d (%s): %w", i+1, rec.Name, err)
				recs[i] = nil // bringUp removed it
				return
			}
			children[i] = v1.ForkChild{Sandbox: toAPI(rec), ReadyNS: int64(time.Since(start))}
			d.sbLog(rec.ID).Info("sandbox restored", "name", rec.Name, "parent", spec.parent, "ready", time.Since(start))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i := range names {
			if recs[i] == nil {
				sbs[i].release()
				d.forget(sbs[i].id)
			}
		}
		undo(len(names))
		return nil, err
	}
	for _, sb := range sbs {
		sb.release()
	}
	return children, nil
}

// tempDir makes a fresh directory under the state dir's tmp.
func (d *Daemon) tempDir(pattern string) (string, error) {
	return os.MkdirTemp(filepath.Join(d.cfg.StateDir, "tmp"), pattern)
}

// checkpointLocked captures the running sandbox rec into dir and makes
// sure it runs afterwards, whatever happened. The caller holds its lock.
func (d *Daemon) checkpointLocked(ctx context.Context, rec *store.Sandbox, eng engine.Engine, f engine.Forker, dir string) (*engine.CheckpointResult, error) {
	if rec.State != v1.StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not running: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	res, err := f.Checkpoint(ctx, &engine.CheckpointRequest{ID: rec.ID, Dir: dir})
	if err != nil {
		// The source keeps running: if the failed capture left it paused,
		// resume it. (A successful capture leaves it running.)
		cctx, cancel := d.cleanupContext()
		defer cancel()
		if st, serr := eng.Status(cctx, rec.ID); serr == nil && st.State == engine.StatePaused {
			if rerr := eng.Resume(cctx, rec.ID); rerr != nil {
				d.sbLog(rec.ID).Error("resuming source after capture", "err", rerr)
			}
		}
		return nil, fmt.Errorf("capturing sandbox %s: %w", rec.ID, err)
	}
	return res, nil
}

// Fork captures the running sandbox ref once (it keeps running) and starts
// req.Count children from the capture in parallel. Children are named
// PREFIX-i (default <source name>-fork-<n>) and record the source as their
// parent. A fork that fails leaves no child behind.
func (d *Daemon) Fork(ctx context.Context, ref string, req *v1.ForkRequest) (*v1.ForkResult, error) {
	start := time.Now()
	count, err := childCount("fork", req.Count)
	if err != nil {
		return nil, err
	}
	if r, err := d.store.FindSandbox(ref); err == nil {
		d.waitSpare(ctx, r.ID)
	}
	_, rec, unlock, err := d.lockSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	eng, f, err := d.forker(rec.Engine)
	if err != nil {
		return nil, err
	}
	if rec.State != v1.StateRunning {
		return nil, fmt.Errorf("cannot fork sandbox %s: it is %s: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	names, err := d.childNames(req.Name, rec.Name+"-fork", count, "")
	if err != nil {
		return nil, err
	}
	if _, _, err := d.childPlan(eng, rec.Network, req.Ports, count); err != nil {
		return nil, err
	}
	octx, cancel := d.opContext()
	defer cancel()
	dir, err := d.tempDir("fork-" + rec.ID + "-")
	if err != nil {
		return nil, fmt.Errorf("forking sandbox %s: %w", rec.ID, err)
	}
	defer os.RemoveAll(dir)
	cp, err := d.checkpointLocked(octx, rec, eng, f, dir)
	if err != nil {
		d.metrics.ObserveOp("fork", rec.Engine, time.Since(start), err)
		return nil, fmt.Errorf("forking sandbox %s: %w", rec.ID, err)
	}
	unlock()
	locked = false

	children, err := d.spawnChildren(octx, childSpec{
		engine: eng, forker: f, from: dir, parent: rec.ID,
		image: rec.Image, imageID: rec.ImageID, env: rec.Env, resources: rec.Resources,
		net: rec.Network, ports: req.Ports, spare: d.takeSpare(rec.ID), fork: true,
	}, names, start)
	d.metrics.ObserveOp("fork", rec.Engine, time.Since(start), err)
	if err != nil {
		return nil, fmt.Errorf("forking sandbox %s: %w", rec.ID, err)
	}
	d.refillSpareLater(rec.ID)
	d.sbLog(rec.ID).Info("sandbox forked", "children", len(children), "pause", cp.SourcePause, "took", time.Since(start))
	return &v1.ForkResult{Source: rec.ID, SourcePauseNS: int64(cp.SourcePause), Children: children}, nil
}

// Snapshot layout: <state>/snapshots/<name>/manifest.json and capture/.
func (d *Daemon) snapshotDir(name string) string {
	return filepath.Join(d.cfg.StateDir, "snapshots", name)
}

func snapshotAPI(s *store.Snapshot) *v1.Snapshot {
	net, ports := apiNetwork(s.Network)
	return &v1.Snapshot{
		Network:       net,
		Ports:         ports,
		Name:          s.Name,
		Sandbox:       s.Sandbox,
		SandboxName:   s.SandboxName,
		Parent:        s.Parent,
		Engine:        s.Engine,
		EngineVersion: s.EngineVersion,
		Image:         s.Image,
		ImageID:       s.ImageID,
		Env:           s.Env,
		Resources:     v1.Resources(s.Resources),
		Created:       s.Created,
		SizeBytes:     s.SizeBytes,
		Checksum:      s.Checksum,
		SourcePauseNS: s.SourcePauseNS,
	}
}

// CreateSnapshot captures the running sandbox ref (it keeps running) into a
// named, checksummed snapshot that outlives the sandbox and the daemon.
func (d *Daemon) CreateSnapshot(ctx context.Context, ref string, req *v1.SnapshotRequest) (*v1.Snapshot, error) {
	start := time.Now()
	if err := validName("snapshot", req.Name); err != nil {
		return nil, err
	}
	if _, err := d.store.GetSnapshot(req.Name); err == nil {
		return nil, fmt.Errorf("snapshot %q: %w", req.Name, errdefs.ErrAlreadyExists)
	}
	_, rec, unlock, err := d.lockSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	eng, f, err := d.forker(rec.Engine)
	if err != nil {
		return nil, err
	}
	if rec.State != v1.StateRunning {
		return nil, fmt.Errorf("cannot snapshot sandbox %s: it is %s: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(filepath.Join(d.cfg.StateDir, "snapshots"), 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Join(d.cfg.StateDir, "snapshots"), ".tmp-"+req.Name+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp) // a no-op after the rename
	capture := filepath.Join(tmp, "capture")
	if err := os.Mkdir(capture, 0o700); err != nil {
		return nil, err
	}
	octx, cancel := d.opContext()
	defer cancel()
	cp, err := d.checkpointLocked(octx, rec, eng, f, capture)
	if err != nil {
		d.metrics.ObserveOp("snapshot", rec.Engine, time.Since(start), err)
		return nil, fmt.Errorf("snapshotting sandbox %s: %w", rec.ID, err)
	}
	sum, size, err := checksumDir(capture)
	if err != nil {
		return nil, fmt.Errorf("checksumming snapshot %q: %w", req.Name, err)
	}
	sn := &store.Snapshot{
		Name:          req.Name,
		Sandbox:       rec.ID,
		SandboxName:   rec.Name,
		Parent:        rec.Parent,
		Engine:        rec.Engine,
		EngineVersion: firstNonEmpty(cp.EngineVersion, engineVersion(eng)),
		Image:         rec.Image,
		ImageID:       rec.ImageID,
		Hostname:      rec.Hostname,
		Env:           rec.Env,
		Resources:     rec.Resources,
		Created:       time.Now().UTC(),
		SizeBytes:     size,
		Checksum:      sum,
		SourcePauseNS: int64(cp.SourcePause),
		Network:       rec.Network,
	}
	out := snapshotAPI(sn)
	manifest, _ := json.MarshalIndent(out, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), manifest, 0o600); err != nil {
		return nil, fmt.Errorf("writing manifest of snapshot %q: %w", req.Name, err)
	}
	final := d.snapshotDir(req.Name)
	if err := os.Rename(tmp, final); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("snapshot %q: %w", req.Name, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("storing snapshot %q: %w", req.Name, err)
	}
	if err := d.store.PutSnapshot(sn); err != nil {
		os.RemoveAll(final)
		return nil, err
	}
	d.metrics.ObserveOp("snapshot", rec.Engine, time.Since(start), nil)
	d.sbLog(rec.ID).Info("snapshot taken", "snapshot", req.Name, "bytes", size, "pause", cp.SourcePause)
	return out, nil
}

// ListSnapshots returns every snapshot, oldest first, and their total size.
func (d *Daemon) ListSnapshots(ctx context.Context) (*v1.SnapshotList, error) {
	l, err := d.store.ListSnapshots()
	if err != nil {
		return nil, err
	}
	out := &v1.SnapshotList{Snapshots: []v1.Snapshot{}}
	for i := range l {
		out.Snapshots = append(out.Snapshots, *snapshotAPI(&l[i]))
		out.TotalBytes += l[i].SizeBytes
	}
	return out, nil
}

// GetSnapshot returns one snapshot.
func (d *Daemon) GetSnapshot(ctx context.Context, name string) (*v1.Snapshot, error) {
	sn, err := d.store.GetSnapshot(name)
	if err != nil {
		return nil, err
	}
	return snapshotAPI(sn), nil
}

// DeleteSnapshot removes a snapshot's files and record.
func (d *Daemon) DeleteSnapshot(ctx context.Context, name string) error {
	if _, err := d.store.GetSnapshot(name); err != nil {
		return err
	}
	if err := os.RemoveAll(d.snapshotDir(name)); err != nil {
		return fmt.Errorf("removing snapshot %q: %w", name, err)
	}
	return d.store.DeleteSnapshot(name)
}

// verifySnapshot checks that the snapshot's files match its checksum.
func (d *Daemon) verifySnapshot(sn *store.Snapshot) error {
	sum, ok, err := verifyChecksum(filepath.Join(d.snapshotDir(sn.Name), "capture"), sn.Checksum)
	if err != nil {
		return fmt.Errorf("snapshot %q is unreadable: %v: %w", sn.Name, err, errdefs.ErrFailedPrecondition) //nolint:errorlint // classified by the sentinel alone: err's own class must not leak
	}
	if !ok {
		return fmt.Errorf("snapshot %q is corrupted: checksum %s, recorded %s: %w", sn.Name, sum, sn.Checksum, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// RestoreSnapshot verifies the snapshot and starts req.Count sandboxes from
// it (named req.Name for one, else PREFIX-i; default <snapshot>-restore-<n>).
func (d *Daemon) RestoreSnapshot(ctx context.Context, name string, req *v1.RestoreRequest) (*v1.ForkResult, error) {
	start := time.Now()
	count, err := childCount("restore", req.Count)
	if err != nil {
		return nil, err
	}
	sn, err := d.store.GetSnapshot(name)
	if err != nil {
		return nil, err
	}
	eng, f, err := d.forker(sn.Engine)
	if err != nil {
		return nil, err
	}
	if v := engineVersion(eng); v != "" && sn.EngineVersion != "" && v != sn.EngineVersion {
		return nil, fmt.Errorf("snapshot %q was taken with %s engine version %s; this daemon runs version %s: %w",
			name, sn.Engine, sn.EngineVersion, v, errdefs.ErrFailedPrecondition)
	}
	if err := d.verifySnapshot(sn); err != nil {
		return nil, err
	}
	names, err := d.childNames("", name+"-restore", count, req.Name)
	if err != nil {
		return nil, err
	}
	octx, cancel := d.opContext()
	defer cancel()
	children, err := d.spawnChildren(octx, childSpec{
		engine: eng, forker: f, from: filepath.Join(d.snapshotDir(name), "capture"), parent: name,
		image: sn.Image, imageID: sn.ImageID, env: sn.Env, resources: sn.Resources,
		net: sn.Network,
	}, names, start)
	d.metrics.ObserveOp("restore", sn.Engine, time.Since(start), err)
	if err != nil {
		return nil, fmt.Errorf("restoring snapshot %q: %w", name, err)
	}
	d.log.Info("snapshot restored", "snapshot", name, "children", len(children), "took", time.Since(start))
	return &v1.ForkResult{Source: name, Children: children}, nil
}

// PruneSnapshots removes snapshots: all of them, or those beyond the
// KeepLast newest and/or older than OlderThanNS.
func (d *Daemon) PruneSnapshots(ctx context.Context, req *v1.SnapshotPruneRequest) (*v1.SnapshotPruneResult, error) {
	if req.KeepLast < 0 || req.OlderThanNS < 0 {
		return nil, fmt.Errorf("prune: negative keep_last or older_than_ns: %w", errdefs.ErrInvalidArgument)
	}
	l, err := d.store.ListSnapshots()
	if err != nil {
		return nil, err
	}
	slices.Reverse(l) // newest first
	res := &v1.SnapshotPruneResult{Removed: []string{}}
	cutoff := time.Now().Add(-time.Duration(req.OlderThanNS))
	var errs []error
	for i, sn := range l {
		if req.KeepLast > 0 && i < req.KeepLast {
			continue
		}
		if req.OlderThanNS > 0 && sn.Created.After(cutoff) {
			continue
		}
		if err := d.DeleteSnapshot(ctx, sn.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Removed = append(res.Removed, sn.Name)
		res.FreedBytes += sn.SizeBytes
	}
	return res, errors.Join(errs...)
}

// Tree returns the fork tree: sandboxes (deleted ones as "deleted"
// tombstones) and snapshots, linked by parent. With root, only the tree
// under that sandbox (ID, name, prefix) or snapshot; without, every tree
// that holds a live sandbox or a snapshot.
func (d *Daemon) Tree(ctx context.Context, root string) (*v1.Tree, error) {
	live, err := d.store.ListSandboxes()
	if err != nil {
		return nil, err
	}
	dead, err := d.store.ListTombstones()
	if err != nil {
		return nil, err
	}
	snaps, err := d.store.ListSnapshots()
	if err != nil {
		return nil, err
	}
	type node struct {
		v1.TreeNode
		parent  string // key of the parent node
		created time.Time
		kids    []string
	}
	nodes := map[string]*node{}
	sbKey := func(id string) string { return "sb:" + id }
	snKey := func(name string) string { return "sn:" + name }
	var order []string
	for _, r := range append(live, dead...) {
		k := sbKey(r.ID)
		nodes[k] = &node{TreeNode: v1.TreeNode{Kind: "sandbox", ID: r.ID, Name: r.Name, State: r.State}, parent: r.Parent, created: r.Created}
		order = append(order, k)
	}
	for _, s := range snaps {
		k := snKey(s.Name)
		nodes[k] = &node{TreeNode: v1.TreeNode{Kind: "snapshot", ID: s.Name, Name: s.Name}, parent: sbKey(s.Sandbox), created: s.Created}
		order = append(order, k)
	}
	// A sandbox's parent is a sandbox ID or a snapshot name.
	for _, k := range order {
		n := nodes[k]
		if n.Kind == "sandbox" && n.parent != "" {
			if _, ok := nodes[sbKey(n.parent)]; ok {
				n.parent = sbKey(n.parent)
			} else {
				n.parent = snKey(n.parent)
			}
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return nodes[order[i]].created.Before(nodes[order[j]].created) })
	var roots []string
	for _, k := range order {
		n := nodes[k]
		if p, ok := nodes[n.parent]; ok && n.parent != k {
			p.kids = append(p.kids, k)
		} else {
			roots = append(roots, k)
		}
	}
	// keep reports whether k's subtree holds something not deleted.
	var keep func(k string) bool
	memo := map[string]bool{}
	keep = func(k string) bool {
		if v, ok := memo[k]; ok {
			return v
		}
		memo[k] = false // cycles (never expected) end here
		n := nodes[k]
		v := n.State != "deleted"
		for _, c := range n.kids {
			v = keep(c) || v
		}
		memo[k] = v
		return v
	}
	var build func(k string, all bool) v1.TreeNode
	build = func(k string, all bool) v1.TreeNode {
		n := nodes[k]
		out := n.TreeNode
		for _, c := range n.kids {
			if all || keep(c) {
				out.Children = append(out.Children, build(c, all))
			}
		}
		return out
	}
	t := &v1.Tree{Roots: []v1.TreeNode{}}
	if root != "" {
		k := ""
		if rec, err := d.store.FindSandbox(root); err == nil {
			k = sbKey(rec.ID)
		} else if _, ok := nodes[sbKey(root)]; ok {
			k = sbKey(root)
		} else if _, ok := nodes[snKey(root)]; ok {
			k = snKey(root)
		} else {
			for _, r := range dead {
				if r.Name == root {
					k = sbKey(r.ID)
				}
			}
		}
		if k == "" {
			return nil, fmt.Errorf("sandbox or snapshot %q not found: %w", root, errdefs.ErrNotFound)
		}
		t.Roots = append(t.Roots, build(k, true))
		return t, nil
	}
	for _, k := range roots {
		if keep(k) {
			t.Roots = append(t.Roots, build(k, false))
		}
	}
	return t, nil
}
