package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/errdefs"
)

// Pause, Resume and Checkpoint talk to the sandbox's control server
// themselves, over the urpc socket runsc made for the sandbox: the same
// calls "runsc pause", "runsc resume" and "runsc checkpoint" make
// (runsc/container, runsc/sandbox), without the ≈40 ms of starting a runsc
// process. gVisor's packages are not imported: runsc/container pulls in
// the whole sentry (runsc/boot), and even pkg/urpc brings pkg/safecopy,
// whose init replaces the process's SIGSEGV and SIGBUS handlers, and
// pkg/sync's links into the Go runtime. The urpc wire format is small: one
// JSON object per call on a unix stream socket, the files as SCM_RIGHTS on
// its first bytes, one JSON object back (pkg/urpc/urpc.go).
//
// Pause and Resume also record the new status in runsc's state file, under
// runsc's lock, as runsc does, so that runsc (state, resume, delete) and
// quickState see it. "runsc checkpoint" changes nothing in the state file.

// Control server methods (runsc/boot/controller.go).
const (
	ctlPause      = "containerManager.Pause"
	ctlResume     = "containerManager.Resume"
	ctlCheckpoint = "containerManager.Checkpoint"
)

// The files of an uncompressed checkpoint, in the order the checkpoint
// call takes them (pkg/sentry/state/checkpointfiles).
var checkpointFiles = []string{"checkpoint.img", "pages_meta.img", "pages.img"}

// saveOpts is the JSON form of gVisor's control.SaveOpts (pkg/sentry/
// control/state.go at the pinned version). Only the fields runsc sets for a
// local, uncompressed checkpoint are listed; the files go with the call.
type saveOpts struct {
	Metadata      map[string]string `json:"metadata"`
	HavePagesFile bool              `json:"have_pages_file"`
	Resume        bool
	ExecOpts      struct {
		Argv        string
		Timeout     time.Duration
		ContainerID string
	}
}

// lockedState is runsc's state file of one container, read and locked
// (runsc's flock on "<container>_sandbox:<sandbox>.lock").
type lockedState struct {
	path   string
	lock   *os.File
	raw    map[string]json.RawMessage
	status string
	socket string
}

// lockState locks and reads container cid's state file. The caller unlocks.
func (e *Engine) lockState(ctx context.Context, cid string) (*lockedState, error) {
	path := e.stateFilePath(cid)
	lock, err := os.OpenFile(filepath.Join(e.runscRoot, cid+"_sandbox:"+cid+".lock"), os.O_RDONLY, 0)
	if err != nil {
		if isNotExist(err) {
			return nil, fmt.Errorf("runsc has no container %q: %w", cid, errdefs.ErrNotFound)
		}
		return nil, err
	}
	// runsc holds the lock for whole operations (a create, a restore):
	// wait as runsc would, but give up with ctx.
	for {
		err = unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) {
			break
		}
		select {
		case <-ctx.Done():
			lock.Close()
			return nil, fmt.Errorf("waiting for runsc's lock on %q: %w", cid, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("locking runsc state of %q: %w", cid, err)
	}
	s := &lockedState{path: path, lock: lock}
	if err := s.read(); err != nil {
		s.unlock()
		return nil, err
	}
	return s, nil
}

func (s *lockedState) read() error {
	b, err := os.ReadFile(s.path)
	if err != nil {
		if isNotExist(err) {
			return fmt.Errorf("runsc state file %s is gone: %w", filepath.Base(s.path), errdefs.ErrNotFound)
		}
		return err
	}
	var sb struct {
		ControlSocketPath string `json:"controlSocketPath"`
	}
	if err := json.Unmarshal(b, &s.raw); err != nil {
		return fmt.Errorf("decoding runsc state file: %w", err)
	}
	if err := json.Unmarshal(s.raw["status"], &s.status); err != nil {
		return fmt.Errorf("decoding runsc state file: status: %w", err)
	}
	if err := json.Unmarshal(s.raw["sandbox"], &sb); err != nil || sb.ControlSocketPath == "" {
		return fmt.Errorf("runsc state file names no control socket")
	}
	s.socket = sb.ControlSocketPath
	return nil
}

// setStatus records status in the state file, as runsc's saveLocked does
// (but by rename, so that quickState never reads a half-written file).
func (s *lockedState) setStatus(status string) error {
	s.raw["status"] = json.RawMessage(strconv.Quote(status))
	b, err := json.Marshal(s.raw)
	if err != nil {
		return err
	}
	tmp := s.path + ".k7tmp"
	if err := os.WriteFile(tmp, b, 0o640); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.path); err != nil {
		os.Remove(tmp)
		return err
	}
	s.status = status
	return nil
}

