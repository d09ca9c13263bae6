// Package agent is k7-agent, the init process of every sandbox.
//
// The agent speaks the framed protocol of package proto with the daemon over
// one byte stream (init's stdin/stdout under gVisor, a virtio-serial port
// under QEMU, pipes in tests and in the fake engine). It starts commands as
// its own children, each in its own process group, streams their stdio,
// reaps them (and, as PID 1, every orphan), and serves files.
//
// Detached commands write their stdout and stderr to the console (the
// agent's stderr, the sandbox log), one "[pid N] " prefixed line at a time.
package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/agent/proto"
)

// Version is the agent's version, reported in HelloAck.
const Version = "0.1.0"

// ProtocolVersion is the protocol version the agent speaks.
const ProtocolVersion = proto.Version

// DefaultPath is the PATH of commands whose environment has none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options configure a Server. The zero value is the in-sandbox agent.
type Options struct {
	// Root is the directory that "/" in file paths and command working
	// directories maps to; "" is the real root. Executables and users are
	// always looked up on the real root (the fake engine has no chroot).
	Root string
	// NoInit keeps the agent from acting as init: it mounts nothing, sets no
	// host name (Configure only records it), and reaps only the processes it
	// started (wait4 by pid) instead of every child.
	NoInit bool
	// Env is the base environment of commands; nil means os.Environ().
	Env []string
	// Logger receives the agent's own log; nil logs text to Console.
	Logger *slog.Logger
	// Console receives detached commands' output; nil means os.Stderr.
	Console io.Writer
}

// Server is one agent. Its methods are safe for concurrent use.
type Server struct {
	opts    Options
	log     *slog.Logger
	console *lineWriter
	reaper  *reaper

	w *proto.Writer

	mu       sync.Mutex
	epoch    uint64 // bumped by each Hello with a new nonce
	nonce    uint64
	sessions map[uint32]*session // current epoch's exec channels
	puts     map[uint32]*putFile
	gets     map[uint32]*getFile
	procs    map[int]*session // live commands of every epoch, by pid
	hostname string
}

// NewServer returns a server; call Serve to run it.
func NewServer(opts Options) *Server {
	console := opts.Console
	if console == nil {
		console = os.Stderr
	}
	lw := &lineWriter{w: console}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(lw, nil))
	}
	return &Server{
		opts:     opts,
		log:      log,
		console:  lw,
		reaper:   newReaper(!opts.NoInit, log),
		sessions: map[uint32]*session{},
		puts:     map[uint32]*putFile{},
		gets:     map[uint32]*getFile{},
		procs:    map[int]*session{},
	}
}

// Serve runs an agent over r and w until ctx ends; see Server.Serve.
func Serve(ctx context.Context, r io.Reader, w io.Writer, opts Options) error {
	return NewServer(opts).Serve(ctx, r, w)
}

// Serve reads requests from r and answers on w until ctx ends, then returns
// nil. It is meant to be called once. End of file and read errors on r do
// not end it (the agent is init; a FIFO may be reopened): it logs them and
// reads again after a pause. The caller closes r and w after Serve returns,
// which ends the goroutine still reading r. Commands keep running after
// Serve returns.
func (s *Server) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	s.mu.Lock()
	s.w = proto.NewWriter(w)
	s.mu.Unlock()
	if s.reaper.global {
		go s.reaper.run(ctx)
	}
	go s.readLoop(ctx, r)
	<-ctx.Done()
	return nil
}

func (s *Server) readLoop(ctx context.Context, r io.Reader) {
	rd := proto.NewReader(&retryReader{ctx: ctx, r: r, log: s.log})
	var skipped int64
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			return // ctx ended
		}
		if n := rd.Skipped(); n != skipped {
			s.log.Warn("skipped bytes resynchronizing", "bytes", n-skipped)
			skipped = n
		}
		if ctx.Err() != nil {
			return
		}
		s.handle(ctx, f)
	}
}

// retryReader reads through interruptions: EINTR and EAGAIN (a gVisor
// checkpoint interrupts blocking reads), end of file and other errors
// (retried after a pause). It returns an error only when ctx ends.
type retryReader struct {
	ctx    context.Context
	r      io.Reader
	log    *slog.Logger
	failed bool
}

func (rr *retryReader) Read(p []byte) (int, error) {
	for {
		if err := rr.ctx.Err(); err != nil {
			return 0, err
		}
		n, err := rr.r.Read(p)
		if n > 0 {
			if rr.failed {
				rr.log.Info("transport readable again")
				rr.failed = false
			}
			return n, nil
		}
		pause := 100 * time.Millisecond
		switch {
		case err == nil:
			pause = time.Millisecond
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			pause = 5 * time.Millisecond
		default:
			if !rr.failed {
				rr.log.Warn("reading transport; retrying", "err", err)
				rr.failed = true
			}
		}
		select {
		case <-time.After(pause):
		case <-rr.ctx.Done():
		}
	}
}

var errStale = errors.New("stale epoch")

// send writes f if epoch is still the current one. It reports whether the
// frame was written.
func (s *Server) send(epoch uint64, f proto.Frame) bool {
	err := s.w.Locked(func(write func(proto.Frame) error) error {
		s.mu.Lock()
		cur := s.epoch
		s.mu.Unlock()
		if cur != epoch {
			return errStale
		}
		return write(f)
	})
	if err != nil && !errors.Is(err, errStale) {
		s.log.Debug("writing frame", "frame", f.String(), "err", err)
	}
	return err == nil
}

func (s *Server) currentEpoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// result sends a TResult for err (nil: success).
func (s *Server) result(epoch uint64, ch uint32, err error) {
	s.send(epoch, proto.JSON(proto.TResult, ch, resultOf(err)))
}

