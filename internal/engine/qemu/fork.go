package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// Capture files in a CheckpointRequest.Dir.
const (
	manifestFile = "manifest.json"
	stateStream  = "state.bin"  // QEMU device state (migration stream)
	memoryFile   = "memory.bin" // frozen guest RAM; absent when the stream carries it
	versionFile  = "engine-version"
)

// manifest describes a capture.
type manifest struct {
	EngineVersion string `json:"engine_version"`
	MemoryBytes   int64  `json:"memory_bytes"`
	CPUs          int    `json:"cpus"`
	Disk          string `json:"disk,omitempty"`
	Memory        string `json:"memory,omitempty"` // memoryFile, or "" when RAM is in the stream
	// Net is the guest's NIC (address, gateway, MAC); nil: loopback only.
	Net     *guestNet `json:"net,omitempty"`
	Source  string    `json:"source"`
	Created string    `json:"created"`
}

// Checkpoint captures a running sandbox into req.Dir: the device state
// (x-ignore-shared: kilobytes) and a frozen copy of its RAM file. The
// guest is stopped only for the capture and continues after (unless it was
// paused before). A sandbox that is itself a fork has private RAM, which
// the stream then carries in full (slower, no sharing among its forks).
func (e *Engine) Checkpoint(ctx context.Context, req *engine.CheckpointRequest) (*engine.CheckpointResult, error) {
	if err := checkID(req.ID); err != nil {
		return nil, err
	}
	defer e.lock(req.ID)()
	var res *engine.CheckpointResult
	err := e.monitor(ctx, req.ID, func(q *qmp, st *vmState) error {
		var err error
		res, err = e.checkpoint(ctx, q, st, req.Dir)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, err)
	}
	return res, nil
}

