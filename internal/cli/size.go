package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits maps unit suffixes (lower case) to bytes. Single letters and
// the SI forms are binary like docker's (512M = 512 MiB).
var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}

// parseSize parses a memory size: a byte count (1048576) or a number with a
// binary unit (512M, 1G, 1.5GiB, 64k). It rejects zero, negative and
// fractional byte counts.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	if num == "" {
		return 0, fmt.Errorf("invalid memory size %q: want a number of bytes or a number with a unit (K, M, G, T, e.g. 512M, 1.5GiB)", s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("invalid memory size %q: unknown unit %q (want K, M, G, T, KiB, MiB, GiB, TiB or none for bytes)", s, t[i:])
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid memory size %q: bad number %q", s, num)
	}
	v := f * mult
	if v < 1 || v > math.MaxInt64/2 {
		return 0, fmt.Errorf("invalid memory size %q: out of range", s)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("invalid memory size %q: not a whole number of bytes", s)
	}
	return int64(v), nil
}
