package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	v1 "github.com/k7-dev/k7/api/v1"
)

// Sentinel errors. Errors returned by Client methods match at most one of
// them with errors.Is; the error's message is the daemon's own.
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrConflict           = errors.New("conflict")
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnauthorized       = errors.New("unauthorized")

	// ErrDaemonUnavailable means the daemon could not be reached at all
	// (socket missing, connection refused). It is distinct from
	// ErrUnavailable, which the daemon itself reports.
	ErrDaemonUnavailable = errors.New("k7d is not running")
)

var codeSentinels = map[string]error{
	v1.CodeNotFound:           ErrNotFound,
	v1.CodeAlreadyExists:      ErrAlreadyExists,
	v1.CodeInvalidArgument:    ErrInvalidArgument,
	v1.CodeFailedPrecondition: ErrFailedPrecondition,
	v1.CodeConflict:           ErrConflict,
	v1.CodeUnavailable:        ErrUnavailable,
	v1.CodeResourceExhausted:  ErrResourceExhausted,
	v1.CodeUnauthorized:       ErrUnauthorized,
}

// statusCodes guesses a code from the HTTP status when the body carries none
// (a proxy's answer, a daemon bug).
var statusCodes = map[int]string{
	http.StatusNotFound:            v1.CodeNotFound,
	http.StatusBadRequest:          v1.CodeInvalidArgument,
	http.StatusPreconditionFailed:  v1.CodeFailedPrecondition,
	http.StatusConflict:            v1.CodeConflict,
	http.StatusServiceUnavailable:  v1.CodeUnavailable,
	http.StatusTooManyRequests:     v1.CodeResourceExhausted,
	http.StatusInsufficientStorage: v1.CodeResourceExhausted,
	http.StatusUnauthorized:        v1.CodeUnauthorized,
	http.StatusForbidden:           v1.CodeUnauthorized,
}

// APIError is an error reported by the daemon. It matches the sentinel of
// its Code with errors.Is.
type APIError struct {
	Status  int    // HTTP status; 0 when the error came inside a stream
	Code    string // wire code, v1.Code*
	Message string // the daemon's message
}

func (e *APIError) Error() string { return e.Message }

// Is reports whether target is the sentinel of e's code.
func (e *APIError) Is(target error) bool {
	s, ok := codeSentinels[e.Code]
	return ok && s == target
}

// newAPIError builds an APIError from a wire code and message.
func newAPIError(status int, code, msg string) *APIError {
	if code == "" {
		code = statusCodes[status]
		if code == "" {
			code = v1.CodeInternal
		}
	}
	if msg == "" {
		if status != 0 {
			msg = fmt.Sprintf("%s (HTTP %d)", strings.ReplaceAll(code, "_", " "), status)
		} else {
			msg = strings.ReplaceAll(code, "_", " ")
		}
	}
	return &APIError{Status: status, Code: code, Message: msg}
}

// errorFromResponse reads a non-2xx answer into an *APIError.
func errorFromResponse(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e v1.Error
	if json.Unmarshal(b, &e) == nil && (e.Error != "" || e.Code != "") {
		return newAPIError(resp.StatusCode, e.Code, e.Error)
	}
	return newAPIError(resp.StatusCode, "", strings.TrimSpace(string(b)))
}

// daemonUnavailableError is returned when the daemon cannot be dialed.
type daemonUnavailableError struct {
	host  string
	cause error
}

func (e *daemonUnavailableError) Error() string {
	return fmt.Sprintf("k7d is not running at %s (dial: %s)", e.host, dialReason(e.cause))
}

func (e *daemonUnavailableError) Is(target error) bool { return target == ErrDaemonUnavailable }
func (e *daemonUnavailableError) Unwrap() error        { return e.cause }

// dialReason is the shortest true description of a dial error.
func dialReason(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	return err.Error()
}

// isDialError reports whether err happened while connecting, so that the
// request never reached the daemon.
func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// transportError classifies an error from the HTTP round trip.
func (c *Client) transportError(err error) error {
	if isDialError(err) {
		return &daemonUnavailableError{host: c.host, cause: err}
	}
	return err
}
