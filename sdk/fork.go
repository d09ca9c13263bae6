package sdk

import (
	"context"
	"net/http"
	"net/url"

	v1 "github.com/k7-dev/k7/api/v1"
)

// ForkSandbox pauses the sandbox once, captures it with its memory, resumes
// it and starts req.Count children from the capture. The children continue
// with the parent's processes, tmpfs and writable layer.
// Errors: ErrNotFound, ErrFailedPrecondition (not running, or the engine
// cannot fork), ErrInvalidArgument, ErrResourceExhausted, ErrDaemonUnavailable.
func (c *Client) ForkSandbox(ctx context.Context, id string, req v1.ForkRequest) (*v1.ForkResult, error) {
	var r v1.ForkResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+pathID(id)+"/fork", nil, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// CreateSnapshot takes a named snapshot of a running sandbox, which keeps
// running. The snapshot outlives the sandbox and daemon restarts.
// Errors: ErrNotFound, ErrAlreadyExists (name taken), ErrInvalidArgument,
// ErrFailedPrecondition (not running, or the engine cannot snapshot).
func (c *Client) CreateSnapshot(ctx context.Context, id string, req v1.SnapshotRequest) (*v1.Snapshot, error) {
	var s v1.Snapshot
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+pathID(id)+"/snapshots", nil, req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSnapshots returns every snapshot with its size and the total.
// Errors: ErrDaemonUnavailable.
func (c *Client) ListSnapshots(ctx context.Context) (*v1.SnapshotList, error) {
	var l v1.SnapshotList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetSnapshot returns one snapshot's manifest.
// Errors: ErrNotFound, ErrDaemonUnavailable.
func (c *Client) GetSnapshot(ctx context.Context, name string) (*v1.Snapshot, error) {
	var s v1.Snapshot
	if err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+pathID(name), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot removes a snapshot.
// Errors: ErrNotFound, ErrDaemonUnavailable.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/snapshots/"+pathID(name), nil, nil, nil)
}

// RestoreSnapshot starts req.Count sandboxes from a snapshot. The snapshot's
// checksum is verified first.
// Errors: ErrNotFound, ErrFailedPrecondition (corrupted snapshot, engine
// version mismatch), ErrAlreadyExists (name taken), ErrDaemonUnavailable.
func (c *Client) RestoreSnapshot(ctx context.Context, name string, req v1.RestoreRequest) (*v1.ForkResult, error) {
	var r v1.ForkResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/snapshots/"+pathID(name)+"/restore", nil, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// PruneSnapshots removes snapshots: all of them, or those outside the
// retention given by req.
// Errors: ErrInvalidArgument, ErrDaemonUnavailable.
func (c *Client) PruneSnapshots(ctx context.Context, req v1.SnapshotPruneRequest) (*v1.SnapshotPruneResult, error) {
	var r v1.SnapshotPruneResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/snapshots/prune", nil, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Tree returns the fork tree: every lineage, or the one holding root.
// Errors: ErrNotFound, ErrDaemonUnavailable.
func (c *Client) Tree(ctx context.Context, root string) (*v1.Tree, error) {
	var q url.Values
	if root != "" {
		q = url.Values{"root": {root}}
	}
	var t v1.Tree
	if err := c.doJSON(ctx, http.MethodGet, "/v1/tree", q, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}
