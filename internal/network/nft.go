package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Rule building blocks. Register 1 is the only one used.

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func matchIif(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func matchOif(name string, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)},
	}
}

// matchAddr matches the IPv4 source (src) or destination address against p.
func matchAddr(src bool, p netip.Prefix) []expr.Any {
	off := uint32(16)
	if src {
		off = 12
	}
	a := p.Masked().Addr().As4()
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
	if p.Bits() < 32 {
		mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]})
}

// matchL4 matches the transport protocol and, if port > 0, the destination
// port (TCP/UDP layout).
func matchL4(proto byte, port int) []expr.Any {
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
	if port > 0 {
		out = append(out,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, uint16(port))})
	}
	return out
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
			Xor:  []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

// nat rewrites the source (snat) or destination address to a.
func nat(t expr.NATType, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: b[:]},
		&expr.NAT{Type: t, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func nftConn(ns netns.NsHandle) (*nftables.Conn, error) {
	if ns == netns.None() {
		return nftables.New()
	}
	return nftables.New(nftables.WithNetNSFd(int(ns)))
}

// deleteTable deletes table "ip name" in ns if it exists.
func deleteTable(ns netns.NsHandle, name string) error {
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	t, err := c.ListTableOfFamily(name, nftables.TableFamilyIPv4)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("listing nftables table %s: %w", name, err)
	}
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("deleting nftables table %s: %w", name, err)
	}
	return nil
}

// hostRules (re)creates the host table "ip <prefix>": new connections coming
// in from the bridge are dropped, and sandbox traffic leaving through another
// interface is masqueraded.
func hostRules(prefix, bridge string, subnet netip.Prefix) error {
	c, err := nftConn(netns.None())
	if err != nil {
		return err
	}
	// One transaction: create or keep the table, empty it, refill it; the
	// bridge is never unguarded.
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: prefix})
	c.FlushTable(t)
	accept := nftables.ChainPolicyAccept
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(matchIif(bridge), ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(matchIif(bridge), []expr.Any{verdict(expr.VerdictDrop)})})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(matchAddr(true, subnet), matchOif(bridge, expr.CmpOpNeq), []expr.Any{&expr.Masq{}})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("creating host nftables table %s: %w", prefix, err)
	}
	return nil
}

// routerSpec is what routerRules needs to know about one sandbox.
type routerSpec struct {
	table        string
	inner, outer netip.Addr
	policy       Policy
	allow        []Allow
	ports        []Port
	subnet       netip.Prefix // the bridge subnet, never reachable
	dns          []netip.Addr
}

// routerRules installs the router namespace's table: 1:1 NAT between outer
// and inner, and the policy filter.
func routerRules(ns netns.NsHandle, s routerSpec) error {
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: s.table})
	drop := nftables.ChainPolicyDrop

	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(matchIif(upIf),
		matchAddr(false, netip.PrefixFrom(s.outer, 32)), nat(expr.NATTypeDestNAT, s.inner))})

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(matchOif(upIf, expr.CmpOpEq),
		matchAddr(true, netip.PrefixFrom(s.inner, 32)), nat(expr.NATTypeSourceNAT, s.outer))})

	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(matchIif("lo"), []expr.Any{verdict(expr.VerdictAccept)})})

	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})})
	for _, p := range s.ports {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(matchIif(upIf), matchOif(gwIf, expr.CmpOpEq),
			matchAddr(false, netip.PrefixFrom(s.inner, 32)), matchL4(unix.IPPROTO_TCP, p.Port), []expr.Any{verdict(expr.VerdictAccept)})})
	}
	if s.policy == PolicyEgress {
		out := cat(matchIif(gwIf), matchOif(upIf, expr.CmpOpEq), matchAddr(true, netip.PrefixFrom(s.inner, 32)))
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(out, matchAddr(false, s.subnet), []expr.Any{verdict(expr.VerdictDrop)})})
		if len(s.allow) == 0 {
			c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(out, []expr.Any{verdict(expr.VerdictAccept)})})
		}
		allow := append([]Allow(nil), s.allow...)
		if len(s.allow) > 0 {
			for _, d := range s.dns {
				allow = append(allow, Allow{Prefix: netip.PrefixFrom(d, 32), Port: 53})
			}
		}
		for _, a := range allow {
			for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
				c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(out, matchAddr(false, a.Prefix), matchL4(proto, a.Port), []expr.Any{verdict(expr.VerdictAccept)})})
			}
			if a.Port == 0 {
				c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(out, matchAddr(false, a.Prefix), matchL4(unix.IPPROTO_ICMP, 0), []expr.Any{verdict(expr.VerdictAccept)})})
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing router nftables rules: %w", err)
	}
	return nil
}
