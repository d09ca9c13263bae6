package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// bootTimeout bounds a boot, from QEMU start to the agent's port opening.
const bootTimeout = 90 * time.Second

// pending holds agent connections made before a guest ran (so that the
// guest never sees its port without a host end); the next Connect takes it.
var pending sync.Map // sandbox dir -> net.Conn

// Create boots a sandbox and returns when its agent has opened its port.
// With req.Netns, the guest takes over eth0 of that namespace (see
// attachTap); a namespace without eth0 gives loopback only. On error
// nothing of the sandbox is left.
func (e *Engine) Create(ctx context.Context, req *engine.CreateRequest) (err error) {
	if err := checkID(req.ID); err != nil {
		return err
	}
	defer e.lock(req.ID)()
	log := e.log.With("sandbox", req.ID)
	st := e.newState(req.ID, req)
	if req.Netns != "" {
		if st.Net, err = readNetns(req.Netns); err != nil {
			return fmt.Errorf("creating sandbox %q: %w", req.ID, err)
		}
	}
	if req.Rootfs != "" {
		t := time.Now()
		if st.Disk, err = e.rootDisk(ctx, req.Rootfs); err != nil {
			return fmt.Errorf("creating sandbox %q: %w", req.ID, err)
		}
		log.Debug("create step", "step", "root disk", "took", time.Since(t))
	}
	st.MemFile = filepath.Join(e.cfg.ShmDir, fmt.Sprintf("k7-qemu-%s-%s.mem", e.rootHash, req.ID))
	if err := e.start(ctx, st, log); err != nil {
		return fmt.Errorf("creating sandbox %q: %w", req.ID, err)
	}
	return nil
}

// start makes the sandbox dir, launches QEMU for st and brings the guest
// to running: a boot, or (st.Incoming set) a restore. On error it removes
// everything it made.
func (e *Engine) start(ctx context.Context, st *vmState, log interface {
	Debug(string, ...any)
}) (err error) {
	dir := e.dir(st.ID)
	var pooled *poolEntry
	if st.Incoming != "" && st.SockDir == dir {
		pooled = e.poolTake(st)
	}
	if pooled != nil {
		if _, err := os.Lstat(dir); err == nil {
			e.poolDiscard(pooled)
			return fmt.Errorf("sandbox %q: %w", st.ID, errdefs.ErrAlreadyExists)
		}
		if err := os.Rename(pooled.st.poolDir, dir); err != nil {
			e.poolDiscard(pooled)
			return err
		}
	} else if err := os.Mkdir(dir, 0o755); err != nil {
		if os.IsExist(err) {
			return fmt.Errorf("sandbox %q: %w", st.ID, errdefs.ErrAlreadyExists)
		}
		return err
	}
	var cu cleanup
	defer func() {
		if err != nil {
			cu.run()
		}
	}()
	cu.add(func() {
		_ = os.RemoveAll(dir)
		if st.MemFile != "" {
			_ = os.Remove(st.MemFile)
		}
		if st.SockDir != dir {
			_ = os.RemoveAll(st.SockDir)
		}
	})
	if st.SockDir != dir {
		_ = os.RemoveAll(st.SockDir)
		if err := os.MkdirAll(st.SockDir, 0o700); err != nil {
			return err
		}
	}
	step := func(name string, t time.Time) { log.Debug("start step", "step", name, "took", time.Since(t)) }
	t := time.Now()
	var exited <-chan struct{}
	if pooled != nil {
		st.PID, st.StartTime, exited = pooled.st.PID, pooled.st.StartTime, pooled.exited
	} else if exited, err = e.launch(st); err != nil {
		return err
	}
	cu.add(func() { e.kill(context.WithoutCancel(ctx), st) })
	step("launch", t)
	t = time.Now()
	q, err := e.dialMonitor(ctx, st, exited)
	if err != nil {
		return err
	}
	kept := false
	defer func() {
		if !kept {
			_ = q.Close()
		}
	}()
	if pooled != nil {
		if err := e.claim(ctx, q, st); err != nil {
			return fmt.Errorf("claiming a fork-pool QEMU: %w", err)
		}
		step("claim pooled QEMU", t)
	} else {
		step("monitor", t)
	}
	if st.Net != nil {
		t = time.Now()
		if err := attachTap(st.PID, st.Netns, st.Net); err != nil {
			return fmt.Errorf("attaching the guest's NIC to %s: %w", st.Netns, err)
		}
		step("attach tap", t)
	}
	if st.Incoming != "" {
		t = time.Now()
		if err := e.loadState(ctx, q, st); err != nil {
			return err
		}
		step("load state", t)
	}
	t = time.Now()
	conn, err := dialAgent(ctx, st)
	if err != nil {
		return err
	}
	cu.add(func() { _ = conn.Close() })
	if _, err := q.Execute(ctx, "cont", nil); err != nil {
		return err
	}
	if st.Incoming == "" {
		bctx, cancel := context.WithTimeout(ctx, bootTimeout)
		defer cancel()
		_, err := q.WaitEvent(bctx, func(ev qmpEvent) bool {
			var d struct {
				ID   string `json:"id"`
				Open bool   `json:"open"`
			}
			if json.Unmarshal(ev.Data, &d) != nil {
				return false
			}
			return ev.Event == "VSERPORT_CHANGE" && d.ID == "agentport" && d.Open
		})
		if err != nil {
			return fmt.Errorf("waiting for the agent: %w; console: %s", err, e.tail(st.ID, "console.log"))
		}
		step("boot", t)
	}
	if err := e.writeState(st); err != nil {
		return err
	}
	pending.Store(dir, conn)
	kept = e.mons.keep(st, q)
	return nil
}

