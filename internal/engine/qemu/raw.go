package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/k7-dev/k7/internal/engine"
)

// This file lends the engine's pieces to the raw QEMU floor of the bench
// (package bench): a guest started with the engine's command line and
// driven over a QMP connection the caller holds, without the engine's
// bookkeeping (state files, locks, a QMP dial per operation, the fork
// pool).

// QMP is the engine's QMP client. Not safe for concurrent commands.
type QMP = qmp

// RootDisk returns the read-only ext4 image of rootfs, building it on
// first use (cached under Root/disks like a sandbox's).
func (e *Engine) RootDisk(ctx context.Context, rootfs string) (string, error) {
	return e.rootDisk(ctx, rootfs)
}

// RawSpec is a guest for StartRaw.
type RawSpec struct {
	ID          string // names its dir under Root/sandboxes; a sandbox ID not in use
	MemoryBytes int64  // 0: DefaultMemoryBytes; ignored with From
	Disk        string // root disk image (RootDisk), "" for none; ignored with From
	From        string // a capture dir (RawVM.Checkpoint) to restore; "" boots the guest
}

// RawVM is a QEMU process that StartRaw started. Not safe for concurrent
// use.
type RawVM struct {
	QMP    *QMP // the monitor, held for the guest's life
	e      *Engine
	st     *vmState
	exited <-chan struct{}
}

// StartRaw launches QEMU for spec with the command line a sandbox gets,
// connects its monitor and, for a restore, loads the capture's device
// state. The guest stays stopped until Run. The caller calls Remove, also
// after an error of Run; on error StartRaw leaves nothing behind.
func (e *Engine) StartRaw(ctx context.Context, spec RawSpec) (_ *RawVM, err error) {
	if err := checkID(spec.ID); err != nil {
		return nil, err
	}
	st := e.newState(spec.ID, &engine.CreateRequest{Resources: engine.Resources{MemoryBytes: spec.MemoryBytes}})
	if spec.From == "" {
		st.Disk = spec.Disk
		st.MemFile = filepath.Join(e.cfg.ShmDir, fmt.Sprintf("k7-qemu-%s-%s.mem", e.rootHash, spec.ID))
	} else {
		b, err := os.ReadFile(filepath.Join(spec.From, manifestFile))
		if err != nil {
			return nil, fmt.Errorf("reading capture: %w", err)
		}
		var m manifest
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("reading capture manifest: %w", err)
		}
		st.MemoryBytes, st.CPUs, st.Disk = m.MemoryBytes, m.CPUs, m.Disk
		st.Incoming = filepath.Join(spec.From, stateStream)
		if m.Memory != "" {
			st.Frozen = filepath.Join(spec.From, m.Memory)
		}
	}
	if err := os.Mkdir(e.dir(spec.ID), 0o755); err != nil {
		return nil, err
	}
	v := &RawVM{e: e, st: st}
	defer func() {
		if err != nil {
			v.Remove(context.WithoutCancel(ctx))
		}
	}()
	if err := os.MkdirAll(st.SockDir, 0o700); err != nil {
		return nil, err
	}
	if v.exited, err = e.launch(st); err != nil {
		return nil, err
	}
	if v.QMP, err = e.dialMonitor(ctx, st, v.exited); err != nil {
		return nil, err
	}
	if st.Incoming != "" {
		if err := e.loadState(ctx, v.QMP, st); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// Run connects to the agent's socket and continues the guest; a booting
// guest is waited for until its agent opens its port. It returns the
// agent stream (for client.New); the caller closes it.
func (v *RawVM) Run(ctx context.Context) (net.Conn, error) {
	conn, err := dialAgent(ctx, v.st)
	if err != nil {
		return nil, err
	}
	if _, err := v.QMP.Execute(ctx, "cont", nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if v.st.Incoming == "" {
		bctx, cancel := context.WithTimeout(ctx, bootTimeout)
		defer cancel()
		if _, err := v.QMP.WaitEvent(bctx, agentPortOpen); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("waiting for the agent: %w; console: %s", err, v.e.tail(v.st.ID, "console.log"))
		}
	}
	return conn, nil
}

// agentPortOpen matches the event of the agent opening its port.
func agentPortOpen(ev qmpEvent) bool {
	var d struct {
		ID   string `json:"id"`
		Open bool   `json:"open"`
	}
	return ev.Event == "VSERPORT_CHANGE" && json.Unmarshal(ev.Data, &d) == nil && d.ID == "agentport" && d.Open
}

// Checkpoint captures the guest into dir as Engine.Checkpoint does, over
// the held monitor, and returns how long the guest was stopped.
func (v *RawVM) Checkpoint(ctx context.Context, dir string) (time.Duration, error) {
	res, err := v.e.checkpoint(ctx, v.QMP, v.st, dir)
	if err != nil {
		return 0, fmt.Errorf("checkpointing %s: %w", v.st.ID, err)
	}
	return res.SourcePause, nil
}

// Remove stops QEMU (quit over the held monitor; SIGKILL when it has not
// exited a second later) and removes the guest's dir, sockets and RAM file.
// It may be repeated.
func (v *RawVM) Remove(ctx context.Context) {
	if v.QMP != nil {
		qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, _ = v.QMP.Execute(qctx, "quit", nil)
		cancel()
		_ = v.QMP.Close()
		v.QMP = nil
	}
	if v.exited != nil {
		select {
		case <-v.exited:
		case <-time.After(time.Second):
			_ = syscall.Kill(v.st.PID, syscall.SIGKILL)
			<-v.exited
		}
		v.exited = nil
	}
	for _, p := range []string{v.e.dir(v.st.ID), v.st.SockDir, v.st.MemFile} {
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			v.e.log.Warn("removing raw guest", "sandbox", v.st.ID, "path", p, "err", err)
		}
	}
}
