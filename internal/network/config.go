package network

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strings"

	"github.com/k7-dev/k7/internal/errdefs"
)

// Defaults for Config.
var (
	DefaultPrefix   = "k7"
	DefaultSubnet   = netip.MustParsePrefix("10.77.0.0/16")
	DefaultInner    = netip.MustParsePrefix("10.78.0.0/16")
	DefaultStateDir = "/var/lib/k7/network"
)

// Config configures a Manager. The zero value of each field means its
// default.
type Config struct {
	// Prefix names everything the Manager creates: the bridge <prefix>br,
	// host veths <prefix>v<hex>, namespaces <prefix>-s-<id> and <prefix>-r-<id>,
	// the nftables table "ip <prefix>". 1–8 characters [a-z0-9], starting with
	// a letter; distinct per daemon on one host. Default "k7".
	Prefix string
	// Subnet is the host-facing (outer) IPv4 pool; its first address is the
	// bridge's. Must not overlap other host routes. Default 10.77.0.0/16.
	Subnet netip.Prefix
	// Inner is the in-sandbox IPv4 subnet; its first address is every
	// sandbox's gateway. It is private to each sandbox and may overlap other
	// daemons', but destinations inside it are unreachable from sandboxes.
	// Default 10.78.0.0/16.
	Inner netip.Prefix
	// StateDir holds state.json (the address allocations and published
	// ports). Default /var/lib/k7/network.
	StateDir string
	// DNS servers written to resolv.conf and allowed (port 53) for egress.
	// Default: the non-loopback nameservers of the host's /etc/resolv.conf.
	DNS []netip.Addr
	// KeepIPForward, if true, stops Setup from setting net.ipv4.ip_forward=1
	// for the first egress sandbox; egress then works only through host
	// interfaces that forward. Default false.
	KeepIPForward bool
}

var (
	prefixRE   = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)
	idRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)
)

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if !c.Subnet.IsValid() {
		c.Subnet = DefaultSubnet
	}
	if !c.Inner.IsValid() {
		c.Inner = DefaultInner
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.DNS == nil {
		c.DNS = hostDNS("/etc/resolv.conf")
	}
	return c
}

// Validate reports whether c (after defaults) is usable.
func (c Config) Validate() error {
	c = c.withDefaults()
	if !prefixRE.MatchString(c.Prefix) {
		return fmt.Errorf("network prefix %q: want 1-8 of [a-z0-9] starting with a letter: %w", c.Prefix, errdefs.ErrInvalidArgument)
	}
	for _, p := range []netip.Prefix{c.Subnet, c.Inner} {
		if !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 29 || p.Masked() != p {
			return fmt.Errorf("network subnet %s: want a masked IPv4 prefix /8../29: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	if c.Subnet.Overlaps(c.Inner) {
		return fmt.Errorf("network subnets %s and %s overlap: %w", c.Subnet, c.Inner, errdefs.ErrInvalidArgument)
	}
	for _, a := range c.DNS {
		if !a.Is4() {
			return fmt.Errorf("dns server %s: want IPv4: %w", a, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// hostDNS returns the non-loopback IPv4 nameservers in the resolv.conf at path.
func hostDNS(path string) []netip.Addr {
	b, err := os.ReadFile(path)
	if err != nil {
		return []netip.Addr{}
	}
	out := []netip.Addr{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil || !a.Is4() || a.IsLoopback() {
			continue
		}
		out = append(out, a)
	}
	return out
}
