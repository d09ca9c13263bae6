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
	{ErrNotFound, "not_found", http.StatusNotFound},
	{ErrAlreadyExists, "already_exists", http.StatusConflict},
	{ErrInvalidArgument, "invalid_argument", http.StatusBadRequest},
	{ErrFailedPrecondition, "failed_precondition", http.StatusPreconditionFailed},
	{ErrConflict, "conflict", http.StatusConflict},
	{ErrUnavailable, "unavailable", http.StatusServiceUnavailable},
	{ErrResourceExhausted, "resource_exhausted", http.StatusInsufficientStorage},
	{ErrUnauthorized, "unauthorized", http.StatusUnauthorized},
}

// Code returns the wire code and HTTP status for err; unknown errors are
// "internal" with status 500.
func Code(err error) (code string, status int) {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.code, c.status
		}
	}
	return "internal", http.StatusInternalServerError
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
