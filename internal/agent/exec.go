package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/agent/proto"
)

// outputGrace is how long the agent keeps waiting for a command's output
// after the command exited while nothing more arrives. A background process
// that inherited the command's stdout may hold it open forever; the exit
// is reported once the streams have been idle this long.
const outputGrace = 250 * time.Millisecond

// session is one started command.
type session struct {
	s      *Server
	ch     uint32
	pid    int
	tty    *os.File // pty master, nil without TTY
	detach bool

	mu       sync.Mutex
	epoch    uint64 // the epoch whose client receives the output; 0: nobody
	stdin    *os.File
	stdinQ   *proto.Queue[[]byte] // nil EOF marker
	exited   bool
	reported bool // the exit was sent; later output is discarded
	timedOut atomic.Bool
	timer    *time.Timer

	out     *proto.Credit // output credit granted by the client
	outputs sync.WaitGroup
	streams []*stream
	done    chan struct{} // closed when the exit is handled
}

// stream is one output pipe's reader state, for the exit cutoff.
type stream struct {
	typ      proto.Type
	file     *os.File
	mu       sync.Mutex
	inRead   bool
	since    time.Time
	finished bool
}

func (st *stream) idleFor(now time.Time) (time.Duration, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.finished {
		return 0, true
	}
	if !st.inRead {
		return 0, false
	}
	return now.Sub(st.since), false
}

func (s *Server) exec(epoch uint64, ch uint32, e *proto.Exec) {
	se, err := s.start(epoch, ch, e)
	if err != nil {
		s.log.Info("exec failed", "args", e.Args, "err", err)
		s.result(epoch, ch, err)
		return
	}
	s.send(epoch, proto.JSON(proto.TStarted, ch, proto.Started{PID: se.pid}))
	se.run()
}

