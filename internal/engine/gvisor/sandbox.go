package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

const (
	inFIFO     = "in.fifo"
	outFIFO    = "out.fifo"
	consoleLog = "console.log"
	// containerFile names the sandbox's runsc container when it is not
	// the sandbox ID (restored into a pre-created container).
	containerFile = "container"
	// netnsFile holds the network namespace path of a sandbox with a
	// network (CreateRequest.Netns); without it the sandbox has loopback only.
	netnsFile = "netns"
)

// Create starts a sandbox with the agent as PID 1. On error nothing of the
// sandbox is left behind (runsc container, cgroups, dir).
func (e *Engine) Create(ctx context.Context, req *engine.CreateRequest) (err error) {
	if err := e.checkCreate(req); err != nil {
		return err
	}
	log := e.log.With("sandbox", req.ID)
	start := time.Now()
	var cu cleanup
	defer func() {
		if err != nil {
			cu.clean(ctx)
			err = fmt.Errorf("creating sandbox %q: %w", req.ID, err)
		}
	}()
	dir := e.dir(req.ID)
	stdio, err := e.prepare(dir, req, &cu)
	if err != nil {
		return err
	}
	defer stdio.close()
	if err := step(log, "runsc run", func() error {
		cu.add(func(ctx context.Context) { e.destroy(ctx, log, req.ID, dir) })
		return e.runscStdio(ctx, dir, stdio, "run", "--detach", "--bundle", dir, req.ID)
	}); err != nil {
		return err
	}
	cu.release()
	log.Info("sandbox created", "took", time.Since(start))
	return nil
}

func (e *Engine) checkCreate(req *engine.CreateRequest) error {
	if err := checkID(req.ID); err != nil {
		return err
	}
	if req.Rootfs == "" {
		return fmt.Errorf("sandbox %q: no rootfs: %w", req.ID, errdefs.ErrInvalidArgument)
	}
	if fi, err := os.Stat(req.Rootfs); err != nil || !fi.IsDir() {
		return fmt.Errorf("sandbox %q: rootfs %q is not a directory: %w", req.ID, req.Rootfs, errdefs.ErrInvalidArgument)
	}
	return nil
}

// sandboxStdio are the engine's read-write copies of a sandbox's FIFOs and
// the console log, handed to the runsc command that starts the sandbox
// process and closed once it returns.
type sandboxStdio struct {
	in, out, console *os.File
}

func (s *sandboxStdio) close() {
	for _, f := range []*os.File{s.in, s.out, s.console} {
		if f != nil {
			f.Close()
		}
	}
}

