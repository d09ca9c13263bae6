package agent

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reaper collects the exit status of the agent's children. Statuses are
// collected only here, never through os.Process.Wait or exec.Cmd.Wait, so
// that a global wait4(-1) cannot steal a status another waiter expects.
//
// In global mode (init) one loop calls wait4(-1) on every SIGCHLD and reaps
// every child, orphans reparented to init included, handing each status to
// the callback registered for its pid. In local mode (NoInit) one goroutine
// per started process calls wait4(pid), leaving unrelated children of the
// host process alone.
type reaper struct {
	global bool
	log    *slog.Logger

	mu      sync.Mutex
	waiters map[int]func(unix.WaitStatus)
}

func newReaper(global bool, log *slog.Logger) *reaper {
	return &reaper{global: global, log: log, waiters: map[int]func(unix.WaitStatus){}}
}

// start calls fork, which starts a process and returns its pid, and
// arranges for onExit to receive the process's status. onExit runs on the
// reaper's goroutine and must not block. In global mode fork runs with the
// reaper locked, so the pid is registered before its status can be looked
// up.
func (r *reaper) start(fork func() (int, error), onExit func(unix.WaitStatus)) (int, error) {
	r.mu.Lock()
	pid, err := fork()
	if err != nil {
		r.mu.Unlock()
		return 0, err
	}
	if r.global {
		r.waiters[pid] = onExit
		r.mu.Unlock()
		return pid, nil
	}
	r.mu.Unlock()
	go func() {
		for {
			var ws unix.WaitStatus
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				r.log.Error("waiting for child", "pid", pid, "err", err)
				ws = unix.WaitStatus(0xff << 8) // exit code 255
			}
			onExit(ws)
			return
		}
	}()
	return pid, nil
}

// run reaps children until ctx ends (global mode).
func (r *reaper) run(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	// A periodic pass covers a SIGCHLD lost to a checkpoint/restore.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r.reapAll()
		select {
		case <-sigs:
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

func (r *reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD: no children; 0: none exited
		}
		r.mu.Lock()
		fn := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if fn != nil {
			fn(ws)
		} else {
			r.log.Debug("reaped orphan", "pid", pid, "code", exitCode(ws))
		}
	}
}