// loadState loads a capture's device state into a QEMU started with
// -incoming defer.
func (e *Engine) loadState(ctx context.Context, q *qmp, st *vmState) error {
	if err := setMigration(ctx, q, st.Frozen != ""); err != nil {
		return err
	}
	if _, err := q.Execute(ctx, "migrate-incoming", map[string]any{"uri": "exec:cat " + shellQuote(st.Incoming)}); err != nil {
		return err
	}
	return waitMigration(ctx, q)
}

// setMigration sets the capabilities and parameters of both ends of a
// capture: x-ignore-shared (RAM in a shared file is not streamed) and no
// bandwidth limit.
func setMigration(ctx context.Context, q *qmp, ignoreShared bool) error {
	if _, err := q.Execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": ignoreShared}},
	}); err != nil {
		return err
	}
	_, err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40})
	return err
}

// waitMigration polls query-migrate until it completes or fails.
func waitMigration(ctx context.Context, q *qmp) error {
	for i := 0; ; i++ {
		raw, err := q.Execute(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var m struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("decoding query-migrate: %w", err)
		}
		switch m.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", m.Status, m.ErrorDesc)
		}
		d := 200 * time.Microsecond
		if i > 50 {
			d = 2 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Connect returns a stream to the sandbox's agent (QEMU's unix socket for
// its virtio-serial port). QEMU serves one stream at a time; a second
// Connect waits until the first is closed.
func (e *Engine) Connect(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	if c, ok := pending.LoadAndDelete(e.dir(id)); ok {
		return c.(net.Conn), nil
	}
	st, err := e.state(id)
	if err != nil {
		return nil, err
	}
	if !alive(st) {
		return nil, fmt.Errorf("connecting to sandbox %q: QEMU is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	return dialAgent(ctx, st)
}

// state reads id's record; errdefs.ErrNotFound if there is none.
func (e *Engine) state(id string) (*vmState, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	st, err := e.readState(id)
	if errors.Is(err, errNoSandbox) {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return st, err
}

// Pause stops the guest's vCPUs (QMP stop).
func (e *Engine) Pause(ctx context.Context, id string) error {
	return e.monitor(ctx, id, func(q *qmp, _ *vmState) error {
		_, err := q.Execute(ctx, "stop", nil)
		return err
	})
}

// Resume continues a paused guest (QMP cont).
func (e *Engine) Resume(ctx context.Context, id string) error {
	return e.monitor(ctx, id, func(q *qmp, _ *vmState) error {
		_, err := q.Execute(ctx, "cont", nil)
		return err
	})
}

// Status reports the guest's run state (QMP query-status) and QEMU's PID.
func (e *Engine) Status(ctx context.Context, id string) (engine.Status, error) {
	st, err := e.state(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		if _, serr := os.Stat(e.dir(id)); serr == nil {
			// A create that did not finish (the daemon died during it).
			return engine.Status{State: engine.StateDead, Reason: "create did not finish"}, nil
		}
	}
	if err != nil {
		return engine.Status{}, err
	}
	if !alive(st) {
		return engine.Status{State: engine.StateDead, Reason: e.deathReason(id)}, nil
	}
	s := engine.Status{State: engine.StateUnknown, PID: st.PID}
	err = e.monitor(ctx, id, func(q *qmp, _ *vmState) error {
		raw, err := q.Execute(ctx, "query-status", nil)
		if err != nil {
			return err
		}
		var r struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("decoding query-status: %w", err)
		}
		switch r.Status {
		case "running":
			s.State = engine.StateRunning
		case "paused", "suspended", "finish-migrate", "postmigrate", "save-vm", "restore-vm", "inmigrate", "prelaunch", "debug":
			s.State = engine.StatePaused
		case "shutdown", "guest-panicked", "internal-error", "io-error":
			s.State, s.Reason = engine.StateDead, r.Status
		}
		return nil
	})
	if err != nil {
		if !alive(st) {
			return engine.Status{State: engine.StateDead, Reason: e.deathReason(id)}, nil
		}
		return s, err
	}
	return s, nil
}

// deathReason describes why a sandbox's QEMU is gone, from the last line
// of QEMU's own log or else of the console (a kernel panic ends there).
func (e *Engine) deathReason(id string) string {
	if l := lastLine(e.tail(id, "qemu.log")); l != "" {
		return "QEMU exited: " + l
	}
	con := e.tailN(id, "console.log", 8192)
	if i := strings.LastIndex(con, "Kernel panic - "); i >= 0 {
		return "QEMU exited: " + strings.SplitN(con[i:], "\n", 2)[0]
	}
	if l := lastLine(con); l != "" {
		return "QEMU exited: " + l
	}
	return "QEMU exited"
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// Stats reads QEMU's CPU time and memory. MemoryBytes is the process's
// proportional set size (PSS): pages shared with forks of the same capture
// are divided between them. PIDs is 1 (the VM).
func (e *Engine) Stats(ctx context.Context, id string) (engine.Stats, error) {
	st, err := e.state(id)
	if err != nil {
		return engine.Stats{}, err
	}
	if !alive(st) {
		return engine.Stats{}, fmt.Errorf("sandbox %q: QEMU is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	pss, _, err := smapsRollup(st.PID)
	if err != nil {
		return engine.Stats{}, err
	}
	// The guest's tasks are not visible from the host: the VM counts as
	// one process.
	return engine.Stats{CPU: procCPU(st.PID), MemoryBytes: pss, PIDs: 1}, nil
}

// smapsRollup returns a process's PSS and RSS in bytes.
func smapsRollup(pid int) (pss, rss int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "Pss":
			pss = n << 10
		case "Rss":
			rss = n << 10
		}
	}
	return pss, rss, sc.Err()
}

// procCPU returns a process's user+system CPU time.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// Logs opens the guest's serial console log.
func (e *Engine) Logs(ctx context.Context, id string) (io.ReadCloser, error) {
	if _, err := e.state(id); err != nil {
		return nil, err
	}
	return os.Open(filepath.Join(e.dir(id), "console.log"))
}

// Delete stops QEMU and removes the sandbox's dir, sockets and RAM file.
// It may be repeated; an unknown ID is not an error.
func (e *Engine) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	defer e.lock(id)()
	defer e.mons.drop(id)
	dir := e.dir(id)
	if c, ok := pending.LoadAndDelete(dir); ok {
		_ = c.(net.Conn).Close()
	}
	st, err := e.readState(id)
	if err != nil && !errors.Is(err, errNoSandbox) {
		e.log.Warn("reading sandbox state; removing its dir", "sandbox", id, "err", err)
	}
	if st != nil {
		e.kill(ctx, st)
		if st.MemFile != "" {
			_ = os.Remove(st.MemFile)
		}
		if st.SockDir != "" && st.SockDir != dir {
			_ = os.RemoveAll(st.SockDir)
		}
	} else if pid, err := readPID(dir); err == nil {
		// A create that died before writing its state.
		e.kill(ctx, &vmState{ID: id, PID: pid, StartTime: procStartTime(pid), SockDir: e.sockDir(id)})
	}
	_ = os.Remove(filepath.Join(e.cfg.ShmDir, fmt.Sprintf("k7-qemu-%s-%s.mem", e.rootHash, id)))
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("deleting sandbox %q: %w", id, err)
	}
	return nil
}

func readPID(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "qemu.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// List returns the IDs of every sandbox dir under Root, running or not.
func (e *Engine) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(e.cfg.Root, "sandboxes"))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, de := range ents {
		if de.IsDir() {
			ids = append(ids, de.Name())
		}
	}
	return ids, nil
}
