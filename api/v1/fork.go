package v1

import "time"

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count int    `json:"count,omitempty"` // number of children, default 1
	Name  string `json:"name,omitempty"`  // name prefix; children are PREFIX-1, PREFIX-2, ...
	// Ports are published for every child (the parent's host ports are its
	// own); HostPort must be 0 when Count > 1. Default: the parent's ports
	// on free host ports.
	Ports []Port `json:"ports,omitempty"`
}

// ForkResult is the answer of a fork or a restore.
type ForkResult struct {
	Source string `json:"source"` // sandbox or snapshot the children come from
	// SourcePauseNS is how long the source sandbox was paused (0 for a restore).
	SourcePauseNS int64       `json:"source_pause_ns"`
	Children      []ForkChild `json:"children"`
	LatencyNS     int64       `json:"latency_ns"`
}

// ForkChild is one sandbox started by a fork or restore.
type ForkChild struct {
	Sandbox Sandbox `json:"sandbox"`
	// ReadyNS is the time from the start of the fork until the child's
	// agent answered its first request.
	ReadyNS int64 `json:"ready_ns"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Name string `json:"name"`
}

// Snapshot is a named capture of a sandbox: memory, processes and writable
// layer. It outlives its sandbox and the daemon's restarts.
type Snapshot struct {
	Name          string    `json:"name"`
	Sandbox       string    `json:"sandbox"`      // ID of the sandbox it was taken from
	SandboxName   string    `json:"sandbox_name"` // its name then
	Parent        string    `json:"parent"`       // the sandbox's own parent, for lineage
	Engine        string    `json:"engine"`
	EngineVersion string    `json:"engine_version"`
	Image         string    `json:"image"`
	ImageID       string    `json:"image_id"`
	Env           []string  `json:"env,omitempty"`
	Resources     Resources `json:"resources"`
	Created       time.Time `json:"created"`
	SizeBytes     int64     `json:"size_bytes"`
	Checksum      string    `json:"checksum"` // over the capture's files: "sha256-chunked:<hex>" (older snapshots: "sha256:<hex>")
	SourcePauseNS int64     `json:"source_pause_ns"`
	// Network and Ports are the sandbox's at capture time: a restore gets
	// the same policy and in-sandbox address, and the ports on free host
	// ports.
	Network   *Network `json:"network,omitempty"`
	Ports     []Port   `json:"ports,omitempty"`
	LatencyNS int64    `json:"latency_ns,omitempty"`
}

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
	// TotalBytes is the disk used by all snapshots.
	TotalBytes int64 `json:"total_bytes"`
}

// RestoreRequest is the body of POST /v1/snapshots/{name}/restore.
type RestoreRequest struct {
	Count int    `json:"count,omitempty"` // default 1
	Name  string `json:"name,omitempty"`  // name (Count 1) or prefix
}

// SnapshotPruneRequest is the body of POST /v1/snapshots/prune. With no
// field set every snapshot is removed.
type SnapshotPruneRequest struct {
	KeepLast    int   `json:"keep_last,omitempty"`     // keep the N newest
	OlderThanNS int64 `json:"older_than_ns,omitempty"` // remove only those older than this
}

// SnapshotPruneResult lists what a prune removed.
type SnapshotPruneResult struct {
	Removed    []string `json:"removed"`
	FreedBytes int64    `json:"freed_bytes"`
	LatencyNS  int64    `json:"latency_ns"`
}

// TreeNode is one node of the fork tree (GET /v1/tree?root=ID).
type TreeNode struct {
	Kind     string     `json:"kind"` // "sandbox" or "snapshot"
	ID       string     `json:"id"`   // sandbox ID or snapshot name
	Name     string     `json:"name,omitempty"`
	State    string     `json:"state,omitempty"` // sandboxes: state; deleted ones "deleted"
	Children []TreeNode `json:"children,omitempty"`
}

// Tree is the body of GET /v1/tree.
type Tree struct {
	Roots []TreeNode `json:"roots"`
}
