package sdk

import (
	"context"
	"io"
	"net/http"
	"strings"

	v1 "github.com/k7-dev/k7/api/v1"
)

// Health checks GET /healthz. It returns nil when the daemon answers "ok",
// an error matching ErrDaemonUnavailable when it cannot be reached.
func (c *Client) Health(ctx context.Context) error {
	resp, err := c.stream(ctx, http.MethodGet, "/healthz", nil, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if s := strings.TrimSpace(string(b)); s != "ok" {
		return newAPIError(resp.StatusCode, v1.CodeUnavailable, "k7d is unhealthy: "+s)
	}
	return nil
}

// Info returns the daemon's version and engines.
// Errors: ErrDaemonUnavailable, ErrUnauthorized.
func (c *Client) Info(ctx context.Context) (*v1.Info, error) {
	var info v1.Info
	if err := c.doJSON(ctx, http.MethodGet, "/v1/info", nil, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Prune removes the sandboxes that no longer run (stopped, dead) and
// returns their IDs.
// Errors: ErrDaemonUnavailable, ErrUnauthorized, ErrUnavailable.
func (c *Client) Prune(ctx context.Context) (*v1.PruneResult, error) {
	var r v1.PruneResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/system/prune", nil, nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
