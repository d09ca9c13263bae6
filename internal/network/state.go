package network

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/k7-dev/k7/internal/errdefs"
)

// record is one sandbox's persisted network.
type record struct {
	ID       string     `json:"id"`
	Policy   Policy     `json:"policy"`
	Inner    netip.Addr `json:"inner,omitzero"`
	Outer    netip.Addr `json:"outer,omitzero"`
	HostIf   string     `json:"host_if,omitempty"`
	Hostname string     `json:"hostname"`
	Allow    []Allow    `json:"allow,omitempty"`
	Ports    []Port     `json:"ports,omitempty"`

	pending bool // reserved by a Setup in progress; not saved
}

type stateFile struct {
	Sandboxes map[string]*record `json:"sandboxes"`
}

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

// loadState reads dir/state.json; a missing file is an empty state.
func loadState(dir string) (map[string]*record, error) {
	b, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]*record{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading network state: %w", err)
	}
	var s stateFile
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decoding network state %s: %w", statePath(dir), err)
	}
	if s.Sandboxes == nil {
		s.Sandboxes = map[string]*record{}
	}
	return s.Sandboxes, nil
}

// saveState writes the committed records atomically (temp file, fsync,
// rename).
func saveState(dir string, recs map[string]*record) error {
	s := stateFile{Sandboxes: map[string]*record{}}
	for id, r := range recs {
		if !r.pending {
			s.Sandboxes[id] = r
		}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("saving network state: %w", err)
	}
	f, err := os.CreateTemp(dir, ".state-*.json")
	if err != nil {
		return fmt.Errorf("saving network state: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("saving network state: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("saving network state: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("saving network state: %w", err)
	}
	if err := os.Rename(f.Name(), statePath(dir)); err != nil {
		return fmt.Errorf("saving network state: %w", err)
	}
	return nil
}

// nth returns the address at offset n in p.
func nth(p netip.Prefix, n uint32) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// offset returns a's offset in p.
func offset(p netip.Prefix, a netip.Addr) uint32 {
	x, y := p.Masked().Addr().As4(), a.As4()
	return (uint32(y[0])<<24 | uint32(y[1])<<16 | uint32(y[2])<<8 | uint32(y[3])) -
		(uint32(x[0])<<24 | uint32(x[1])<<16 | uint32(x[2])<<8 | uint32(x[3]))
}

// usable reports whether a is a host address in p other than the first
// (bridge or gateway).
func usable(p netip.Prefix, a netip.Addr) bool {
	if !a.Is4() || !p.Contains(a) {
		return false
	}
	o := offset(p, a)
	return o >= 2 && o < (uint32(1)<<(32-p.Bits()))-1
}

// allocate returns the lowest usable address of p not in used.
func allocate(p netip.Prefix, used map[netip.Addr]bool) (netip.Addr, error) {
	size := uint32(1) << (32 - p.Bits())
	for o := uint32(2); o < size-1; o++ {
		if a := nth(p, o); !used[a] {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free address in %s: %w", p, errdefs.ErrResourceExhausted)
}