// start resolves and starts a command. Its errors are *startError.
func (s *Server) start(epoch uint64, ch uint32, e *proto.Exec) (*session, error) {
	if len(e.Args) == 0 || e.Args[0] == "" {
		return nil, startErrorf(126, "exec: no command")
	}
	cwd := e.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if !filepath.IsAbs(cwd) {
		return nil, startErrorf(126, "chdir %s: working directory is not absolute", cwd)
	}
	dir := filepath.Join(s.root(), filepath.Clean(cwd))
	if fi, err := os.Stat(dir); err != nil {
		return nil, startErrorf(126, "chdir %s: %v", cwd, unwrapPathErr(err))
	} else if !fi.IsDir() {
		return nil, startErrorf(126, "chdir %s: not a directory", cwd)
	}
	var cred *syscall.Credential
	var u *user
	if e.User != "" {
		var err error
		if u, err = lookupUser(e.User); err != nil {
			return nil, startErrorf(126, "user %q: %v", e.User, err)
		}
		cred = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	}
	env := s.environ(e, u)
	path, serr := lookPath(e.Args[0], getenv(env, "PATH"), dir)
	if serr != nil {
		return nil, serr
	}

	se := &session{
		s:      s,
		ch:     ch,
		epoch:  epoch,
		detach: e.Detach,
		out:    proto.NewCredit(proto.Window),
		stdinQ: proto.NewQueue[[]byte](),
		done:   make(chan struct{}),
	}
	if e.Detach {
		se.epoch = 0
	}
	var files [3]*os.File
	var parentEnds []*os.File // ours, kept
	var childEnds []*os.File  // closed after start
	closeAll := func() {
		for _, f := range append(parentEnds, childEnds...) {
			f.Close()
		}
	}
	sys := &syscall.SysProcAttr{Credential: cred}
	if e.TTY && !e.Detach {
		master, slave, err := pty.Open()
		if err != nil {
			return nil, startErrorf(126, "opening pty: %v", err)
		}
		rows, cols := e.Rows, e.Cols
		if rows == 0 || cols == 0 {
			rows, cols = 24, 80
		}
		if err := pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
			s.log.Warn("setting pty size", "err", err)
		}
		if cred != nil {
			// The terminal belongs to the command's user, as login does.
			_ = slave.Chown(int(cred.Uid), -1)
		}
		files = [3]*os.File{slave, slave, slave}
		parentEnds = append(parentEnds, master)
		childEnds = append(childEnds, slave)
		se.tty = master
		se.stdin = master
		se.streams = []*stream{{typ: proto.TStdout}}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		if e.Stdin && !e.Detach {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, startErrorf(126, "creating pipe: %v", err)
			}
			files[0], se.stdin = r, w
			parentEnds = append(parentEnds, w)
			childEnds = append(childEnds, r)
		} else {
			null, err := os.Open(os.DevNull)
			if err != nil {
				return nil, startErrorf(126, "opening %s: %v", os.DevNull, err)
			}
			files[0] = null
			childEnds = append(childEnds, null)
		}
		for i, typ := range []proto.Type{proto.TStdout, proto.TStderr} {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll()
				return nil, startErrorf(126, "creating pipe: %v", err)
			}
			files[1+i] = w
			parentEnds = append(parentEnds, r)
			childEnds = append(childEnds, w)
			se.streams = append(se.streams, &stream{typ: typ})
		}
		sys.Setpgid = true
	}

	se.outputs.Add(len(se.streams)) // before the reaper can see an exit
	var proc *os.Process
	pid, err := s.reaper.start(func() (int, error) {
		p, err := os.StartProcess(path, e.Args, &os.ProcAttr{
			Dir:   dir,
			Env:   env,
			Files: files[:],
			Sys:   sys,
		})
		if err != nil {
			return 0, err
		}
		proc = p
		se.pid = p.Pid
		s.mu.Lock()
		s.procs[p.Pid] = se
		s.mu.Unlock()
		return p.Pid, nil
	}, se.exit)
	for _, f := range childEnds {
		f.Close()
	}
	if err != nil {
		for _, f := range parentEnds {
			f.Close()
		}
		return nil, startErrorFor(e.Args[0], err)
	}
	proc.Release() // the reaper collects the status by pid

	// The output readers are the pipes' other ends.
	if se.tty == nil {
		se.streams[0].file, se.streams[1].file = parentEnds[len(parentEnds)-2], parentEnds[len(parentEnds)-1]
	} else {
		se.streams[0].file = se.tty
	}
	if !e.Detach {
		s.mu.Lock()
		s.sessions[ch] = se
		s.mu.Unlock()
	}
	if e.TimeoutNS > 0 {
		se.mu.Lock()
		if !se.exited {
			se.timer = time.AfterFunc(time.Duration(e.TimeoutNS), se.timeout)
		}
		se.mu.Unlock()
	}
	s.log.Debug("started", "pid", pid, "args", e.Args, "detach", e.Detach, "tty", e.TTY)
	return se, nil
}

// run starts the session's stream goroutines. Call it after Started is sent.
func (se *session) run() {
	for _, st := range se.streams {
		if se.detach {
			go se.console(st)
		} else {
			go se.pump(st)
		}
	}
	if se.stdin != nil {
		go se.feed()
	}
}

// pump copies one output stream to the client under flow control.
func (se *session) pump(st *stream) {
	defer se.outputs.Done()
	defer st.file.Close()
	buf := make([]byte, proto.ChunkSize)
	for {
		st.mu.Lock()
		st.inRead, st.since = true, time.Now()
		st.mu.Unlock()
		n, err := st.file.Read(buf)
		st.mu.Lock()
		st.inRead = false
		st.mu.Unlock()
		p := buf[:n]
		for len(p) > 0 {
			epoch, cut := se.target()
			if epoch == 0 || cut {
				break // nobody listens: discard
			}
			k, ok := se.out.Take(nil, len(p))
			if !ok {
				break
			}
			se.s.send(epoch, proto.Frame{Type: st.typ, Channel: se.ch, Payload: append([]byte(nil), p[:k]...)})
			p = p[k:]
		}
		if err != nil {
			// EOF, or EIO from a pty master whose slave is closed.
			st.mu.Lock()
			st.finished = true
			st.mu.Unlock()
			return
		}
	}
}

