// Package engine defines the interface between the k7 daemon and the
// isolation technologies that run sandboxes (gVisor, QEMU, fake).
//
// An engine owns everything below the sandbox boundary: processes, mounts,
// cgroups and the transport to the k7-agent that runs as PID 1 inside every
// sandbox. The daemon owns names, images, state and the agent protocol.
// Optional features are separate interfaces (Forker) found by type assertion
// and reported in Capabilities.
package engine

import (
	"context"
	"io"
	"time"
)

// State is the lifecycle state of a sandbox as the engine sees it.
type State int

// States. Their strings are API (see api/v1) and never change.
const (
	StateUnknown State = iota
	StateCreating
	StateRunning
	StatePaused
	StateStopped
	StateDead
)

func (s State) String() string {
	switch s {
	case StateCreating:
		return "creating"
	case StateRunning:
		return "running"
	case StatePaused:
		return "paused"
	case StateStopped:
		return "stopped"
	case StateDead:
		return "dead"
	default:
		return "unknown"
	}
}

// Resources are a sandbox's limits. Zero means the engine's default.
type Resources struct {
	CPUs        float64 // vCPUs
	MemoryBytes int64   // bytes
	PIDs        int64   // tasks
}

// CreateRequest describes a sandbox to start.
type CreateRequest struct {
	// ID is the sandbox ID: lower-case hex, fixed width, unique on the node.
	ID string
	// Hostname is the sandbox's host name.
	Hostname string
	// Rootfs is the host path of the image's unpacked root filesystem. It is
	// shared between sandboxes and must never be written to; the engine
	// gives each sandbox its own writable layer.
	Rootfs string
	// Env is the environment of the agent and the default for its commands.
	Env []string
	// Resources are the limits.
	Resources Resources
	// Netns is the path of the network namespace the sandbox joins (made
	// and removed by the daemon's network manager, internal/network); ""
	// means loopback only. Engines without Capabilities.Network ignore it.
	// A restored sandbox needs a namespace of its own whose interface has
	// the address the capture had (the daemon's address-stable fork).
	Netns string
}

// Status is what the engine reports about one sandbox.
type Status struct {
	State  State
	PID    int    // host PID of the sandbox's main process, 0 if none
	Reason string // why it is stopped or dead
}

// Stats is a resource usage reading.
type Stats struct {
	CPU         time.Duration
	MemoryBytes int64
	PIDs        int64
}

// Capabilities lists what an engine can do beyond the Engine interface.
type Capabilities struct {
	Fork bool // implements Forker
	// Network: the engine joins CreateRequest.Netns, so sandboxes may have
	// a network policy other than "none".
	Network bool
}

// Engine runs sandboxes. Implementations are safe for concurrent use on
// different IDs; the daemon serializes operations on one ID.
type Engine interface {
	// Name returns the engine's registered name ("gvisor", "qemu", "fake").
	Name() string
	// Capabilities reports the optional interfaces the engine implements.
	Capabilities() Capabilities
	// Create starts a sandbox whose PID 1 is the k7-agent. On error nothing
	// of the sandbox is left behind.
	Create(ctx context.Context, req *CreateRequest) error
	// Connect returns the byte stream to the sandbox's agent. It may be
	// called again after a daemon restart or after the previous stream was
	// closed; at most one stream is open at a time. The caller closes it.
	Connect(ctx context.Context, id string) (io.ReadWriteCloser, error)
	// Pause freezes every process of the sandbox in place.
	Pause(ctx context.Context, id string) error
	// Resume continues a paused sandbox.
	Resume(ctx context.Context, id string) error
	// Status reports the sandbox's state; errdefs.ErrNotFound if the engine
	// has no such sandbox.
	Status(ctx context.Context, id string) (Status, error)
	// Stats reads current resource usage.
	Stats(ctx context.Context, id string) (Stats, error)
	// Logs opens the sandbox's console log (the agent's stderr and the
	// output of detached commands), from the start.
	Logs(ctx context.Context, id string) (io.ReadCloser, error)
	// Delete stops the sandbox and removes everything the engine made for
	// it. Deleting an unknown ID is not an error; Delete may be repeated.
	Delete(ctx context.Context, id string) error
	// List returns the IDs of every sandbox the engine holds, running or
	// not, so that the daemon can reconcile and prune.
	List(ctx context.Context) ([]string, error)
}

// CheckpointRequest asks for a capture of a running sandbox.
type CheckpointRequest struct {
	ID  string
	Dir string // empty directory that receives the capture; owned by the caller
}

// CheckpointResult describes a capture.
type CheckpointResult struct {
	// SourcePause is how long the source was stopped for the capture.
	SourcePause time.Duration
	// SizeBytes is the size of the capture on disk.
	SizeBytes int64
	// EngineVersion identifies the engine build; a capture restores only
	// into the same version.
	EngineVersion string
}

// RestoreRequest starts a new sandbox from a capture.
type RestoreRequest struct {
	CreateRequest
	From string // directory written by Checkpoint
}

// Forker is implemented by engines that capture a live sandbox, memory
// included, and start new sandboxes from the capture.
type Forker interface {
	// Checkpoint captures the sandbox's memory, processes and writable
	// layer into req.Dir and leaves the sandbox running (it is paused only
	// for the capture).
	Checkpoint(ctx context.Context, req *CheckpointRequest) (*CheckpointResult, error)
	// Restore starts a new sandbox from a capture. The new sandbox's agent
	// is reachable through Connect. On error nothing is left behind.
	Restore(ctx context.Context, req *RestoreRequest) error
}

// Destroyer is implemented by engines that keep host state beyond their
// sandboxes (mounts, cgroups, pools). Destroy removes it once every sandbox
// is deleted; `k7d --cleanup` calls it.
type Destroyer interface {
	Destroy(ctx context.Context) error
}

// Precreator is implemented by Forkers that can do the first part of a
// Restore ahead of time: Precreate prepares sandbox req.ID (its container,
// in req.Netns, with req.Rootfs and req.Resources) without starting it, so
// that a later Restore with the same ID and the same Rootfs, Resources and
// Netns only loads the capture. A Restore whose request differs discards
// the prepared sandbox and starts from scratch. Delete removes a prepared
// sandbox that is never restored, and List reports it. Precreate leaves
// nothing behind on error.
type Precreator interface {
	Precreate(ctx context.Context, req *CreateRequest) error
}
