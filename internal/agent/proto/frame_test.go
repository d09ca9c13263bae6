package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

func enc(t testing.TB, f Frame) []byte {
	t.Helper()
	b, err := AppendFrame(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	for _, f := range []Frame{
		{Type: TPing, Channel: 0},
		{Type: TStdout, Channel: 7, Payload: []byte("hello")},
		{Type: TData, Channel: 1<<32 - 1, Payload: bytes.Repeat([]byte{'K', '7', 1}, 1000)},
		{Type: TData, Channel: 3, Payload: make([]byte, MaxPayload)},
	} {
		b := enc(t, f)
		got, n, err := Decode(b)
		if err != nil || n != len(b) {
			t.Fatalf("Decode(%v) = n %d, err %v; want n %d", f, n, err, len(b))
		}
		if got.Type != f.Type || got.Channel != f.Channel || !bytes.Equal(got.Payload, f.Payload) {
			t.Errorf("Decode = %v, want %v", got, f)
		}
		if _, _, err := Decode(b[:len(b)-1]); !errors.Is(err, ErrShort) {
			t.Errorf("Decode(truncated %v) err = %v, want ErrShort", f, err)
		}
	}
	if _, err := AppendFrame(nil, Frame{Payload: make([]byte, MaxPayload+1)}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("AppendFrame(oversized) err = %v, want ErrCorrupt", err)
	}
}

// chunkReader returns at most n bytes per Read, like a pipe read in pieces.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.n {
		p = p[:c.n]
	}
	return c.r.Read(p)
}

func TestReaderResync(t *testing.T) {
	a := Frame{Type: THello, Channel: 0, Payload: []byte(`{"nonce":1}`)}
	b := Frame{Type: TStdout, Channel: 9, Payload: []byte("payload K7 with magic")}
	badCRC := enc(t, b)
	badCRC[len(badCRC)-1] ^= 0xff
	hugeLen := enc(t, a)
	binary.BigEndian.PutUint32(hugeLen[8:], MaxPayload+1)
	badVersion := enc(t, a)
	badVersion[2] = 9
	for _, tc := range []struct {
		name    string
		stream  []byte
		want    []Frame
		skipped bool
	}{
		{"clean", append(enc(t, a), enc(t, b)...), []Frame{a, b}, false},
		{"garbage before", append([]byte("garbage\x00\x01K"), enc(t, a)...), []Frame{a}, true},
		{"lone magic", append([]byte("K7K7K"), enc(t, b)...), []Frame{b}, true},
		{"bad crc", append(badCRC, enc(t, a)...), []Frame{a}, true},
		{"huge length", append(hugeLen, enc(t, b)...), []Frame{b}, true},
		{"bad version", append(badVersion, enc(t, b)...), []Frame{b}, true},
		{"partial header", append(enc(t, b)[:7], enc(t, a)...), []Frame{a}, true},
		{"garbage between", append(append(enc(t, a), 0xff, 'K', 0), enc(t, b)...), []Frame{a, b}, true},
	} {
		for _, chunk := range []int{1, 3, 1 << 16} {
			t.Run(tc.name, func(t *testing.T) {
				r := NewReader(&chunkReader{bytes.NewReader(tc.stream), chunk})
				for i, want := range tc.want {
					got, err := r.ReadFrame()
					if err != nil {
						t.Fatalf("chunk %d: frame %d: %v", chunk, i, err)
					}
					if got.Type != want.Type || got.Channel != want.Channel || !bytes.Equal(got.Payload, want.Payload) {
						t.Fatalf("chunk %d: frame %d = %v, want %v", chunk, i, got, want)
					}
				}
				if _, err := r.ReadFrame(); !errors.Is(err, io.EOF) {
					t.Errorf("chunk %d: after frames err = %v, want EOF", chunk, err)
				}
				if got := r.Skipped() > 0; got != tc.skipped {
					t.Errorf("chunk %d: skipped %d bytes, want skipping %v", chunk, r.Skipped(), tc.skipped)
				}
			})
		}
	}
}

// A header whose promised payload never comes (its writer died) is
// abandoned after ResyncAfter once a complete frame follows.
func TestReaderStaleHeader(t *testing.T) {
	stale := enc(t, Frame{Type: TData, Channel: 1, Payload: make([]byte, 500000)})[:HeaderSize+100]
	hello := Frame{Type: THello, Payload: []byte(`{"nonce":42}`)}
	pr, pw := io.Pipe()
	r := NewReader(pr)
	var now atomic.Int64 // fake clock, in ns
	now.Store(time.Unix(1000, 0).UnixNano())
	r.now = func() time.Time { return time.Unix(0, now.Load()) }
	go func() {
		_, _ = pw.Write(stale)
		for i := 0; i < 3; i++ {
			_, _ = pw.Write(enc(t, hello))
			now.Add(int64(ResyncAfter / 2)) // the fake clock moves between writes
		}
		_ = pw.Close()
	}()
	got, err := r.ReadFrame()
	if err != nil {
		t.Fatalf("ReadFrame: %v", err)
	}
	if got.Type != THello || !bytes.Equal(got.Payload, hello.Payload) {
		t.Errorf("ReadFrame = %v, want the hello after the stale header", got)
	}
}

func TestCreditAndQueue(t *testing.T) {
	c := NewCredit(10)
	if n, ok := c.Take(nil, 4); n != 4 || !ok {
		t.Fatalf("Take(4) = %d, %v; want 4, true", n, ok)
	}
	if n, _ := c.Take(nil, 100); n != 6 {
		t.Fatalf("Take(100) = %d, want the remaining 6", n)
	}
	done := make(chan struct{})
	close(done)
	if n, ok := c.Take(done, 1); ok {
		t.Fatalf("Take on empty window with done = %d, %v; want false", n, ok)
	}
	go c.Add(5)
	if n, ok := c.Take(nil, 100); n != 5 || !ok {
		t.Fatalf("Take after Add(5) = %d, %v", n, ok)
	}
	c.Close()
	if _, ok := c.Take(nil, 1); ok {
		t.Fatal("Take after Close succeeded")
	}

	q := NewQueue[int]()
	for i := range 5 {
		q.Push(i)
	}
	q.Close()
	if q.Push(9) {
		t.Error("Push after Close succeeded")
	}
	for i := range 5 {
		if v, ok := q.Pop(nil); v != i || !ok {
			t.Fatalf("Pop = %d, %v; want %d, true", v, ok, i)
		}
	}
	if _, ok := q.Pop(nil); ok {
		t.Fatal("Pop on closed empty queue succeeded")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(enc(f, Frame{Type: THello, Payload: []byte(`{"nonce":1}`)}))
	f.Add(append([]byte("junkK7"), enc(f, Frame{Type: TStdout, Channel: 3, Payload: []byte("x")})...))
	f.Add([]byte{Magic0, Magic1, Version, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, n, err := Decode(b)
		if err == nil {
			if n < HeaderSize || n > len(b) {
				t.Fatalf("Decode used %d of %d bytes", n, len(b))
			}
			re := enc(t, fr)
			if !bytes.Equal(re, b[:n]) {
				t.Fatalf("re-encoding differs: %x vs %x", re, b[:n])
			}
		} else if !errors.Is(err, ErrShort) && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Decode err = %v", err)
		}
		// The stream reader never panics, and every frame it yields is valid.
		r := NewReader(bytes.NewReader(b))
		for {
			fr, err := r.ReadFrame()
			if err != nil {
				break
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("frame over MaxPayload")
			}
		}
	})
}
