// Package v1 holds the wire types of the k7 HTTP/JSON API served under /v1.
//
// Times are RFC 3339, sizes are bytes, durations are nanoseconds in fields
// whose names end in _ns. The package has no logic and imports nothing from
// k7's internal packages; the SDK and the server both build on it.
package v1

import "time"

// Error codes carried in Error.Code. They never change.
const (
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodeInvalidArgument    = "invalid_argument"
	CodeFailedPrecondition = "failed_precondition"
	CodeConflict           = "conflict"
	CodeUnavailable        = "unavailable"
	CodeResourceExhausted  = "resource_exhausted"
	CodeUnauthorized       = "unauthorized"
	CodeInternal           = "internal"
)

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// Sandbox states. Their strings are API and never change.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateStopped  = "stopped" // the sandbox's init exited
	StateDead     = "dead"    // the engine lost the sandbox (killed, crashed, gone after a reboot)
)

// Resources are the limits of a sandbox. Zero means the engine's default.
type Resources struct {
	CPUs        float64 `json:"cpus,omitempty"`         // vCPUs (fractions allowed for gvisor)
	MemoryBytes int64   `json:"memory_bytes,omitempty"` // memory limit in bytes
	PIDs        int64   `json:"pids,omitempty"`         // maximum number of tasks
}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Image     string    `json:"image"`
	Engine    string    `json:"engine,omitempty"` // default: the daemon's default engine
	Name      string    `json:"name,omitempty"`   // default: generated
	Env       []string  `json:"env,omitempty"`    // KEY=VALUE
	Resources Resources `json:"resources,omitempty"`
	// Network is the network policy: "none" (loopback only), "isolated"
	// (default: reachable only through published ports, reaches nothing) or
	// "egress" (outbound through NAT, limited to Allow when set).
	Network string `json:"network,omitempty"`
	// Allow lists what an egress sandbox may reach: CIDR or CIDR:PORT.
	Allow []string `json:"allow,omitempty"`
	// Ports are published on the host's loopback.
	Ports []Port `json:"ports,omitempty"`
}

// Port is a published port: host 127.0.0.1:HostPort reaches the sandbox's
// Port. HostPort 0 in a request picks a free port.
type Port struct {
	HostPort int    `json:"host_port"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol,omitempty"` // "tcp"
}

// Network describes a sandbox's network.
type Network struct {
	Policy  string   `json:"policy"`
	Address string   `json:"address,omitempty"` // in-sandbox address; identical in fork children
	Gateway string   `json:"gateway,omitempty"`
	Outer   string   `json:"outer,omitempty"` // host-side address that reaches the sandbox
	Allow   []string `json:"allow,omitempty"`
}

// Sandbox is one sandbox as the daemon knows it.
type Sandbox struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Image     string    `json:"image"`
	ImageID   string    `json:"image_id"`
	Engine    string    `json:"engine"`
	State     string    `json:"state"`
	Reason    string    `json:"reason,omitempty"` // why the sandbox is dead or stopped
	Hostname  string    `json:"hostname"`
	Env       []string  `json:"env,omitempty"`
	Resources Resources `json:"resources"`
	Parent    string    `json:"parent,omitempty"` // sandbox or snapshot this one was forked or restored from
	Created   time.Time `json:"created"`
	Network   *Network  `json:"network,omitempty"`
	Ports     []Port    `json:"ports,omitempty"`
	Stats     *Stats    `json:"stats,omitempty"` // only in GET /v1/sandboxes/{id}

	// LatencyNS is how long the daemon spent on the request that returned this.
	LatencyNS int64 `json:"latency_ns,omitempty"`
}

// Stats is a point-in-time resource usage reading.
type Stats struct {
	CPUNS       int64 `json:"cpu_ns"`
	MemoryBytes int64 `json:"memory_bytes"`
	PIDs        int64 `json:"pids"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// OpResult answers operations that return no object (pause, resume, delete).
type OpResult struct {
	ID        string `json:"id"`
	State     string `json:"state,omitempty"`
	LatencyNS int64  `json:"latency_ns"`
}

// ExecRequest starts a command in a sandbox. It is the body of
// POST /v1/sandboxes/{id}/exec and the first (text) message of the
// WebSocket at GET /v1/sandboxes/{id}/exec/ws.
type ExecRequest struct {
	Args      []string `json:"args"`
	Env       []string `json:"env,omitempty"`  // KEY=VALUE, added to the sandbox's env
	Cwd       string   `json:"cwd,omitempty"`  // default "/"
	User      string   `json:"user,omitempty"` // name or uid[:gid], default root
	TTY       bool     `json:"tty,omitempty"`
	Rows      uint16   `json:"rows,omitempty"`
	Cols      uint16   `json:"cols,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"`      // the client will send stdin
	Detach    bool     `json:"detach,omitempty"`     // start and return; output goes to the sandbox log
	TimeoutNS int64    `json:"timeout_ns,omitempty"` // kill the command after this long
	// StdinData is stdin for the non-streaming POST form.
	StdinData []byte `json:"stdin_data,omitempty"`
}

// ExecResult is the answer of the non-streaming POST /v1/sandboxes/{id}/exec.
type ExecResult struct {
	PID       int    `json:"pid"`
	ExitCode  int    `json:"exit_code"`
	Stdout    []byte `json:"stdout,omitempty"`
	Stderr    []byte `json:"stderr,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	LatencyNS int64  `json:"latency_ns"`
}

