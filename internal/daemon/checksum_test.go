package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeAt writes b into the file at p at off, creating it.
func writeAt(t *testing.T, p string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestChecksumSparse: a file with holes and the same bytes written out in
// full have one checksum; a byte changed in data or in a hole, or a
// changed size, changes it.
func TestChecksumSparse(t *testing.T) {
	const size = 3*checksumChunk + 12345 // a partial last chunk
	data := []byte(strings.Repeat("k7 memory ", 1000))
	mk := func(name string, dense bool, edit func(p string)) string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "memory.bin")
		if dense {
			full := make([]byte, size)
			copy(full[checksumChunk+100:], data)
			writeAt(t, p, 0, full)
		} else {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, size); err != nil {
				t.Fatal(err)
			}
			writeAt(t, p, checksumChunk+100, data)
		}
		writeAt(t, filepath.Join(dir, "sub", "state.bin"), 0, []byte("device state"))
		if edit != nil {
			edit(p)
		}
		sum, total, err := checksumDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(size + len("device state")); edit == nil && total != want {
			t.Errorf("%s: size %d, want %d", name, total, want)
		}
		return sum
	}
	sparse := mk("sparse", false, nil)
	if !strings.HasPrefix(sparse, checksumPrefix) {
		t.Errorf("checksum %q lacks the prefix %q", sparse, checksumPrefix)
	}
	if dense := mk("dense", true, nil); dense != sparse {
		t.Errorf("dense copy: %s, sparse: %s; want equal", dense, sparse)
	}
	for name, edit := range map[string]func(string){
		"byte in data":       func(p string) { writeAt(t, p, checksumChunk+200, []byte{'X'}) },
		"byte in a hole":     func(p string) { writeAt(t, p, 3*checksumChunk+7, []byte{1}) },
		"byte in first hole": func(p string) { writeAt(t, p, 0, []byte{1}) },
		"longer":             func(p string) { writeAt(t, p, size, []byte{0}) },
	} {
		if got := mk(name, false, edit); got == sparse {
			t.Errorf("%s: checksum unchanged", name)
		}
	}
}

// TestChecksumLegacy: a snapshot recorded with the checksum of earlier
// versions (one sha256 over path, size and bytes) is verified as such.
func TestChecksumLegacy(t *testing.T) {
	dir := t.TempDir()
	writeAt(t, filepath.Join(dir, "a"), 0, []byte("abc"))
	sum := sha256.Sum256([]byte("a\x003\x00abc"))
	legacy := legacyChecksumPrefix + hex.EncodeToString(sum[:])
	if _, ok, err := verifyChecksum(dir, legacy); !ok || err != nil {
		t.Errorf("legacy checksum %s not verified: %v", legacy, err)
	}
	writeAt(t, filepath.Join(dir, "a"), 0, []byte("abd"))
	if got, ok, _ := verifyChecksum(dir, legacy); ok {
		t.Errorf("changed file verified against the legacy checksum (got %s)", got)
	}
	cur, _, err := checksumDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := verifyChecksum(dir, cur); !ok || err != nil {
		t.Errorf("current checksum not verified: %v", err)
	}
}
