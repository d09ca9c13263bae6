package sdk

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	v1 "github.com/k7-dev/k7/api/v1"
)

// ListImages returns the images of the node's image store.
// Errors: ErrDaemonUnavailable, ErrUnauthorized.
func (c *Client) ListImages(ctx context.Context) ([]v1.Image, error) {
	var l v1.ImageList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/images", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Images, nil
}

// GetImage returns one image by reference or ID.
// Errors: ErrNotFound, ErrInvalidArgument (bad reference), ErrDaemonUnavailable.
func (c *Client) GetImage(ctx context.Context, ref string) (*v1.Image, error) {
	var img v1.Image
	if err := c.doJSON(ctx, http.MethodGet, "/v1/images/"+pathID(ref), nil, nil, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// RemoveImage removes an image (by reference or ID) from the store.
// Errors: ErrNotFound, ErrFailedPrecondition (a sandbox uses it),
// ErrDaemonUnavailable.
func (c *Client) RemoveImage(ctx context.Context, ref string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/images/"+pathID(ref), nil, nil, nil)
}

// PullImage pulls an image from a registry into the node's store. progress,
// when non-nil, is called from the calling goroutine with every progress
// report, the last one included. Cancelling ctx abandons the pull.
// Errors: ErrNotFound (no such image), ErrInvalidArgument (bad reference),
// ErrUnauthorized (registry refused), ErrUnavailable (registry unreachable),
// ErrResourceExhausted (disk full), ErrDaemonUnavailable.
func (c *Client) PullImage(ctx context.Context, req v1.PullRequest, progress func(v1.PullProgress)) (*v1.Image, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.stream(ctx, http.MethodPost, "/v1/images/pull", nil, bytesReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readProgress(resp.Body, progress)
}

// ImportImage imports an image from an archive (a tar of an OCI image
// layout, or a rootfs tarball) read from r and names it name. progress
// works as in PullImage.
// Errors: ErrInvalidArgument (not an image archive, bad name),
// ErrAlreadyExists, ErrResourceExhausted, ErrDaemonUnavailable.
func (c *Client) ImportImage(ctx context.Context, name string, r io.Reader, progress func(v1.PullProgress)) (*v1.Image, error) {
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
	}
	resp, err := c.stream(ctx, http.MethodPost, "/v1/images/import", q, r, "application/x-tar")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readProgress(resp.Body, progress)
}

// errNoResult is returned when a progress stream ends without its final
// message (the daemon died or the connection broke).
var errNoResult = errors.New("progress stream ended without a result")

// readProgress decodes a stream of newline-delimited PullProgress.
func readProgress(r io.Reader, progress func(v1.PullProgress)) (*v1.Image, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var p v1.PullProgress
		if err := json.Unmarshal(line, &p); err != nil {
			return nil, fmt.Errorf("decoding progress: %w", err)
		}
		if progress != nil {
			progress(p)
		}
		if p.Error != "" || p.Code != "" {
			return nil, newAPIError(0, p.Code, p.Error)
		}
		if p.Image != nil {
			return p.Image, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading progress: %w", err)
	}
	return nil, errNoResult
}