// WebSocket exec framing. Binary messages carry stream data: the first byte
// is the stream (StreamStdin, StreamStdout, StreamStderr), the rest the
// bytes; a binary message of only StreamStdin closes stdin. Text messages
// carry ExecControl as JSON in both directions.
const (
	StreamStdin  byte = 0
	StreamStdout byte = 1
	StreamStderr byte = 2
)

// ExecControl types.
const (
	ControlStarted = "started" // server→client: the command runs (PID set)
	ControlExit    = "exit"    // server→client: last message (ExitCode set)
	ControlError   = "error"   // server→client: last message (Error, Code set)
	ControlResize  = "resize"  // client→server: Rows, Cols
	ControlSignal  = "signal"  // client→server: Signal ("TERM", "KILL", "INT", ...)
)

// ExecControl is a text message on the exec WebSocket.
type ExecControl struct {
	Type      string `json:"type"`
	PID       int    `json:"pid,omitempty"`
	ExitCode  int    `json:"exit_code,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Rows      uint16 `json:"rows,omitempty"`
	Cols      uint16 `json:"cols,omitempty"`
	Signal    string `json:"signal,omitempty"`
	Error     string `json:"error,omitempty"`
	Code      string `json:"code,omitempty"`
	LatencyNS int64  `json:"latency_ns,omitempty"`
}

// Image is one image in the node's image store.
type Image struct {
	ID        string    `json:"id"`         // sha256 of the image config (or of the rootfs for imported rootfs tarballs)
	Refs      []string  `json:"refs"`       // names it is known by
	SizeBytes int64     `json:"size_bytes"` // unpacked rootfs size
	Created   time.Time `json:"created"`
	Env       []string  `json:"env,omitempty"`     // from the image config
	Cmd       []string  `json:"cmd,omitempty"`     // from the image config
	WorkDir   string    `json:"workdir,omitempty"` // from the image config
}

// ImageList is the body of GET /v1/images.
type ImageList struct {
	Images []Image `json:"images"`
}

// PullRequest is the body of POST /v1/images/pull. The answer is a stream of
// newline-delimited PullProgress objects; the last has Done or Error set.
type PullRequest struct {
	Ref      string `json:"ref"`
	Insecure bool   `json:"insecure,omitempty"` // allow plain HTTP registries
}

// PullProgress reports progress of a pull or import.
type PullProgress struct {
	Status     string `json:"status,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
	DoneBytes  int64  `json:"done_bytes,omitempty"`
	Image      *Image `json:"image,omitempty"` // set on the last message of a successful pull
	Error      string `json:"error,omitempty"`
	Code       string `json:"code,omitempty"`
}

// Info is the body of GET /v1/info.
type Info struct {
	Version       string       `json:"version"`
	DefaultEngine string       `json:"default_engine"`
	Engines       []EngineInfo `json:"engines"`
	StateDir      string       `json:"state_dir"`
	// Network is the daemon's sandbox network; absent until the first
	// sandbox with a network (or an earlier run's) made the daemon set it
	// up. Reason says why it is unavailable (then only policy "none" works).
	Network *NetworkInfo `json:"network,omitempty"`
}

// NetworkInfo describes the daemon's sandbox network.
type NetworkInfo struct {
	Bridge  string `json:"bridge"`           // host bridge of the sandboxes' outer addresses
	Address string `json:"address"`          // the bridge's address
	Subnet  string `json:"subnet"`           // outer (host-facing) addresses
	Inner   string `json:"inner"`            // in-sandbox addresses
	Reason  string `json:"reason,omitempty"` // why networking is unavailable
}

// EngineInfo describes one engine of the node.
type EngineInfo struct {
	Name      string   `json:"name"`
	Available bool     `json:"available"`
	Reason    string   `json:"reason,omitempty"` // why it is unavailable, or how it was configured
	Version   string   `json:"version,omitempty"`
	Features  []string `json:"features,omitempty"` // "fork", "snapshot", ...
}

// PruneResult is the answer of POST /v1/system/prune.
type PruneResult struct {
	Sandboxes []string `json:"sandboxes"`
	LatencyNS int64    `json:"latency_ns"`
}
