// Package proto is the k7-agent wire protocol: frames, their types and the
// JSON messages some of them carry.
//
// A frame is a 16-byte header followed by its payload; all integers are big
// endian:
//
//	offset size field
//	0      2    magic "K7" (0x4B 0x37)
//	2      1    frame format version (Version, 1)
//	3      1    type (Type)
//	4      4    channel id
//	8      4    payload length (at most MaxPayload)
//	12     4    CRC-32 (IEEE) of the payload
//	16     n    payload
//
// The transport (named FIFOs that outlive the daemon, a virtio-serial port)
// may hold partial frames left by a peer that died mid-write. Reader
// therefore resynchronizes: on a bad magic, version, length or checksum it
// skips one byte and scans for the next magic.
package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"time"
)

// Frame format constants.
const (
	Magic0     = 'K'
	Magic1     = '7'
	Version    = 1       // frame format and protocol version
	HeaderSize = 16      // bytes
	MaxPayload = 1 << 20 // bytes
)

// Frame is one decoded frame. Payload is owned by the frame.
type Frame struct {
	Type    Type
	Channel uint32
	Payload []byte
}

func (f Frame) String() string {
	return fmt.Sprintf("%v ch=%d len=%d", f.Type, f.Channel, len(f.Payload))
}

// Errors returned by Decode.
var (
	ErrShort   = errors.New("short frame")
	ErrCorrupt = errors.New("corrupt frame")
)

// AppendFrame appends the encoding of f to b. It returns ErrCorrupt wrapped
// when the payload is larger than MaxPayload.
func AppendFrame(b []byte, f Frame) ([]byte, error) {
	if len(f.Payload) > MaxPayload {
		return b, fmt.Errorf("encoding %v: payload of %d bytes over %d: %w", f.Type, len(f.Payload), MaxPayload, ErrCorrupt)
	}
	var h [HeaderSize]byte
	h[0], h[1], h[2], h[3] = Magic0, Magic1, Version, byte(f.Type)
	binary.BigEndian.PutUint32(h[4:], f.Channel)
	binary.BigEndian.PutUint32(h[8:], uint32(len(f.Payload)))
	binary.BigEndian.PutUint32(h[12:], crc32.ChecksumIEEE(f.Payload))
	b = append(b, h[:]...)
	return append(b, f.Payload...), nil
}

// checkHeader reports whether b (at least HeaderSize bytes) starts with a
// plausible header, and its payload length.
func checkHeader(b []byte) (n int, ok bool) {
	if b[0] != Magic0 || b[1] != Magic1 || b[2] != Version {
		return 0, false
	}
	l := binary.BigEndian.Uint32(b[8:])
	if l > MaxPayload {
		return 0, false
	}
	return int(l), true
}

// Decode decodes the frame at the start of b. It returns the frame and the
// number of bytes it used, ErrShort when b holds only a prefix of a valid
// frame, or ErrCorrupt when b does not start with a valid frame. The
// payload is copied.
func Decode(b []byte) (Frame, int, error) {
	if len(b) < HeaderSize {
		if len(b) > 0 && b[0] != Magic0 || len(b) > 1 && b[1] != Magic1 || len(b) > 2 && b[2] != Version {
			return Frame{}, 0, ErrCorrupt
		}
		return Frame{}, 0, ErrShort
	}
	n, ok := checkHeader(b)
	if !ok {
		return Frame{}, 0, ErrCorrupt
	}
	if len(b) < HeaderSize+n {
		return Frame{}, 0, ErrShort
	}
	p := b[HeaderSize : HeaderSize+n]
	if crc32.ChecksumIEEE(p) != binary.BigEndian.Uint32(b[12:]) {
		return Frame{}, 0, ErrCorrupt
	}
	return Frame{
		Type:    Type(b[3]),
		Channel: binary.BigEndian.Uint32(b[4:]),
		Payload: bytes.Clone(p),
	}, HeaderSize + n, nil
}

// ResyncAfter is how long Reader waits for the rest of a frame whose header
// it has read before it looks for a complete frame further on. A peer that
// died mid-frame leaves a header that promises bytes that never come; the
// next peer's frames then sit inside that promised payload.
const ResyncAfter = time.Second