func (s *lockedState) unlock() {
	_ = unix.Flock(int(s.lock.Fd()), unix.LOCK_UN)
	s.lock.Close()
}

// call makes one urpc call to the control server at socket, sending files
// with it. A cancelled ctx ends the call.
func call(ctx context.Context, socket, method string, arg any, files ...*os.File) error {
	if len(socket) >= len(unix.RawSockaddrUnix{}.Path) {
		// As runsc: a path too long for a sockaddr is reached via /proc.
		fd, err := unix.Open(socket, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening control socket: %w", err)
		}
		defer func() { _ = unix.Close(fd) }()
		socket = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("connecting to the sandbox's control server: %w", err)
	}
	conn := nc.(*net.UnixConn)
	defer func() { _ = conn.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	err = func() error {
		req, err := json.Marshal(struct {
			Method string `json:"method"`
			Arg    any    `json:"arg"`
		}{method, arg})
		if err != nil {
			return err
		}
		var oob []byte
		if len(files) > 0 {
			fds := make([]int, len(files))
			for i, f := range files {
				fds[i] = int(f.Fd())
			}
			oob = unix.UnixRights(fds...)
		}
		// The files go with the first bytes; a short first write sends
		// the rest plainly.
		n, _, err := conn.WriteMsgUnix(req, oob, nil)
		if err != nil {
			return err
		}
		if _, err := conn.Write(req[n:]); err != nil {
			return err
		}
		var res struct {
			Success bool   `json:"success"`
			Err     string `json:"err"`
		}
		if err := json.NewDecoder(conn).Decode(&res); err != nil {
			return fmt.Errorf("reading the answer: %w", err)
		}
		if !res.Success {
			return errors.New(res.Err)
		}
		return nil
	}()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

// setPaused pauses (or resumes) container cid, as "runsc pause" ("runsc
// resume") does.
func (e *Engine) setPaused(ctx context.Context, cid string, pause bool) error {
	s, err := e.lockState(ctx, cid)
	if err != nil {
		return err
	}
	defer s.unlock()
	method, want := ctlPause, "paused"
	if !pause {
		method, want = ctlResume, "running"
	}
	switch {
	case pause && s.status != "created" && s.status != "running",
		!pause && s.status != "paused":
		return fmt.Errorf("container %q is %s: %w", cid, s.status, errdefs.ErrFailedPrecondition)
	}
	if err := call(ctx, s.socket, method, nil); err != nil {
		return err
	}
	return s.setStatus(want)
}

// checkpoint saves container cid into dir and leaves it running, as
// "runsc checkpoint --leave-running --image-path dir" does (no
// compression, so the pages go to their own files).
func (e *Engine) checkpoint(ctx context.Context, cid, dir string) (err error) {
	s, err := e.lockState(ctx, cid)
	if err != nil {
		return err
	}
	// runsc checkpoint does not hold the lock during the call.
	socket, status := s.socket, s.status
	s.unlock()
	if status != "created" && status != "running" && status != "paused" {
		return fmt.Errorf("container %q is %s: %w", cid, status, errdefs.ErrFailedPrecondition)
	}
	opts := &saveOpts{
		// statefile.CompressionLevelNone.ToMetadata()
		Metadata:      map[string]string{"compression": "none"},
		HavePagesFile: true,
		Resume:        true,
	}
	opts.ExecOpts.Timeout = 10 * time.Minute // control.DefaultSaveRestoreExecTimeout
	opts.ExecOpts.ContainerID = cid
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, name := range checkpointFiles {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if err != nil {
			return errors.Join(fmt.Errorf("creating checkpoint file: %w", err), removeFiles(files))
		}
		files = append(files, f)
	}
	if err := call(ctx, socket, ctlCheckpoint, opts, files...); err != nil {
		return errors.Join(err, removeFiles(files))
	}
	return nil
}

func removeFiles(fs []*os.File) error {
	var errs []error
	for _, f := range fs {
		if err := os.Remove(f.Name()); err != nil && !isNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
