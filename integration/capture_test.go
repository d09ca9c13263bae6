package integration

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// capture records every frame that passes one interface of one network
// namespace, in both directions, through an AF_PACKET socket. It is the
// test's tcpdump. stop ends it (t.Cleanup also does); the frames are read
// after stop. It is safe for concurrent use.
type capture struct {
	label string
	fd    int

	mu      sync.Mutex
	frames  [][]byte
	readErr error

	stopping atomic.Bool
	done     chan struct{}
	stopOnce sync.Once
	drops    uint32 // frames the kernel dropped for want of buffer; set by stop
}

// openCapture starts capturing on interface ifName of the namespace at
// nsPath, or of the host's namespace when nsPath is "".
func openCapture(t *testing.T, label, nsPath, ifName string) *capture {
	t.Helper()
	fd, err := packetSocket(nsPath, ifName)
	if err != nil {
		t.Fatalf("capturing on %s (%s in %q): %v", label, ifName, nsPath, err)
	}
	c := &capture{label: label, fd: fd, done: make(chan struct{})}
	go c.read()
	t.Cleanup(c.stop)
	return c
}

// packetSocket opens an AF_PACKET socket bound to ifName of the namespace
// at nsPath. A socket keeps the namespace it was made in, so only the
// making needs the locked, switched thread.
func packetSocket(nsPath, ifName string) (int, error) {
	type result struct {
		fd  int
		err error
	}
	resc := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if nsPath != "" {
			orig, err := netns.Get()
			if err != nil {
				runtime.UnlockOSThread()
				resc <- result{-1, err}
				return
			}
			defer orig.Close()
			ns, err := netns.GetFromPath(nsPath)
			if err != nil {
				runtime.UnlockOSThread()
				resc <- result{-1, err}
				return
			}
			defer ns.Close()
			if err := netns.Set(ns); err != nil {
				runtime.UnlockOSThread()
				resc <- result{-1, err}
				return
			}
			// A thread that cannot go back stays locked and dies with
			// this goroutine.
			defer func() {
				if netns.Set(orig) == nil {
					runtime.UnlockOSThread()
				}
			}()
		} else {
			defer runtime.UnlockOSThread()
		}
		fd, err := bindPacket(ifName)
		resc <- result{fd, err}
	}()
	r := <-resc
	return r.fd, r.err
}

// bindPacket opens the socket in the current thread's namespace. It is
// made with protocol 0, which receives nothing, and bound to ifName for
// every protocol, so that no frame of another interface slips in.
func bindPacket(ifName string) (int, error) {
	ifi, err := net.InterfaceByName(ifName)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening AF_PACKET socket: %w", err)
	}
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	if err := errors.Join(
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
		unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}),
	); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("setting up AF_PACKET socket on %s: %w", ifName, err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (c *capture) read() {
	defer close(c.done)
	buf := make([]byte, 1<<16)
	for !c.stopping.Load() {
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			c.mu.Lock()
			c.readErr = err
			c.mu.Unlock()
			return
		}
		c.mu.Lock()
		c.frames = append(c.frames, bytes.Clone(buf[:n]))
		c.mu.Unlock()
	}
}

// stop ends the capture and closes its socket; it may be repeated.
func (c *capture) stop() {
	c.stopOnce.Do(func() {
		c.stopping.Store(true)
		<-c.done
		if st, err := unix.GetsockoptTpacketStats(c.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
			c.drops = st.Drops
		}
		_ = unix.Close(c.fd)
	})
}

// matching returns the captured frames that match.
func (c *capture) matching(match func(frame []byte) bool) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [][]byte
	for _, f := range c.frames {
		if match(f) {
			out = append(out, f)
		}
	}
	return out
}

// count returns how many captured frames match.
func (c *capture) count(match func(frame []byte) bool) int { return len(c.matching(match)) }

// err returns what ended the capture early, if anything.
func (c *capture) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}

// carries matches frames with marker anywhere in them.
func carries(marker string) func([]byte) bool {
	return func(f []byte) bool { return bytes.Contains(f, []byte(marker)) }
}

// arpFor matches ARP frames (requests or replies) whose target protocol
// address is ip.
func arpFor(ip net.IP) func([]byte) bool {
	ip4 := ip.To4()
	return func(f []byte) bool {
		return len(f) >= 42 && f[12] == 0x08 && f[13] == 0x06 && bytes.Equal(f[38:42], ip4)
	}
}

// arpAbout matches ARP frames whose sender or target protocol address is ip.
func arpAbout(ip net.IP) func([]byte) bool {
	ip4 := ip.To4()
	return func(f []byte) bool {
		return len(f) >= 42 && f[12] == 0x08 && f[13] == 0x06 && (bytes.Equal(f[28:32], ip4) || bytes.Equal(f[38:42], ip4))
	}
}