// Reader reads frames from a byte stream, resynchronizing after garbage. It
// is not safe for concurrent use.
type Reader struct {
	r       io.Reader
	buf     []byte // unread bytes are buf[off:]
	off     int
	skipped int64
	pending time.Time // when the incomplete frame at buf[off] was first seen
	now     func() time.Time
}

// NewReader returns a Reader on r. Read errors from r are returned as they
// are; the caller decides whether to retry (EINTR, EAGAIN, EOF on a FIFO).
func NewReader(r io.Reader) *Reader {
	return &Reader{r: r, buf: make([]byte, 0, 64<<10), now: time.Now}
}

// Skipped returns how many bytes were discarded while resynchronizing.
func (r *Reader) Skipped() int64 { return r.skipped }

// ReadFrame returns the next valid frame. After an error from the
// underlying reader, calling ReadFrame again continues where it stopped: no
// buffered bytes are lost.
func (r *Reader) ReadFrame() (Frame, error) {
	for {
		f, err := r.next()
		if err == nil {
			return f, nil
		}
		// Need more bytes.
		if err := r.fill(); err != nil {
			return Frame{}, err
		}
	}
}

// next decodes a frame from the buffer, discarding garbage; it returns
// ErrShort when it needs more bytes.
func (r *Reader) next() (Frame, error) {
	for {
		b := r.buf[r.off:]
		if len(b) == 0 {
			return Frame{}, ErrShort
		}
		// Scan to the next magic.
		if i := bytes.IndexByte(b, Magic0); i != 0 {
			if i < 0 {
				i = len(b)
			}
			r.discard(i)
			continue
		}
		f, n, err := Decode(b)
		switch {
		case err == nil:
			r.off += n
			r.pending = time.Time{}
			return f, nil
		case errors.Is(err, ErrCorrupt):
			r.discard(1)
			continue
		}
		// ErrShort: a prefix of what may be a frame.
		if len(b) < HeaderSize {
			return Frame{}, ErrShort
		}
		if r.pending.IsZero() {
			r.pending = r.now()
			return Frame{}, ErrShort
		}
		if r.now().Sub(r.pending) < ResyncAfter {
			return Frame{}, ErrShort
		}
		// Stale header: if a complete valid frame starts further on, the
		// header at off was a leftover; skip to that frame.
		if j := findFrame(b[1:]); j >= 0 {
			r.discard(1 + j)
			continue
		}
		return Frame{}, ErrShort
	}
}

// findFrame returns the offset of the first complete valid frame in b, or -1.
func findFrame(b []byte) int {
	for i := 0; i < len(b); {
		j := bytes.IndexByte(b[i:], Magic0)
		if j < 0 {
			return -1
		}
		i += j
		if _, _, err := Decode(b[i:]); err == nil {
			return i
		}
		i++
	}
	return -1
}

func (r *Reader) discard(n int) {
	r.off += n
	r.skipped += int64(n)
	r.pending = time.Time{}
}

// fill reads more bytes into the buffer.
func (r *Reader) fill() error {
	if r.off > 0 {
		n := copy(r.buf, r.buf[r.off:])
		r.buf = r.buf[:n]
		r.off = 0
	}
	if cap(r.buf)-len(r.buf) < 32<<10 {
		nb := make([]byte, len(r.buf), 2*cap(r.buf)+HeaderSize)
		copy(nb, r.buf)
		r.buf = nb
	}
	n, err := r.r.Read(r.buf[len(r.buf):cap(r.buf)])
	r.buf = r.buf[:len(r.buf)+n]
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// Writer writes whole frames; it is safe for concurrent use.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// WriteFrame writes f in one piece.
func (w *Writer) WriteFrame(f Frame) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeLocked(f)
}

// Locked runs fn with the writer's lock held; fn may call write to emit
// frames. It lets a caller make a decision and write atomically with
// respect to other writers.
func (w *Writer) Locked(fn func(write func(Frame) error) error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fn(w.writeLocked)
}

func (w *Writer) writeLocked(f Frame) error {
	b, err := AppendFrame(w.buf[:0], f)
	if err != nil {
		return err
	}
	if cap(b) <= 64<<10 {
		w.buf = b
	}
	_, err = w.w.Write(b)
	return err
}