// prepare makes the sandbox dir, bundle, FIFOs and console log, and opens
// the stdio for runsc. It pushes its undo onto cu.
func (e *Engine) prepare(dir string, req *engine.CreateRequest, cu *cleanup) (*sandboxStdio, error) {
	s := &sandboxStdio{}
	err := stepL(e, req.ID, "bundle", func() error {
		if err := os.Mkdir(dir, 0o700); err != nil {
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("sandbox dir exists: %w", errdefs.ErrAlreadyExists)
			}
			return err
		}
		cu.add(func(context.Context) { os.RemoveAll(dir) })
		if e.cfg.Debug {
			if err := os.Mkdir(filepath.Join(dir, "debug"), 0o700); err != nil {
				return err
			}
		}
		if err := writeSpec(dir, e.spec(req)); err != nil {
			return err
		}
		if req.Netns != "" {
			if err := os.WriteFile(filepath.Join(dir, netnsFile), []byte(req.Netns+"\n"), 0o600); err != nil {
				return err
			}
		}
		for _, f := range []string{inFIFO, outFIFO} {
			if err := unix.Mkfifo(filepath.Join(dir, f), 0o600); err != nil {
				return fmt.Errorf("mkfifo %s: %w", f, err)
			}
		}
		var err error
		if s.console, err = os.OpenFile(filepath.Join(dir, consoleLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			return err
		}
		// O_RDWR never blocks on a FIFO and keeps a reader and a writer.
		if s.in, err = os.OpenFile(filepath.Join(dir, inFIFO), os.O_RDWR, 0); err != nil {
			return err
		}
		if s.out, err = os.OpenFile(filepath.Join(dir, outFIFO), os.O_RDWR, 0); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func stepL(e *Engine, id, name string, fn func() error) error {
	return step(e.log.With("sandbox", id), name, fn)
}

// runscStdio runs a runsc command whose stdio becomes the sandbox's. Its
// error output lands in the console log, so the error quotes what it added.
func (e *Engine) runscStdio(ctx context.Context, dir string, s *sandboxStdio, args ...string) error {
	off, _ := s.console.Seek(0, io.SeekEnd)
	cmd := exec.CommandContext(ctx, e.cfg.Runsc, append(e.globalFlags(dir), args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.in, s.out, s.console
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := readFrom(filepath.Join(dir, consoleLog), off)
		return runscError(args[0], err, msg)
	}
	return nil
}

func readFrom(path string, off int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, 64<<10))
	return b
}

// destroy removes the runsc container cid, its cgroups and dir, logging
// what fails.
func (e *Engine) destroy(ctx context.Context, log interface{ Warn(string, ...any) }, cid, dir string) {
	if err := e.remove(ctx, cid, dir); err != nil {
		log.Warn("removing sandbox", "container", cid, "err", err)
	}
}

// remove deletes the runsc container cid (killing it first if runsc
// refuses), its leftover cgroups, and dir.
func (e *Engine) remove(ctx context.Context, cid, dir string) error {
	if _, err := os.Stat(e.stateFilePath(cid)); err == nil {
		if _, err := e.runsc(ctx, "", "delete", "-force", cid); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			// A container that runsc cannot delete yet ("not stopped"):
			// kill it and retry.
			_, _ = e.runsc(ctx, "", "kill", cid, "KILL")
			if _, err2 := e.runsc(ctx, "", "delete", "-force", cid); err2 != nil && !errors.Is(err2, errdefs.ErrNotFound) {
				return err2
			}
		}
	} else if !isNotExist(err) {
		return err
	}
	e.killCgroup(ctx, cid)
	e.removeCgroups(cid)
	return os.RemoveAll(dir)
}

// killCgroup kills every process still in the sandbox's cgroup and waits
// for them to go. runsc delete leaves none; a "runsc create" killed half
// way (its state file not yet written), or a sandbox whose processes were
// killed one by one, can leave a gofer or sandbox process that no runsc
// command knows about. The cgroup is unique to this engine root and ID, so
// whatever is in it is this sandbox's.
func (e *Engine) killCgroup(ctx context.Context, id string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids := e.cgroupPIDs(id)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			e.log.Warn("processes left in the sandbox's cgroup", "sandbox", id, "pids", pids)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cgroupPIDs lists the processes in container cid's cgroup (the pids
// hierarchy of cgroup v1, else the unified one).
func (e *Engine) cgroupPIDs(cid string) []int {
	var b []byte
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup", "pids", e.cgroupsPath(cid), "cgroup.procs"),
		filepath.Join("/sys/fs/cgroup", e.cgroupsPath(cid), "cgroup.procs"),
	} {
		var err error
		if b, err = os.ReadFile(p); err == nil {
			break
		}
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupControllers are the v1 hierarchies runsc puts a sandbox in.
var cgroupControllers = []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd", "net_cls", "net_prio", "hugetlb", "perf_event", "rdma", "misc"}

// removeCgroups removes the sandbox's cgroup dirs that runsc left behind
// (normally none).
func (e *Engine) removeCgroups(id string) {
	for _, c := range cgroupControllers {
		p := filepath.Join("/sys/fs/cgroup", c, e.cgroupsPath(id))
		if err := syscall.Rmdir(p); err == nil {
			e.log.Debug("removed leftover cgroup", "sandbox", id, "path", p)
		}
	}
	// cgroup v2 (unified) host.
	_ = syscall.Rmdir(filepath.Join("/sys/fs/cgroup", e.cgroupsPath(id)))
}

// runscState is the part of "runsc state" the engine reads.
type runscState struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	PID    int    `json:"pid"`
}

// state reads runsc's view of id; errdefs.ErrNotFound when runsc has no
// such container (IDs are matched exactly, never by prefix).
func (e *Engine) state(ctx context.Context, id string) (*runscState, error) {
	out, err := e.runsc(ctx, "", "state", id)
	if err != nil {
		return nil, err
	}
	var st runscState
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("decoding runsc state: %w", err)
	}
	if st.ID != id {
		return nil, fmt.Errorf("runsc state %q answered %q: %w", id, st.ID, errdefs.ErrNotFound)
	}
	return &st, nil
}

// cid returns the runsc container ID of sandbox id: id itself, or the ID
// of the pre-created container it was restored into (containerFile).
func (e *Engine) cid(id string) string {
	b, err := os.ReadFile(filepath.Join(e.dir(id), containerFile))
	if err != nil {
		return id
	}
	return strings.TrimSpace(string(b))
}

func (e *Engine) exists(id string) bool {
	_, err := os.Stat(e.dir(id))
	return err == nil
}

// Connect opens the agent's FIFOs. The stream stays usable across daemon
// restarts of the caller; the reader gets EOF when the sandbox dies.
func (e *Engine) Connect(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if !e.exists(id) {
		return nil, fmt.Errorf("connecting to sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	dir := e.dir(id)
	r, err := openFIFO(filepath.Join(dir, outFIFO), unix.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("connecting to sandbox %q: %w", id, err)
	}
	w, err := openFIFO(filepath.Join(dir, inFIFO), unix.O_WRONLY)
	if err != nil {
		r.Close()
		if errors.Is(err, unix.ENXIO) {
			// No reader of in.fifo: the sandbox process is gone.
			err = fmt.Errorf("sandbox process is gone: %w", errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("connecting to sandbox %q: %w", id, err)
	}
	return &fifoConn{r: r, w: w}, nil
}

// openFIFO opens a FIFO non-blocking, so that the file uses Go's poller
// (reads and writes still wait, without holding a thread).
func openFIFO(path string, mode int) (*os.File, error) {
	fd, err := unix.Open(path, mode|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

type fifoConn struct {
	r, w *os.File
}

func (c *fifoConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *fifoConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c *fifoConn) Close() error {
	err1 := c.r.Close()
	err2 := c.w.Close()
	return errors.Join(err1, err2)
}

// Pause freezes the sandbox (see control.go).
func (e *Engine) Pause(ctx context.Context, id string) error {
	return e.simple(ctx, "pausing", "pause", id)
}

// Resume continues a paused sandbox.
func (e *Engine) Resume(ctx context.Context, id string) error {
	return e.simple(ctx, "resuming", "resume", id)
}

func (e *Engine) simple(ctx context.Context, verb, op, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if !e.exists(id) {
		return fmt.Errorf("%s sandbox %q: %w", verb, id, errdefs.ErrNotFound)
	}
	start := time.Now()
	if err := e.setPaused(ctx, e.cid(id), op == "pause"); err != nil {
		return fmt.Errorf("%s sandbox %q: %w", verb, id, err)
	}
	e.log.Debug(op, "sandbox", id, "took", time.Since(start))
	return nil
}

// Status reports runsc's state, corrected to StateDead when the sandbox
// process is gone while runsc still reports it running or paused. It reads
// runsc's state file and runs "runsc state" only when the file cannot
// answer alone (see quickState).
func (e *Engine) Status(ctx context.Context, id string) (engine.Status, error) {
	if err := checkID(id); err != nil {
		return engine.Status{}, err
	}
	cid := e.cid(id)
	st, ok, err := e.quickState(cid)
	if !ok {
		st, err = e.state(ctx, cid)
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			if e.exists(id) {
				return engine.Status{State: engine.StateDead, Reason: "runsc has no container for the sandbox"}, nil
			}
			return engine.Status{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
		}
		return engine.Status{}, fmt.Errorf("reading status of sandbox %q: %w", id, err)
	}
	s := engine.Status{PID: st.PID}
	switch st.Status {
	case "creating", "created":
		s.State = engine.StateCreating
	case "running":
		s.State = engine.StateRunning
	case "paused":
		s.State = engine.StatePaused
	case "stopped":
		s.State = engine.StateStopped
		s.Reason = "init exited"
		s.PID = 0
	default:
		s.State = engine.StateUnknown
		s.Reason = "runsc status " + strconv.Quote(st.Status)
	}
	if s.State == engine.StateRunning || s.State == engine.StatePaused || s.State == engine.StateCreating {
		if !pidAlive(st.PID) {
			s.State = engine.StateDead
			s.Reason = fmt.Sprintf("sandbox process %d is gone (killed)", st.PID)
			s.PID = 0
		}
	}
	return s, nil
}

// pidAlive reports whether pid is a live (non-zombie) process.
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}

// Stats reads "runsc events --stats".
func (e *Engine) Stats(ctx context.Context, id string) (engine.Stats, error) {
	if err := checkID(id); err != nil {
		return engine.Stats{}, err
	}
	if !e.exists(id) {
		return engine.Stats{}, fmt.Errorf("reading stats of sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	out, err := e.runsc(ctx, "", "events", "--stats", e.cid(id))
	if err != nil {
		return engine.Stats{}, fmt.Errorf("reading stats of sandbox %q: %w", id, err)
	}
	var ev struct {
		Data struct {
			CPU struct {
				Usage struct {
					Total uint64 `json:"total"`
				} `json:"usage"`
			} `json:"cpu"`
			Memory struct {
				Usage struct {
					Usage uint64 `json:"usage"`
				} `json:"usage"`
			} `json:"memory"`
			Pids struct {
				Current uint64 `json:"current"`
			} `json:"pids"`
		} `json:"data"`
	}
	if err := json.Unmarshal(out, &ev); err != nil {
		return engine.Stats{}, fmt.Errorf("decoding stats of sandbox %q: %w", id, err)
	}
	return engine.Stats{
		CPU:         time.Duration(ev.Data.CPU.Usage.Total),
		MemoryBytes: int64(ev.Data.Memory.Usage.Usage),
		PIDs:        int64(ev.Data.Pids.Current),
	}, nil
}

// Logs opens the console log from the start.
func (e *Engine) Logs(ctx context.Context, id string) (io.ReadCloser, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(e.dir(id), consoleLog))
	if err != nil {
		if isNotExist(err) {
			err = errdefs.ErrNotFound
		}
		return nil, fmt.Errorf("opening log of sandbox %q: %w", id, err)
	}
	return f, nil
}

// Delete kills the sandbox and removes its runsc container, cgroups and
// dir. Unknown IDs are not an error; Delete may be repeated.
func (e *Engine) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	start := time.Now()
	log := e.log.With("sandbox", id)
	e.takePrecreated(id)
	if err := e.remove(ctx, e.cid(id), e.dir(id)); err != nil {
		return fmt.Errorf("deleting sandbox %q: %w", id, err)
	}
	log.Info("sandbox deleted", "took", time.Since(start))
	return nil
}

// List returns the sandbox dirs and runsc's containers under the engine's
// root, sorted.
func (e *Engine) List(ctx context.Context) ([]string, error) {
	set := map[string]bool{}
	ents, err := os.ReadDir(e.sbxRoot)
	if err != nil && !isNotExist(err) {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, d := range ents {
		if d.IsDir() {
			set[d.Name()] = true
		}
	}
	out, err := e.runsc(ctx, "", "list", "-quiet")
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		// Pool containers are not sandboxes (or are, under their
		// sandbox's ID, listed by its dir).
		if l = strings.TrimSpace(l); l != "" && !isPoolID(l) {
			set[l] = true
		}
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}
