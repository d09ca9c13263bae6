package network

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/k7-dev/k7/internal/errdefs"
)

func TestParsePort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Port
		ok   bool
	}{
		{"80", Port{0, 80, "tcp"}, true},
		{"8080:80", Port{8080, 80, "tcp"}, true},
		{"8080:80/tcp", Port{8080, 80, "tcp"}, true},
		{"80/udp", Port{}, false},
		{"0", Port{}, false},
		{"70000:80", Port{}, false},
		{"x:80", Port{}, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePort(tc.in)
			if tc.ok != (err == nil) || got != tc.want {
				t.Errorf("ParsePort(%q) = %+v, %v; want %+v ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("error %v is not ErrInvalidArgument", err)
			}
		})
	}
}

func TestParseAllow(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{"10.0.0.0/8", "10.0.0.0/8", true},
		{"10.1.2.3/8:443", "10.0.0.0/8:443", true},
		{"1.2.3.4", "1.2.3.4/32", true},
		{"1.2.3.4:53", "1.2.3.4/32:53", true},
		{"::1", "", false},
		{"1.2.3.4:0", "", false},
		{"nope", "", false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseAllow(tc.in)
			if tc.ok != (err == nil) || (tc.ok && got.String() != tc.want) {
				t.Errorf("ParseAllow(%q) = %v, %v; want %s ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
		})
	}
}

func TestAllocate(t *testing.T) {
	p := netip.MustParsePrefix("10.9.0.0/29")
	used := map[netip.Addr]bool{}
	var got []string
	for {
		a, err := allocate(p, used)
		if err != nil {
			if !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("allocate: %v", err)
			}
			break
		}
		used[a] = true
		got = append(got, a.String())
	}
	want := []string{"10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5", "10.9.0.6"}
	if len(got) != len(want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("allocated %v, want %v", got, want)
		}
	}
	delete(used, netip.MustParseAddr("10.9.0.4"))
	if a, _ := allocate(p, used); a.String() != "10.9.0.4" {
		t.Errorf("after freeing 10.9.0.4, allocate = %s", a)
	}
	if usable(p, netip.MustParseAddr("10.9.0.1")) || usable(p, netip.MustParseAddr("10.9.0.7")) || !usable(p, netip.MustParseAddr("10.9.0.6")) {
		t.Error("usable: gateway/broadcast/host classification wrong")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		ok   bool
	}{
		{"defaults", Config{DNS: []netip.Addr{}}, true},
		{"bad prefix", Config{Prefix: "K7-x"}, false},
		{"long prefix", Config{Prefix: "abcdefghi"}, false},
		{"overlap", Config{Subnet: netip.MustParsePrefix("10.0.0.0/8"), Inner: netip.MustParsePrefix("10.1.0.0/16")}, false},
		{"unmasked", Config{Subnet: netip.MustParsePrefix("10.77.0.1/16")}, false},
		{"v6", Config{Subnet: netip.MustParsePrefix("fd00::/64")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestDNSFiles(t *testing.T) {
	dns := []netip.Addr{netip.MustParseAddr("192.0.2.53")}
	if got := string(resolvConf(PolicyEgress, dns)); got != "nameserver 192.0.2.53\noptions edns0\n" {
		t.Errorf("egress resolv.conf = %q", got)
	}
	if got := string(resolvConf(PolicyIsolated, dns)); got != "# k7: no DNS (network policy isolated)\n" {
		t.Errorf("isolated resolv.conf = %q", got)
	}
	want := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n10.78.0.2\tbox\n"
	if got := string(hostsFile("box", netip.MustParseAddr("10.78.0.2"))); got != want {
		t.Errorf("hosts = %q, want %q", got, want)
	}
}