// console copies a detached command's output to the console, prefixing
// each line with "[pid N] ".
func (se *session) console(st *stream) {
	defer se.outputs.Done()
	defer st.file.Close()
	prefix := fmt.Sprintf("[pid %d] ", se.pid)
	br := bufio.NewReaderSize(st.file, 4096)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			b := make([]byte, 0, len(prefix)+len(line)+1)
			b = append(append(b, prefix...), line...)
			if b[len(b)-1] != '\n' {
				b = append(b, '\n')
			}
			_, _ = se.s.console.Write(b)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			st.mu.Lock()
			st.finished = true
			st.mu.Unlock()
			return
		}
	}
}

// target returns the epoch receiving output (0: none) and whether the exit
// was already reported (output after it is discarded).
func (se *session) target() (uint64, bool) {
	se.mu.Lock()
	defer se.mu.Unlock()
	return se.epoch, se.reported
}

// feed writes the client's stdin to the command.
func (se *session) feed() {
	if se.tty == nil {
		defer se.stdin.Close() // the pump closes a pty master
	}
	for {
		b, ok := se.stdinQ.Pop(nil)
		if !ok {
			return
		}
		if b == nil { // EOF
			if se.tty != nil {
				_, _ = se.stdin.Write([]byte{4}) // ^D: the terminal's end of file
			} else {
				se.stdin.Close()
			}
			continue
		}
		if _, err := se.stdin.Write(b); err != nil {
			se.s.log.Debug("writing stdin", "pid", se.pid, "err", err)
		}
		se.mu.Lock()
		epoch := se.epoch
		se.mu.Unlock()
		if epoch != 0 {
			se.s.send(epoch, proto.WindowFrame(se.ch, len(b)))
		}
	}
}

// control handles a client frame for the session.
func (se *session) control(f proto.Frame) {
	switch f.Type {
	case proto.TStdin:
		if se.stdin != nil {
			se.stdinQ.Push(f.Payload)
		}
	case proto.TStdinEOF:
		if se.stdin != nil {
			se.stdinQ.Push(nil)
		}
	case proto.TSignal:
		var m proto.Signal
		if err := f.Unmarshal(&m); err == nil && m.Signal > 0 {
			se.signal(syscall.Signal(m.Signal))
		}
	case proto.TResize:
		var m proto.Resize
		if err := f.Unmarshal(&m); err == nil && se.tty != nil {
			if err := pty.Setsize(se.tty, &pty.Winsize{Rows: m.Rows, Cols: m.Cols}); err != nil {
				se.s.log.Debug("resizing pty", "pid", se.pid, "err", err)
			}
		}
	}
}

// signal sends sig to the command's process group.
func (se *session) signal(sig syscall.Signal) {
	se.mu.Lock()
	exited := se.exited
	se.mu.Unlock()
	if exited {
		// The group may live on without its leader.
		if err := syscall.Kill(-se.pid, sig); err != nil && err != syscall.ESRCH {
			se.s.log.Debug("signaling", "pgid", se.pid, "err", err)
		}
		return
	}
	if err := syscall.Kill(-se.pid, sig); err == syscall.ESRCH {
		syscall.Kill(se.pid, sig)
	}
}

func (se *session) timeout() {
	se.timedOut.Store(true)
	se.s.log.Info("timeout; killing process group", "pid", se.pid)
	se.signal(syscall.SIGKILL)
}

// orphan detaches the session from its client (a new client said Hello):
// the command keeps running, its output is discarded, its stdin closed.
func (se *session) orphan() {
	se.mu.Lock()
	se.epoch = 0
	se.mu.Unlock()
	se.out.Close()
	se.stdinQ.Push(nil)
	se.stdinQ.Close()
}

