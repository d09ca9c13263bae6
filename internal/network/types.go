package network

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/k7-dev/k7/internal/errdefs"
)

// Policy is a sandbox's network policy. Its strings are API.
type Policy string

// The policies; see the package documentation.
const (
	PolicyNone     Policy = "none"
	PolicyIsolated Policy = "isolated"
	PolicyEgress   Policy = "egress"
)

// String returns the policy's API name.
func (p Policy) String() string { return string(p) }

// ParsePolicy parses a policy name; "" is isolated.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case "":
		return PolicyIsolated, nil
	case PolicyNone, PolicyIsolated, PolicyEgress:
		return p, nil
	}
	return "", fmt.Errorf("network policy %q: want none, isolated or egress: %w", s, errdefs.ErrInvalidArgument)
}

// Port is a published port: 127.0.0.1:HostPort on the host reaches Port on
// the sandbox's inner address. HostPort 0 in a Request means "pick a free
// one". Protocol is "tcp" (or "", meaning tcp).
type Port struct {
	HostPort int    `json:"host_port"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
}

// ParsePort parses "PORT", "HOSTPORT:PORT", optionally followed by "/tcp".
func ParsePort(s string) (Port, error) {
	bad := fmt.Errorf("published port %q: want [HOSTPORT:]PORT[/tcp]: %w", s, errdefs.ErrInvalidArgument)
	p := Port{Protocol: "tcp"}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		if s[i+1:] != "tcp" {
			return Port{}, bad
		}
		s = s[:i]
	}
	host, ctr, ok := strings.Cut(s, ":")
	if !ok {
		host, ctr = "0", host
	}
	var err1, err2 error
	p.HostPort, err1 = strconv.Atoi(host)
	p.Port, err2 = strconv.Atoi(ctr)
	if err1 != nil || err2 != nil || p.validate() != nil {
		return Port{}, bad
	}
	return p, nil
}

func (p Port) validate() error {
	if p.Port < 1 || p.Port > 65535 || p.HostPort < 0 || p.HostPort > 65535 || (p.Protocol != "" && p.Protocol != "tcp") {
		return fmt.Errorf("published port %+v: %w", p, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Allow is one egress allow-list entry: a destination prefix and an optional
// port (0: any port). It admits TCP and UDP.
type Allow struct {
	Prefix netip.Prefix `json:"prefix"`
	Port   int          `json:"port,omitempty"`
}

// ParseAllow parses "CIDR[:PORT]" or "ADDR[:PORT]" (an address is a /32).
func ParseAllow(s string) (Allow, error) {
	bad := fmt.Errorf("egress allow %q: want CIDR[:PORT]: %w", s, errdefs.ErrInvalidArgument)
	var a Allow
	addr, port, ok := strings.Cut(s, ":")
	if ok {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return Allow{}, bad
		}
		a.Port = n
	}
	if strings.Contains(addr, "/") {
		p, err := netip.ParsePrefix(addr)
		if err != nil || !p.Addr().Is4() {
			return Allow{}, bad
		}
		a.Prefix = p.Masked()
	} else {
		ip, err := netip.ParseAddr(addr)
		if err != nil || !ip.Is4() {
			return Allow{}, bad
		}
		a.Prefix = netip.PrefixFrom(ip, 32)
	}
	return a, nil
}

// String returns a in the form ParseAllow reads.
func (a Allow) String() string {
	if a.Port == 0 {
		return a.Prefix.String()
	}
	return fmt.Sprintf("%s:%d", a.Prefix, a.Port)
}

// Request asks Setup for a sandbox's network.
type Request struct {
	// ID is the sandbox ID: 1-64 of [A-Za-z0-9_.-], starting alphanumeric.
	ID string
	// Policy defaults to isolated.
	Policy Policy
	// Allow is the egress allow list (egress only); empty allows everything
	// outside the bridge subnet and the host.
	Allow []Allow
	// Ports to publish on 127.0.0.1 (not with policy none).
	Ports []Port
	// Hostname for /etc/hosts; default the ID.
	Hostname string
	// InnerAddr is the in-sandbox address. Zero: allocate one. A fork child
	// passes its parent's; it must lie in Config.Inner.
	InnerAddr netip.Addr
}

// Attachment describes a sandbox's network as set up.
type Attachment struct {
	ID     string
	Policy Policy
	// NetnsPath is the sandbox namespace: the OCI spec's network namespace
	// path (runsc --network=sandbox), or where the QEMU engine puts its tap.
	NetnsPath string
	// Interface is the veth inside NetnsPath ("eth0"; empty for none).
	Interface string
	// Inner is the in-sandbox address with its prefix length (invalid for
	// none), Gateway its default gateway.
	Inner   netip.Prefix
	Gateway netip.Addr
	// Outer is the host-facing address (invalid for none).
	Outer netip.Addr
	// Ports are the published ports with their host ports resolved.
	Ports []Port
	// ResolvConf and Hosts are the contents for /etc/resolv.conf and
	// /etc/hosts inside the sandbox.
	ResolvConf, Hosts []byte
}
