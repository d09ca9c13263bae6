package network

import (
	"bytes"
	"fmt"
	"net/netip"
)

// resolvConf returns /etc/resolv.conf content for a sandbox: the DNS servers
// for egress, none otherwise (the sandbox cannot reach any).
func resolvConf(p Policy, dns []netip.Addr) []byte {
	var b bytes.Buffer
	if p != PolicyEgress || len(dns) == 0 {
		fmt.Fprintf(&b, "# k7: no DNS (network policy %s)\n", p)
		return b.Bytes()
	}
	for _, a := range dns {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	b.WriteString("options edns0\n")
	return b.Bytes()
}

// HostsFile returns the /etc/hosts of a sandbox named hostname whose own
// address is inner (127.0.1.1 when invalid), as Setup's Attachment.Hosts:
// for a network set up under another host name.
func HostsFile(hostname string, inner netip.Addr) []byte { return hostsFile(hostname, inner) }

// hostsFile returns /etc/hosts content mapping hostname to the sandbox's own
// address (127.0.1.1 without one).
func hostsFile(hostname string, inner netip.Addr) []byte {
	self := "127.0.1.1"
	if inner.IsValid() {
		self = inner.String()
	}
	return fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", self, hostname)
}
