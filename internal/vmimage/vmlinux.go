package vmimage

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ulikunitz/xz"
	"github.com/ulikunitz/xz/lzma"
)

var xzMagic = []byte{0xFD, '7', 'z', 'X', 'Z', 0x00}

// ExtractVmlinux finds the xz-compressed ELF kernel inside a bzImage
// (vmlinuz) and writes it, uncompressed, to dst. Booting the ELF directly
// (through its PVH note) skips the in-guest decompression, which costs
// seconds under TCG.
func ExtractVmlinux(vmlinuz, dst string) error {
	data, err := os.ReadFile(vmlinuz)
	if err != nil {
		return fmt.Errorf("reading kernel: %w", err)
	}
	lastErr := errors.New("no xz stream found")
	for off := 0; ; {
		i := bytes.Index(data[off:], xzMagic)
		if i < 0 {
			break
		}
		off += i
		err := writeXZ(data[off:], dst)
		if err == nil {
			return nil
		}
		lastErr = err
		off += len(xzMagic)
	}
	return fmt.Errorf("extracting vmlinux from %s: %w", vmlinuz, lastErr)
}

func writeXZ(stream []byte, dst string) error {
	data, err := decodeKernelXZ(stream)
	if err != nil {
		return err
	}
	return writeAtomic(dst, 0o644, func(f *os.File) error {
		if _, err := f.Write(data); err != nil {
			return err
		}
		ef, err := elf.NewFile(f)
		if err != nil {
			return fmt.Errorf("decompressed kernel is not ELF: %w", err)
		}
		return ef.Close()
	})
}

// NewestKernel returns the newest /boot/vmlinuz-* (by version-aware name
// order) and its release string.
func NewestKernel(boot string) (path, release string, err error) {
	matches, _ := filepath.Glob(filepath.Join(boot, "vmlinuz-*"))
	if len(matches) == 0 {
		return "", "", fmt.Errorf("no %s/vmlinuz-*", boot)
	}
	sort.Slice(matches, func(i, j int) bool { return versionLess(matches[i], matches[j]) })
	p := matches[len(matches)-1]
	return p, strings.TrimPrefix(filepath.Base(p), "vmlinuz-"), nil
}

// versionLess compares strings treating runs of digits as numbers.
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := isDigit(a[0]), isDigit(b[0])
		if da && db {
			na, ra := digits(a)
			nb, rb := digits(b)
			na, nb = strings.TrimLeft(na, "0"), strings.TrimLeft(nb, "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = ra, rb
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func digits(s string) (string, string) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return s[:i], s[i:]
}

// writeAtomic writes dst through fill on a temporary file in dst's
// directory and renames it into place.
func writeAtomic(dst string, mode os.FileMode, fill func(f *os.File) error) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }()
	if err := fill(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// decodeKernelXZ decodes the first block of an xz stream. Kernels are
// compressed with the x86 BCJ filter before LZMA2, which package xz does
// not implement: plain streams go through package xz, BCJ+LZMA2 blocks are
// decoded with package lzma and the BCJ filter below. Trailing data after
// the block (the kernel appends its size) is ignored.
func decodeKernelXZ(stream []byte) ([]byte, error) {
	if len(stream) < 13 {
		return nil, errors.New("short xz stream")
	}
	bh := stream[12:]
	hsize := (int(bh[0]) + 1) * 4
	if bh[0] == 0 || len(bh) < hsize {
		return nil, errors.New("bad xz block header")
	}
	flags := bh[1]
	nfilters := int(flags&3) + 1
	r := bytes.NewReader(bh[2:hsize])
	for _, bit := range []byte{0x40, 0x80} { // compressed, uncompressed size
		if flags&bit != 0 {
			if _, err := readUvarint(r); err != nil {
				return nil, err
			}
		}
	}
	var ids []uint64
	var lzmaProp byte
	for i := 0; i < nfilters; i++ {
		id, err := readUvarint(r)
		if err != nil {
			return nil, err
		}
		n, err := readUvarint(r)
		if err != nil {
			return nil, err
		}
		props := make([]byte, n)
		if _, err := io.ReadFull(r, props); err != nil {
			return nil, err
		}
		if id == 0x04 && n != 0 {
			return nil, errors.New("x86 BCJ filter with a start offset")
		}
		if id == 0x21 && n == 1 {
			lzmaProp = props[0]
		}
		ids = append(ids, id)
	}
	switch {
	case len(ids) == 1 && ids[0] == 0x21:
		xr, err := xz.ReaderConfig{SingleStream: true}.NewReader(bytes.NewReader(stream))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(xr)
	case len(ids) == 2 && ids[0] == 0x04 && ids[1] == 0x21:
	default:
		return nil, fmt.Errorf("unsupported xz filters %x", ids)
	}
	bits := uint(lzmaProp & 0x3F)
	dict := (2 | (bits & 1)) << (bits/2 + 11)
	if bits >= 40 {
		dict = 1<<32 - 1
	}
	if dict < lzma.MinDictCap {
		dict = lzma.MinDictCap
	}
	lr, err := lzma.Reader2Config{DictCap: int(dict)}.NewReader2(bytes.NewReader(bh[hsize:]))
	if err != nil {
		return nil, err
	}
	out, err := io.ReadAll(lr)
	if err != nil {
		return nil, fmt.Errorf("lzma2: %w", err)
	}
	bcjX86Decode(out)
	return out, nil
}

func readUvarint(r io.ByteReader) (uint64, error) {
	var v uint64
	for i := 0; i < 9; i++ {
		b, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		v |= uint64(b&0x7F) << (7 * i)
		if b&0x80 == 0 {
			return v, nil
		}
	}
	return 0, errors.New("bad xz integer")
}

// bcjX86Decode undoes the x86 branch/call/jump filter in place (a port of
// xz-embedded's bcj_x86 for a whole buffer starting at position 0).
func bcjX86Decode(buf []byte) {
	allowed := [8]bool{true, true, true, false, true, false, false, false}
	bitNum := [8]uint32{0, 1, 2, 2, 3, 3, 3, 3}
	test := func(b byte) bool { return b == 0x00 || b == 0xFF }
	if len(buf) <= 4 {
		return
	}
	size := len(buf) - 4
	prevPos := -1
	var prevMask uint32
	for i := 0; i < size; i++ {
		if buf[i]&0xFE != 0xE8 {
			continue
		}
		d := i - prevPos
		if d > 3 {
			prevMask = 0
		} else {
			prevMask = (prevMask << uint(d-1)) & 7
			if prevMask != 0 {
				b := buf[i+4-int(bitNum[prevMask])]
				if !allowed[prevMask] || test(b) {
					prevPos = i
					prevMask = prevMask<<1 | 1
					continue
				}
			}
		}
		prevPos = i
		if test(buf[i+4]) {
			src := uint32(buf[i+1]) | uint32(buf[i+2])<<8 | uint32(buf[i+3])<<16 | uint32(buf[i+4])<<24
			var dest uint32
			for {
				dest = src - uint32(i+5)
				if prevMask == 0 {
					break
				}
				j := bitNum[prevMask] * 8
				b := byte(dest >> (24 - j))
				if !test(b) {
					break
				}
				src = dest ^ (1<<(32-j) - 1)
			}
			dest &= 0x01FFFFFF
			dest |= -(dest & 0x01000000)
			buf[i+1], buf[i+2], buf[i+3], buf[i+4] = byte(dest), byte(dest>>8), byte(dest>>16), byte(dest>>24)
			i += 4
		} else {
			prevMask = prevMask<<1 | 1
		}
	}
}