func (e *Engine) checkpoint(ctx context.Context, q *qmp, st *vmState, dir string) (*engine.CheckpointResult, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	shared := st.MemFile != ""
	if err := setMigration(ctx, q, shared); err != nil {
		return nil, err
	}
	raw, err := q.Execute(ctx, "query-status", nil)
	if err != nil {
		return nil, err
	}
	var s struct {
		Running bool `json:"running"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("decoding query-status: %w", err)
	}

	start := time.Now()
	if s.Running {
		if _, err := q.Execute(ctx, "stop", nil); err != nil {
			return nil, err
		}
		// Whatever happens below, the source runs again.
		defer func() {
			if _, err := q.Execute(context.WithoutCancel(ctx), "cont", nil); err != nil {
				e.log.Error("resuming after checkpoint", "sandbox", st.ID, "err", err)
			}
		}()
	}
	if _, err := q.Execute(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(filepath.Join(dir, stateStream))}); err != nil {
		return nil, err
	}
	if err := waitMigration(ctx, q); err != nil {
		return nil, err
	}
	e.log.Debug("checkpoint step", "sandbox", st.ID, "step", "save state", "took", time.Since(start))
	m := manifest{EngineVersion: e.version, MemoryBytes: st.MemoryBytes, CPUs: st.CPUs, Disk: st.Disk,
		Net: st.Net, Source: st.ID, Created: time.Now().UTC().Format(time.RFC3339Nano)}
	if shared {
		if err := copySparse(st.MemFile, filepath.Join(dir, memoryFile)); err != nil {
			return nil, fmt.Errorf("freezing memory: %w", err)
		}
		m.Memory = memoryFile
	}
	pause := time.Since(start) // cont runs in the deferred call; it takes well under a millisecond
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, manifestFile), b, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, versionFile), []byte(e.version+"\n"), 0o644); err != nil {
		return nil, err
	}
	var size int64
	for _, f := range []string{manifestFile, versionFile, stateStream, memoryFile} {
		var sst unix.Stat_t
		if unix.Stat(filepath.Join(dir, f), &sst) == nil {
			size += sst.Blocks * 512
		}
	}
	return &engine.CheckpointResult{SourcePause: pause, SizeBytes: size, EngineVersion: e.version}, nil
}

// copySparse copies src to dst, skipping holes (untouched guest RAM stays
// unallocated in the frozen copy).
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = out.Close() }()
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	ifd, size := int(in.Fd()), fi.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) {
				break // only a hole is left
			}
			return err
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(out, in, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return out.Close()
}

// Restore starts a new sandbox from a capture: QEMU maps the frozen RAM
// copy-on-write (share=off), loads the device state and continues. The
// capture dir must outlive the sandbox's start; the frozen RAM file may be
// removed once Restore returns (the mapping keeps it). A capture of a
// sandbox with a NIC needs req.Netns with eth0 holding the capture's
// address and gateway (the guest keeps them); one without needs a
// namespace without eth0, or none.
func (e *Engine) Restore(ctx context.Context, req *engine.RestoreRequest) error {
	if err := checkID(req.ID); err != nil {
		return err
	}
	defer e.lock(req.ID)()
	b, err := os.ReadFile(filepath.Join(req.From, manifestFile))
	if err != nil {
		return fmt.Errorf("restoring sandbox %q: reading capture: %w", req.ID, errdefs.ErrInvalidArgument)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("restoring sandbox %q: reading capture manifest: %w: %w", req.ID, err, errdefs.ErrInvalidArgument)
	}
	version := m.EngineVersion
	if b, err := os.ReadFile(filepath.Join(req.From, versionFile)); err == nil {
		version = strings.TrimSpace(string(b))
	}
	if version != e.version || m.EngineVersion != e.version {
		return fmt.Errorf("restoring sandbox %q: capture made by %q, engine is %q: %w",
			req.ID, version, e.version, errdefs.ErrFailedPrecondition)
	}
	st := e.newState(req.ID, &req.CreateRequest)
	st.MemoryBytes, st.CPUs, st.Disk = m.MemoryBytes, m.CPUs, m.Disk
	st.Incoming = filepath.Join(req.From, stateStream)
	if st.Net, err = restoreNet(&m, req.Netns); err != nil {
		return fmt.Errorf("restoring sandbox %q: %w", req.ID, err)
	}
	if m.Memory != "" {
		st.Frozen = filepath.Join(req.From, m.Memory)
	}
	if st.Disk != "" {
		if _, err := os.Stat(st.Disk); err != nil {
			if req.Rootfs == "" {
				return fmt.Errorf("restoring sandbox %q: root disk of the capture: %w: %w", req.ID, err, errdefs.ErrFailedPrecondition)
			}
			if st.Disk, err = e.rootDisk(ctx, req.Rootfs); err != nil {
				return fmt.Errorf("restoring sandbox %q: %w", req.ID, err)
			}
		}
	}
	if err := e.start(ctx, st, e.log.With("sandbox", req.ID)); err != nil {
		return fmt.Errorf("restoring sandbox %q: %w", req.ID, err)
	}
	e.poolRefill(st)
	return nil
}

// restoreNet checks that the sandbox netns at path (or its absence) fits
// the capture m, and returns the child's NIC: the capture's.
func restoreNet(m *manifest, path string) (*guestNet, error) {
	var have *guestNet
	if path != "" {
		var err error
		if have, err = readNetns(path); err != nil {
			return nil, err
		}
	}
	switch {
	case m.Net == nil && have == nil:
		return nil, nil
	case m.Net == nil:
		return nil, fmt.Errorf("the capture has no network interface, netns %s has %s: %w", path, sandboxIf, errdefs.ErrFailedPrecondition)
	case have == nil:
		return nil, fmt.Errorf("the capture has a network interface (%s); the restore needs a netns with %s: %w", m.Net.Addr, sandboxIf, errdefs.ErrFailedPrecondition)
	case have.Addr != m.Net.Addr || have.Gateway != m.Net.Gateway:
		return nil, fmt.Errorf("netns %s has %s via %s, the capture's guest has %s via %s: %w",
			path, have.Addr, have.Gateway, m.Net.Addr, m.Net.Gateway, errdefs.ErrFailedPrecondition)
	}
	n := *m.Net
	return &n, nil
}
