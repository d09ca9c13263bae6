// Package errdefs defines the error classes shared by every k7 component.
//
// Errors are wrapped with %w and classified with errors.Is against the
// sentinels below. Translation happens at two edges only: the server maps a
// class to an HTTP status and a wire code, and the SDK maps the wire code back
// to its exported sentinels.
package errdefs

import (
	"errors"
	"net/http"

	v1 "github.com/k7-dev/k7/api/v1"
)

// The error classes. Each has a stable wire code (see Code).
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrConflict           = errors.New("conflict")
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnauthorized       = errors.New("unauthorized")
)

var classes = []struct {
	err    error
	code   string
	status int
}{
	{ErrNotFound, v1.CodeNotFound, http.StatusNotFound},
	{ErrAlreadyExists, v1.CodeAlreadyExists, http.StatusConflict},
	{ErrInvalidArgument, v1.CodeInvalidArgument, http.StatusBadRequest},
	{ErrFailedPrecondition, v1.CodeFailedPrecondition, http.StatusPreconditionFailed},
	{ErrConflict, v1.CodeConflict, http.StatusConflict},
	{ErrUnavailable, v1.CodeUnavailable, http.StatusServiceUnavailable},
	{ErrResourceExhausted, v1.CodeResourceExhausted, http.StatusInsufficientStorage},
	{ErrUnauthorized, v1.CodeUnauthorized, http.StatusUnauthorized},
}

// Code returns the wire code (api/v1's Code* constants) and HTTP status
// for err; unknown errors are "internal" with status 500.
func Code(err error) (code string, status int) {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.code, c.status
		}
	}
	return v1.CodeInternal, http.StatusInternalServerError
}

// FromCode returns the sentinel for a wire code, or nil for an unknown code.
func FromCode(code string) error {
	for _, c := range classes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}
