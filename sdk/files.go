package sdk

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
)

// CopyTo writes the contents of r to the absolute path inside sandbox id,
// creating or truncating the file with the permission bits of mode.
// Errors: ErrNotFound (sandbox, or the parent directory), ErrInvalidArgument
// (relative path), ErrFailedPrecondition (sandbox not running),
// ErrDaemonUnavailable.
func (c *Client) CopyTo(ctx context.Context, id, path string, mode fs.FileMode, r io.Reader) error {
	q := url.Values{"path": {path}, "mode": {fmt.Sprintf("%04o", mode.Perm())}}
	resp, err := c.stream(ctx, http.MethodPut, "/v1/sandboxes/"+pathID(id)+"/files", q, r, "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// CopyFrom writes the contents of the file at the absolute path inside
// sandbox id to w and returns the number of bytes written.
// Errors: ErrNotFound (sandbox or file), ErrInvalidArgument,
// ErrFailedPrecondition, ErrDaemonUnavailable.
func (c *Client) CopyFrom(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	q := url.Values{"path": {path}}
	resp, err := c.stream(ctx, http.MethodGet, "/v1/sandboxes/"+pathID(id)+"/files", q, nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("copying %s from sandbox %s: %w", path, id, err)
	}
	return n, nil
}

// Logs returns the output of the sandbox's init and detached commands. With
// follow, the stream stays open until ctx is done or the sandbox stops. The
// caller closes the reader.
// Errors: ErrNotFound, ErrDaemonUnavailable.
func (c *Client) Logs(ctx context.Context, id string, follow bool) (io.ReadCloser, error) {
	var q url.Values
	if follow {
		q = url.Values{"follow": {"1"}}
	}
	resp, err := c.stream(ctx, http.MethodGet, "/v1/sandboxes/"+pathID(id)+"/logs", q, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