func (s *Server) handle(ctx context.Context, f proto.Frame) {
	if f.Type == proto.THello {
		var h proto.Hello
		if err := f.Unmarshal(&h); err != nil {
			s.log.Warn("bad hello", "err", err)
			return
		}
		s.hello(h)
		return
	}
	epoch := s.currentEpoch()
	switch f.Type {
	case proto.TPing:
		s.send(epoch, proto.Frame{Type: proto.TPong, Channel: f.Channel, Payload: f.Payload})
	case proto.TConfigure:
		var c proto.Configure
		err := f.Unmarshal(&c)
		if err == nil {
			err = s.configure(c)
		}
		s.result(epoch, f.Channel, err)
	case proto.TExec:
		var e proto.Exec
		if err := f.Unmarshal(&e); err != nil {
			s.result(epoch, f.Channel, invalid(err))
			return
		}
		s.exec(epoch, f.Channel, &e)
	case proto.TStdin, proto.TStdinEOF, proto.TSignal, proto.TResize:
		s.mu.Lock()
		se := s.sessions[f.Channel]
		s.mu.Unlock()
		if se != nil {
			se.control(f)
		}
	case proto.TWindow:
		s.mu.Lock()
		se, g := s.sessions[f.Channel], s.gets[f.Channel]
		s.mu.Unlock()
		if se != nil {
			se.out.Add(f.Credit())
		}
		if g != nil {
			g.credit.Add(f.Credit())
		}
	case proto.TPutFile, proto.TData, proto.TEnd:
		s.putFile(epoch, f)
	case proto.TGetFile:
		s.getFile(ctx, epoch, f)
	case proto.TCancel:
		s.cancel(f.Channel)
	default:
		s.log.Debug("ignoring frame", "frame", f.String())
	}
}

// hello answers a Hello; a new nonce starts a new epoch.
func (s *Server) hello(h proto.Hello) {
	var old []*session
	var oldPuts []*putFile
	var oldGets []*getFile
	err := s.w.Locked(func(write func(proto.Frame) error) error {
		s.mu.Lock()
		if s.epoch == 0 || s.nonce != h.Nonce {
			s.epoch++
			s.nonce = h.Nonce
			for _, se := range s.sessions {
				old = append(old, se)
			}
			for _, p := range s.puts {
				oldPuts = append(oldPuts, p)
			}
			for _, g := range s.gets {
				oldGets = append(oldGets, g)
			}
			s.sessions = map[uint32]*session{}
			s.puts = map[uint32]*putFile{}
			s.gets = map[uint32]*getFile{}
		}
		s.mu.Unlock()
		return write(proto.JSON(proto.THelloAck, 0, proto.HelloAck{
			Nonce:           h.Nonce,
			ProtocolVersion: ProtocolVersion,
			AgentVersion:    Version,
			PID:             os.Getpid(),
		}))
	})
	if err != nil {
		s.log.Warn("answering hello", "err", err)
	}
	if len(old)+len(oldPuts)+len(oldGets) > 0 {
		s.log.Info("new client; dropping previous client's channels", "sessions", len(old))
	}
	for _, se := range old {
		se.orphan()
	}
	for _, p := range oldPuts {
		p.abort()
	}
	for _, g := range oldGets {
		g.credit.Close()
	}
}

func (s *Server) configure(c proto.Configure) error {
	if c.TimeUnixNano != 0 && !s.opts.NoInit {
		s.syncClock(time.Unix(0, c.TimeUnixNano))
	}
	if c.Hostname == "" {
		return nil
	}
	s.mu.Lock()
	s.hostname = c.Hostname
	s.mu.Unlock()
	if s.opts.NoInit {
		s.log.Info("recording host name (NoInit: not set)", "hostname", c.Hostname)
		return nil
	}
	if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
		s.log.Error("setting host name", "hostname", c.Hostname, "err", err)
		return err
	}
	s.log.Info("host name set", "hostname", c.Hostname)
	return nil
}

// syncClock steps the clock to host when it is off by more than a second.
// gVisor keeps the host's clock and refuses; a VM restored from a capture
// needs it.
func (s *Server) syncClock(host time.Time) {
	off := time.Since(host)
	if off < time.Second && off > -time.Second {
		return
	}
	tv := unix.NsecToTimeval(host.UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		s.log.Debug("clock not stepped", "off", off, "err", err)
		return
	}
	s.log.Info("clock stepped to the host's", "was_off_by", off)
}

func (s *Server) cancel(ch uint32) {
	s.mu.Lock()
	p, g := s.puts[ch], s.gets[ch]
	delete(s.puts, ch)
	delete(s.gets, ch)
	s.mu.Unlock()
	if p != nil {
		p.abort()
	}
	if g != nil {
		g.credit.Close()
	}
}

// Freeze stops (SIGSTOP) the process group of every command the agent
// started and that is still running; Thaw continues them. They are the fake
// engine's pause. Both may be repeated.
func (s *Server) Freeze() error { return s.signalAll(syscall.SIGSTOP) }

// Thaw continues the process groups stopped by Freeze.
func (s *Server) Thaw() error { return s.signalAll(syscall.SIGCONT) }

// KillAll sends SIGKILL to the process group of every command the agent
// started and that is still running (the fake engine's delete).
func (s *Server) KillAll() error { return s.signalAll(syscall.SIGKILL) }

func (s *Server) signalAll(sig syscall.Signal) error {
	s.mu.Lock()
	pids := make([]int, 0, len(s.procs))
	for pid := range s.procs {
		pids = append(pids, pid)
	}
	s.mu.Unlock()
	var errs []error
	for _, pid := range pids {
		if err := syscall.Kill(-pid, sig); err != nil && err != syscall.ESRCH {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// lineWriter serializes writes to the console.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
