// Package client is the daemon side of the k7-agent protocol.
//
// CONTRACT STUB: the signatures below are fixed; the bodies are being written.
package client

import (
	"context"
	"io"
	"time"
)

// ExecRequest mirrors api/v1.ExecRequest without the wire-only fields.
type ExecRequest struct {
	Args    []string
	Env     []string // KEY=VALUE, added to the agent's environment
	Cwd     string   // default "/"
	User    string   // name (looked up in the sandbox's /etc/passwd) or uid[:gid]; default root
	TTY     bool
	Rows    uint16
	Cols    uint16
	Stdin   bool          // the caller provides stdin (Stdio.Stdin)
	Detach  bool          // start and return; output goes to the agent's stderr (the sandbox log)
	Timeout time.Duration // 0: none; the agent kills the process group after this
}

// Stdio are the caller's ends of a command's streams. Nil writers discard.
type Stdio struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer // ignored with TTY (stderr is merged into the terminal)
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	Code     int  // exit code, or 128+signal
	TimedOut bool // killed by the agent because Timeout passed
}

// Process is a started command.
type Process interface {
	PID() int
	// Wait blocks until the command exits and all of its output has been
	// written to Stdio, or ctx ends.
	Wait(ctx context.Context) (ExitStatus, error)
	Signal(ctx context.Context, sig int) error
	Resize(ctx context.Context, rows, cols uint16) error
	// CloseStdin closes the command's stdin (EOF).
	CloseStdin() error
}

// Hello is the agent's answer to the handshake.
type Hello struct {
	ProtocolVersion int
	AgentVersion    string
	PID             int // the agent's pid inside the sandbox (1)
}

// Client speaks the protocol over one transport. It is safe for concurrent
// use; many commands may run at once.
type Client struct{}

// New starts a client over rw (usually from engine.Connect). Call
// Handshake before anything else. Close closes rw.
func New(rw io.ReadWriteCloser) *Client { panic("stub") }

// Handshake synchronizes with the agent: it discards stale bytes left in the
// transport by an earlier client and returns the agent's hello.
func (c *Client) Handshake(ctx context.Context) (*Hello, error) { panic("stub") }

// Configure sets the sandbox's host name (after a fork each child gets its own).
func (c *Client) Configure(ctx context.Context, hostname string) error { panic("stub") }

// Exec starts a command. A command that cannot be started (not found, bad
// user, bad cwd) returns an error wrapping ErrStart.
func (c *Client) Exec(ctx context.Context, req *ExecRequest, stdio Stdio) (Process, error) {
	panic("stub")
}

// PutFile writes r to path inside the sandbox with mode, creating parents.
func (c *Client) PutFile(ctx context.Context, path string, mode uint32, r io.Reader) error {
	panic("stub")
}

// GetFile streams the file at path inside the sandbox to w.
func (c *Client) GetFile(ctx context.Context, path string, w io.Writer) error { panic("stub") }

// Ping measures a protocol round trip.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) { panic("stub") }

// Done is closed when the transport ends (the sandbox died or Close was called).
func (c *Client) Done() <-chan struct{} { panic("stub") }

// Close closes the transport. Running commands keep running in the sandbox.
func (c *Client) Close() error { panic("stub") }
