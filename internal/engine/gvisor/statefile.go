package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/k7-dev/k7/internal/errdefs"
)

// runsc keeps one JSON state file per container under its root, named
// "<container>_sandbox:<sandbox>.state" (gvisor runsc/container,
// state_file.go, buildPath). Every k7 container is the root container of
// its own sandbox, so both IDs are the container ID. Reading that file
// answers Status without starting a runsc process (≈40 ms of CPU each, and
// the daemon asks for every sandbox every few seconds).
//
// runsc rewrites the file in place (truncate, then write) under its own
// lock, which the reader does not take: a file that does not decode is
// left to "runsc state".

// stateFilePath is the path of runsc's state file of container cid.
func (e *Engine) stateFilePath(cid string) string {
	return filepath.Join(e.runscRoot, cid+"_sandbox:"+cid+".state")
}

// runscStateFile is the part of runsc's container state file the engine
// reads (runsc/container.Container).
type runscStateFile struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Sandbox *struct {
		ID  string `json:"id"`
		PID int    `json:"pid"`
	} `json:"sandbox"`
}

// quickState reads container cid's state from runsc's state file. ok is
// false when only "runsc state" can tell: the file does not decode, or it
// says created/creating, or running while the sandbox process is gone
// (runsc then asks the sandbox and may correct the status to stopped). An
// unknown container is errdefs.ErrNotFound, as with "runsc state".
func (e *Engine) quickState(cid string) (st *runscState, ok bool, err error) {
	b, err := os.ReadFile(e.stateFilePath(cid))
	if err != nil {
		if isNotExist(err) {
			return nil, true, fmt.Errorf("runsc has no container %q: %w", cid, errdefs.ErrNotFound)
		}
		return nil, false, nil
	}
	var f runscStateFile
	if err := json.Unmarshal(b, &f); err != nil || f.ID != cid || f.Sandbox == nil {
		return nil, false, nil //nolint:nilerr // a file that does not decode is not an error: "runsc state" decides
	}
	st = &runscState{ID: f.ID, Status: f.Status, PID: f.Sandbox.PID}
	switch st.Status {
	case "running", "paused":
		return st, pidAlive(st.PID), nil
	case "stopped":
		return st, true, nil
	}
	return nil, false, nil
}

// createdPID returns the sandbox process of container cid, just made by
// "runsc create", from runsc's state file (written before the command
// returns), or from "runsc state" when the file does not tell.
func (e *Engine) createdPID(ctx context.Context, cid string) (int, error) {
	if b, err := os.ReadFile(e.stateFilePath(cid)); err == nil {
		var f runscStateFile
		if json.Unmarshal(b, &f) == nil && f.ID == cid && f.Sandbox != nil && f.Sandbox.PID > 0 {
			return f.Sandbox.PID, nil
		}
	}
	st, err := e.state(ctx, cid)
	if err != nil {
		return 0, err
	}
	return st.PID, nil
}
