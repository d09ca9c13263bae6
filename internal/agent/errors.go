package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/k7-dev/k7/internal/agent/proto"
	"github.com/k7-dev/k7/internal/errdefs"
)

// startError is a command that could not start; code is the exit code a
// shell would report (127 not found, 126 otherwise).
type startError struct {
	code int
	msg  string
}

func (e *startError) Error() string { return e.msg }

func startErrorf(code int, format string, args ...any) *startError {
	return &startError{code: code, msg: fmt.Sprintf(format, args...)}
}

func invalid(err error) error { return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err) }

// classify wraps file system errors in their errdefs class.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrInvalidArgument):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EINVAL):
		return invalid(err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	return err
}

// resultOf is the wire form of err.
func resultOf(err error) proto.Result {
	if err == nil {
		return proto.Result{}
	}
	var se *startError
	if errors.As(err, &se) {
		return proto.Result{Error: se.msg, Code: "start", ExitCode: se.code}
	}
	code, _ := errdefs.Code(err)
	return proto.Result{Error: err.Error(), Code: code}
}
