// Package network gives every sandbox its own network namespace, with
// policies, published ports and address-stable forks.
//
// # Topology
//
// Forked children keep their parent's in-sandbox ("inner") address, so two
// live sandboxes may hold the same address. They can therefore never share an
// L2 segment or a routing table with that address, and under gVisor no
// translation can happen inside the sandbox's own namespace (runsc takes the
// veth's address and sends raw frames; nftables there sees nothing). Each
// sandbox with a policy other than "none" gets two namespaces:
//
//	host netns                 router netns R                sandbox netns S
//	<prefix>br  B/outer ─ <prefix>v<n> ═ up Y/outer │ gw G/inner ═ eth0 X/inner
//	(bridge)                   nftables: 1:1 NAT Y<->X,    (gVisor or the VM takes X)
//	                           policy filter, input drop        default via G
//
// The pieces:
//
//   - S (/run/netns/<prefix>-s-<id>) holds lo and eth0 with the inner address X
//     and a default route via the gateway G. Its path goes into the OCI spec
//     (gVisor takes eth0 over), or the QEMU engine moves its tap into S,
//     takes X off eth0 and redirects frames between eth0 and the tap: the
//     guest kernel holds X. Nothing else is in S (but that tap).
//   - R (/run/netns/<prefix>-r-<id>) is a tiny router: gw (G, peer of eth0) and
//     up (the unique outer address Y on the host bridge). R forwards, DNATs Y to
//     X inbound and SNATs X to Y outbound, and filters by policy. Every R uses
//     the same G, the same inner subnet and the same MAC on gw (a forked VM
//     guest wakes with it in its neighbour cache); they never meet.
//   - The host has one bridge <prefix>br with address B (the first address of
//     Config.Subnet) and one nftables table "ip <prefix>": an input chain that
//     drops every new connection arriving from the bridge (sandboxes never reach
//     the host or the daemon's API) and a masquerade for egress.
//
// The host tells children apart by their outer address Y, which is unique per
// sandbox; X is unique only per fork lineage. Inner addresses come from
// Config.Inner, outer addresses from Config.Subnet; both are persisted in
// StateDir/state.json (written atomically) so a restarted daemon keeps them.
//
// # Policies
//
//   - none: S with lo only; no R, no outer address, no ports.
//   - isolated (default): R forwards only new TCP connections from the bridge to
//     the published ports, and replies. The sandbox reaches nothing: not other
//     sandboxes, not the bridge, not the host.
//   - egress: as isolated, plus new connections from the sandbox to the allow
//     list (CIDR with an optional port, TCP and UDP, from X only), or to anything when the
//     list is empty; the bridge subnet is always refused and the host refuses
//     new connections from the bridge. Configured DNS servers are allowed on
//     port 53. Traffic leaves the host masqueraded; the host must forward
//     (the first egress Setup sets net.ipv4.ip_forward=1 unless
//     Config.KeepIPForward; the bridge always gets forwarding=1).
//
// # Published ports
//
// Published ports are userspace TCP proxies in the daemon process: a listener
// on 127.0.0.1:HostPort dials Y:Port from the host, and R turns that into X:Port.
// A HostPort of 0 picks a free port. The proxies live as long as the Manager:
// Close stops them, a restarted daemon re-opens them (same host ports) by
// calling Reconcile with the sandboxes it keeps.
//
// # Lifetimes
//
// Setup leaves nothing behind when it fails. Teardown, Reconcile and RemoveAll
// delete only names carrying the Manager's prefix. Deleting R removes both veth
// pairs; Teardown deletes the host veth and gw explicitly first so that the
// host's link list is clean when it returns, even if some process still holds
// a reference to S. A Manager is safe for concurrent use.
package network
