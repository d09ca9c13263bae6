package proto

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// Type is a frame's type. Values are wire format and never change.
type Type uint8

// Frame types. "c→a" frames go from the client (daemon) to the agent, "a→c"
// back. Every request opens a channel: the client picks a fresh channel id,
// and every frame about that request carries it. Channel 0 is unused.
const (
	THello     Type = 1  // c→a Hello (JSON)
	THelloAck  Type = 2  // a→c HelloAck (JSON)
	TPing      Type = 3  // c→a empty
	TPong      Type = 4  // a→c empty
	TResult    Type = 5  // a→c Result (JSON): the end of Configure, PutFile, GetFile, or a failed Exec
	TConfigure Type = 6  // c→a Configure (JSON)
	TExec      Type = 7  // c→a Exec (JSON)
	TStarted   Type = 8  // a→c Started (JSON)
	TStdin     Type = 9  // c→a raw bytes for the command's stdin
	TStdinEOF  Type = 10 // c→a empty: close the command's stdin
	TStdout    Type = 11 // a→c raw bytes (TTY output too)
	TStderr    Type = 12 // a→c raw bytes
	TExit      Type = 13 // a→c Exit (JSON); no frame follows on the channel
	TSignal    Type = 14 // c→a Signal (JSON)
	TResize    Type = 15 // c→a Resize (JSON)
	TWindow    Type = 16 // both: 4-byte big-endian credit, see Window
	TPutFile   Type = 17 // c→a PutFile (JSON), then TData frames, then TEnd
	TGetFile   Type = 18 // c→a GetFile (JSON); the agent answers TData frames, then TResult
	TData      Type = 19 // both: raw file bytes
	TEnd       Type = 20 // c→a empty: end of a PutFile's data
	TCancel    Type = 21 // c→a empty: the client abandons the channel
)

var typeNames = map[Type]string{
	THello: "Hello", THelloAck: "HelloAck", TPing: "Ping", TPong: "Pong",
	TResult: "Result", TConfigure: "Configure", TExec: "Exec", TStarted: "Started",
	TStdin: "Stdin", TStdinEOF: "StdinEOF", TStdout: "Stdout", TStderr: "Stderr",
	TExit: "Exit", TSignal: "Signal", TResize: "Resize", TWindow: "Window",
	TPutFile: "PutFile", TGetFile: "GetFile", TData: "Data", TEnd: "End", TCancel: "Cancel",
}

func (t Type) String() string {
	if s, ok := typeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Flow control. A sender of a byte stream (stdout, stderr, stdin, file data
// of GetFile) may have at most Window bytes sent but not yet credited; the
// receiver sends a TWindow frame with the number of bytes it has consumed.
// PutFile data is not flow controlled: the agent writes it to disk as it
// reads it.
const (
	Window    = 256 << 10 // bytes of initial credit per stream
	ChunkSize = 32 << 10  // bytes of stream data per frame
)

// Hello starts a session epoch. The agent answers every Hello with a
// HelloAck carrying the same nonce; a Hello whose nonce differs from the
// current epoch's starts a new epoch, which drops the previous client's
// channels (their commands keep running, their output is discarded).
type Hello struct {
	Nonce           uint64 `json:"nonce"`
	ProtocolVersion int    `json:"protocol_version"`
}

// HelloAck answers Hello.
type HelloAck struct {
	Nonce           uint64 `json:"nonce"`
	ProtocolVersion int    `json:"protocol_version"`
	AgentVersion    string `json:"agent_version"`
	PID             int    `json:"pid"`
}

// Result ends a request. Error is empty on success; Code is an errdefs wire
// code ("not_found", "invalid_argument", ...) or "internal". ExitCode is set
// for a command that could not start (127 not found, 126 otherwise).
type Result struct {
	Error    string `json:"error,omitempty"`
	Code     string `json:"code,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
}

// Configure sets sandbox-wide settings.
type Configure struct {
	Hostname string `json:"hostname,omitempty"`
	// TimeUnixNano is the daemon's wall clock. A VM restored from a capture
	// wakes with the capture's clock; the agent steps its clock when it is
	// off by more than a second (where the kernel allows it).
	TimeUnixNano int64 `json:"time_unix_nano,omitempty"`
}

// Exec starts a command.
type Exec struct {
	Args      []string `json:"args"`
	Env       []string `json:"env,omitempty"`
	Cwd       string   `json:"cwd,omitempty"`
	User      string   `json:"user,omitempty"`
	TTY       bool     `json:"tty,omitempty"`
	Rows      uint16   `json:"rows,omitempty"`
	Cols      uint16   `json:"cols,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"`
	Detach    bool     `json:"detach,omitempty"`
	TimeoutNS int64    `json:"timeout_ns,omitempty"`
}

// Started answers a successful Exec.
type Started struct {
	PID int `json:"pid"`
}

// Exit is a command's end; all of its output frames precede it.
type Exit struct {
	Code     int  `json:"code"`
	TimedOut bool `json:"timed_out,omitempty"`
}

// Signal sends a signal to a command's process group.
type Signal struct {
	Signal int `json:"signal"`
}

// Resize changes a TTY command's terminal size.
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// PutFile opens a file for writing; Mode holds permission bits.
type PutFile struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
}

// GetFile asks for a file's content.
type GetFile struct {
	Path string `json:"path"`
}

// JSON returns a frame carrying v as JSON. It panics if v cannot be
// marshaled, which is a programming error for the types above.
func JSON(t Type, ch uint32, v any) Frame {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("proto: marshaling %T: %v", v, err))
	}
	return Frame{Type: t, Channel: ch, Payload: b}
}

// Unmarshal decodes f's JSON payload into v.
func (f Frame) Unmarshal(v any) error {
	if err := json.Unmarshal(f.Payload, v); err != nil {
		return fmt.Errorf("decoding %v payload: %w", f.Type, err)
	}
	return nil
}

// WindowFrame returns a TWindow frame granting n bytes of credit.
func WindowFrame(ch uint32, n int) Frame {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, uint32(n))
	return Frame{Type: TWindow, Channel: ch, Payload: b}
}

// Credit returns the credit of a TWindow frame, 0 if malformed.
func (f Frame) Credit() int {
	if len(f.Payload) != 4 {
		return 0
	}
	return int(binary.BigEndian.Uint32(f.Payload))
}
