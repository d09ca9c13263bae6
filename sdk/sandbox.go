package sdk

import (
	"context"
	"net/http"
	"net/url"

	v1 "github.com/k7-dev/k7/api/v1"
)

// CreateSandbox creates and starts a sandbox. It returns once the sandbox
// runs; the sandbox outlives ctx and is removed only by DeleteSandbox.
// Errors: ErrInvalidArgument (bad request, unknown engine), ErrNotFound (the
// image is not in the image store), ErrAlreadyExists (name taken),
// ErrResourceExhausted, ErrUnavailable (engine unavailable),
// ErrDaemonUnavailable.
func (c *Client) CreateSandbox(ctx context.Context, req v1.CreateSandboxRequest) (*v1.Sandbox, error) {
	var sb v1.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListSandboxes returns every sandbox of the node, in every state.
// Errors: ErrDaemonUnavailable, ErrUnauthorized.
func (c *Client) ListSandboxes(ctx context.Context) ([]v1.Sandbox, error) {
	var l v1.SandboxList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Sandboxes, nil
}

// GetSandbox returns one sandbox, by ID or name, with its current stats.
// Errors: ErrNotFound, ErrDaemonUnavailable.
func (c *Client) GetSandbox(ctx context.Context, idOrName string) (*v1.Sandbox, error) {
	var sb v1.Sandbox
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes/"+pathID(idOrName), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// PauseSandbox freezes a running sandbox in place.
// Errors: ErrNotFound, ErrFailedPrecondition (not running), ErrConflict
// (another operation is in progress), ErrDaemonUnavailable.
func (c *Client) PauseSandbox(ctx context.Context, id string) (*v1.OpResult, error) {
	return c.op(ctx, http.MethodPost, "/v1/sandboxes/"+pathID(id)+"/pause", nil)
}

// ResumeSandbox resumes a paused sandbox.
// Errors: ErrNotFound, ErrFailedPrecondition (not paused), ErrConflict,
// ErrDaemonUnavailable.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (*v1.OpResult, error) {
	return c.op(ctx, http.MethodPost, "/v1/sandboxes/"+pathID(id)+"/resume", nil)
}

// DeleteSandbox stops and removes a sandbox in any state. With force, the
// daemon also removes it when the engine fails to stop it cleanly.
// Errors: ErrNotFound, ErrConflict, ErrUnavailable (the engine failed and
// force was not set), ErrDaemonUnavailable.
func (c *Client) DeleteSandbox(ctx context.Context, id string, force bool) (*v1.OpResult, error) {
	var q url.Values
	if force {
		q = url.Values{"force": {"1"}}
	}
	return c.op(ctx, http.MethodDelete, "/v1/sandboxes/"+pathID(id), q)
}

func (c *Client) op(ctx context.Context, method, path string, q url.Values) (*v1.OpResult, error) {
	var r v1.OpResult
	if err := c.doJSON(ctx, method, path, q, nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