// exit is called by the reaper with the command's status. It must not
// block.
func (se *session) exit(ws unix.WaitStatus) {
	se.mu.Lock()
	se.exited = true
	if se.timer != nil {
		se.timer.Stop()
	}
	se.mu.Unlock()
	se.s.mu.Lock()
	delete(se.s.procs, se.pid)
	se.s.mu.Unlock()
	go se.finish(ws)
}

// finish waits for the command's output to drain (or go idle), then reports
// the exit.
func (se *session) finish(ws unix.WaitStatus) {
	code := exitCode(ws)
	drained := make(chan struct{})
	go func() { se.outputs.Wait(); close(drained) }()
	tick := time.NewTicker(outputGrace / 5)
	defer tick.Stop()
wait:
	for {
		select {
		case <-drained:
			break wait
		case <-tick.C:
			now, idle := time.Now(), true
			for _, st := range se.streams {
				if d, fin := st.idleFor(now); !fin && d < outputGrace {
					idle = false
				}
			}
			if idle {
				break wait // a background process holds the streams
			}
		}
	}
	se.mu.Lock()
	epoch := se.epoch
	se.reported = true
	se.mu.Unlock()

	se.s.mu.Lock()
	if se.s.sessions[se.ch] == se {
		delete(se.s.sessions, se.ch)
	}
	se.s.mu.Unlock()
	se.stdinQ.Close()
	if se.detach {
		fmt.Fprintf(se.s.console, "[pid %d] exited with code %d\n", se.pid, code)
	} else if epoch != 0 {
		se.s.send(epoch, proto.JSON(proto.TExit, se.ch, proto.Exit{Code: code, TimedOut: se.timedOut.Load()}))
	}
	se.s.log.Debug("exited", "pid", se.pid, "code", code, "timed_out", se.timedOut.Load())
	close(se.done)
}

func exitCode(ws unix.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 255
}

// environ is the command's environment: the base environment, the user's
// HOME/USER/LOGNAME, TERM for a TTY, then the request's variables; PATH
// defaults to DefaultPath.
func (s *Server) environ(e *proto.Exec, u *user) []string {
	base := s.opts.Env
	if base == nil {
		base = os.Environ()
	}
	env := append([]string(nil), base...)
	if u != nil {
		env = setenv(env, "HOME", u.home)
		env = setenv(env, "USER", u.name)
		env = setenv(env, "LOGNAME", u.name)
	}
	if e.TTY && getenv(env, "TERM") == "" {
		env = setenv(env, "TERM", "xterm")
	}
	for _, kv := range e.Env {
		k, v, _ := strings.Cut(kv, "=")
		env = setenv(env, k, v)
	}
	if getenv(env, "PATH") == "" {
		env = setenv(env, "PATH", DefaultPath)
	}
	return env
}

func getenv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

func setenv(env []string, key, val string) []string {
	for i, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			env[i] = key + "=" + val
			return env
		}
	}
	return append(env, key+"="+val)
}

// lookPath finds file like a shell does: names with a slash are used as
// they are (relative to dir), others are searched in path.
func lookPath(file, path, dir string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			code := 126
			if errors.Is(err, os.ErrNotExist) {
				code = 127
			}
			return "", startErrorf(code, "exec: %q: %v", file, unwrapPathErr(err))
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, file)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", startErrorf(127, "exec: %q: executable file not found in $PATH", file)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return syscall.EISDIR
	}
	if fi.Mode()&0o111 == 0 {
		return os.ErrPermission
	}
	return nil
}

// startErrorFor classifies an error from os.StartProcess.
func startErrorFor(arg0 string, err error) error {
	code := 126
	if errors.Is(err, syscall.ENOENT) {
		code = 127 // e.g. a missing interpreter
	}
	return startErrorf(code, "exec: %q: %v", arg0, unwrapPathErr(err))
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

var _ io.Writer = (*lineWriter)(nil)
