package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Snapshot checksums. A capture can hold a guest's RAM file: hundreds of
// MiB, most of it holes. The checksum covers every regular file under the
// capture dir: its relative path, its size and a digest of its content,
// the sha256 of the sha256s of its checksumChunk-sized chunks. Chunks are
// hashed in parallel, and a chunk that lies wholly in a hole is zeros
// without being read. Holes only save work: the same bytes give the same
// checksum however the file stores them.
const (
	checksumPrefix = "sha256-chunked:"
	checksumChunk  = 4 << 20
	// legacyChecksumPrefix marks snapshots taken before chunking: one
	// sha256 over every file's path, size and bytes in sequence.
	legacyChecksumPrefix = "sha256:"
)

// zeroChunk is the digest of a full chunk of zeros.
var zeroChunk = sync.OnceValue(func() [sha256.Size]byte {
	return sha256.Sum256(make([]byte, checksumChunk))
})

// checksumDir returns the checksum of the files under dir and their total
// size.
func checksumDir(dir string) (string, int64, error) {
	paths, err := regularFiles(dir)
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	var total int64
	for _, p := range paths {
		rel, _ := filepath.Rel(dir, p)
		sum, size, err := fileDigest(p)
		if err != nil {
			return "", 0, err
		}
		fmt.Fprintf(h, "%s\x00%d\x00%x\x00", rel, size, sum)
		total += size
	}
	return checksumPrefix + hex.EncodeToString(h.Sum(nil)), total, nil
}

// verifyChecksum reports whether the files under dir have checksum want,
// computed the way want was (a snapshot of an earlier k7 has a legacy one).
func verifyChecksum(dir, want string) (string, bool, error) {
	var got string
	var err error
	if strings.HasPrefix(want, checksumPrefix) {
		got, _, err = checksumDir(dir)
	} else {
		got, err = legacyChecksumDir(dir)
	}
	return got, err == nil && got == want, err
}

// regularFiles lists the regular files under dir in path order.
func regularFiles(dir string) ([]string, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.Type().IsRegular() {
			paths = append(paths, p)
		}
		return nil
	})
	sort.Strings(paths)
	return paths, err
}

// fileDigest returns the digest of the content of the file at p (the
// sha256 of its chunks' sha256s) and its size.
func fileDigest(p string) ([]byte, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := fi.Size()
	n := int((size + checksumChunk - 1) / checksumChunk)
	sums := make([][sha256.Size]byte, n)
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), max(n, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, checksumChunk)
			for i := range next {
				sums[i], errs[i] = chunkDigest(f, int64(i)*checksumChunk, min(checksumChunk, size-int64(i)*checksumChunk), buf)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", p, err)
	}
	h := sha256.New()
	for _, s := range sums {
		h.Write(s[:])
	}
	return h.Sum(nil), size, nil
}

// chunkDigest returns the sha256 of the n bytes of f at off, reading them
// into buf unless they lie wholly in a hole.
func chunkDigest(f *os.File, off, n int64, buf []byte) ([sha256.Size]byte, error) {
	data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	hole := errors.Is(err, unix.ENXIO) || (err == nil && data >= off+n)
	switch {
	case hole && n == checksumChunk:
		return zeroChunk(), nil
	case hole:
		return sha256.Sum256(make([]byte, n)), nil
	}
	// A file system without SEEK_DATA (err set) is read in full.
	if _, err := f.ReadAt(buf[:n], off); err != nil && !errors.Is(err, io.EOF) {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(buf[:n]), nil
}

// legacyChecksumDir is the checksum of snapshots taken before chunking: a
// sha256 over every regular file's relative path, size and content, in
// path order.
func legacyChecksumDir(dir string) (string, error) {
	paths, err := regularFiles(dir)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, p := range paths {
		rel, _ := filepath.Rel(dir, p)
		f, err := os.Open(p)
		if err != nil {
			return "", err
		}
		fi, _ := f.Stat()
		fmt.Fprintf(h, "%s\x00%d\x00", rel, fi.Size())
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return legacyChecksumPrefix + hex.EncodeToString(h.Sum(nil)), nil
}
