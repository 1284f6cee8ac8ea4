package domain

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Where a mailbox's credentials may be sent (docs/architecture.md §11,
// SECURITY.md): a producer names the IMAP endpoint, so without a policy
// anyone who can register a mailbox can make a sync worker talk to
// internal services, or send a password in plain text across a network. The policy is checked
// where events are validated (ingest) and again at dial time, on the
// resolved address, so DNS answers cannot move a connection past it.

// Fixed IMAP endpoints of the OAuth providers: their mailboxes are synced
// only there, with implicit TLS, so a refresh token or access token is
// never presented to another host.
const (
	GmailIMAPHost   = "imap.gmail.com"
	OutlookIMAPHost = "outlook.office365.com"
	// ProviderIMAPPort is the implicit-TLS IMAP port both providers use.
	ProviderIMAPPort = 993
)

// ProviderIMAPHost returns the only IMAP host of an OAuth provider, and
// false for providers whose endpoint the producer chooses.
func ProviderIMAPHost(p Provider) (string, bool) {
	switch p {
	case ProviderGmail:
		return GmailIMAPHost, true
	case ProviderOutlook:
		return OutlookIMAPHost, true
	}
	return "", false
}

// checkProviderEndpoint refuses a gmail or outlook mailbox whose endpoint
// is not its provider's (field paths relative to the imap object).
func checkProviderEndpoint(ps *Problems, p Provider, ep IMAPEndpoint) {
	host, fixed := ProviderIMAPHost(p)
	if !fixed {
		return
	}
	if ep.Host != host {
		ps.Add("host", CodeProviderEndpoint, "a %s mailbox is synced from %s only", p, host)
	}
	if ep.Port != ProviderIMAPPort {
		ps.Add("port", CodeProviderEndpoint, "a %s mailbox is synced on port %d only", p, ProviderIMAPPort)
	}
	if ep.TLS != TLSImplicit {
		ps.Add("tls", CodeProviderEndpoint, "a %s mailbox is synced with implicit TLS only", p)
	}
}

// TransportPolicy is the operator's allowlist for outbound IMAP: hosts and
// networks that may be reached although internal (loopback, private,
// link-local, ...), and to which plain text (tls none) may be sent; an
// entry may be bound to one port. The zero value allows no internal
// address and plain text to none.
type TransportPolicy struct {
	hosts     map[string]bool // host names, any port
	nets      []netip.Prefix  // any port
	hostPorts map[hostPort]bool
	addrPorts map[netip.AddrPort]bool
}

type hostPort struct {
	host string
	port uint16
}

// ParseTransportPolicy parses a comma-separated allowlist of CIDRs
// ("10.1.0.0/16"), IP addresses and host names ("imap.internal"), each
// allowing every port, and of addresses and host names with a port
// ("127.0.0.1:1143", "[::1]:1143", "imap.internal:993"), allowing that
// port only.
func ParseTransportPolicy(spec string) (TransportPolicy, error) {
	var p TransportPolicy
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		switch {
		case part == "":
			continue
		case strings.Contains(part, "/"):
			pfx, err := netip.ParsePrefix(part)
			if err != nil {
				return TransportPolicy{}, Errorf(CodeInvalid, "IMAP allowlist entry %q is not a CIDR", part)
			}
			p.nets = append(p.nets, pfx.Masked())
			continue
		}
		if a, err := netip.ParseAddr(part); err == nil {
			p.nets = append(p.nets, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		if ap, err := netip.ParseAddrPort(part); err == nil && ap.Port() != 0 && ap.Addr().Zone() == "" {
			if p.addrPorts == nil {
				p.addrPorts = map[netip.AddrPort]bool{}
			}
			p.addrPorts[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())] = true
			continue
		}
		host, port, withPort := strings.Cut(part, ":")
		if !isHost(host) {
			return TransportPolicy{}, Errorf(CodeInvalid, "IMAP allowlist entry %q is neither a CIDR, an IP address nor a host name, with or without a port", part)
		}
		host = strings.ToLower(host)
		if !withPort {
			if p.hosts == nil {
				p.hosts = map[string]bool{}
			}
			p.hosts[host] = true
			continue
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 || port[0] == '+' {
			return TransportPolicy{}, Errorf(CodeInvalid, "IMAP allowlist entry %q: the port must be 1 to 65535", part)
		}
		if p.hostPorts == nil {
			p.hostPorts = map[hostPort]bool{}
		}
		p.hostPorts[hostPort{host, uint16(n)}] = true
	}
	return p, nil
}

// MustTransportPolicy is ParseTransportPolicy for constants; it panics on
// a bad spec.
func MustTransportPolicy(spec string) TransportPolicy {
	p, err := ParseTransportPolicy(spec)
	if err != nil {
		panic(err)
	}
	return p
}

// String renders the allowlist (for logs), sorted.
func (p TransportPolicy) String() string {
	var parts []string
	for _, n := range p.nets {
		parts = append(parts, n.String())
	}
	for h := range p.hosts {
		parts = append(parts, h)
	}
	for ap := range p.addrPorts {
		parts = append(parts, ap.String())
	}
	for hp := range p.hostPorts {
		parts = append(parts, hp.host+":"+strconv.Itoa(int(hp.port)))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// IsInternalAddr reports whether a is an address outbound IMAP must not
// reach unless allowlisted: loopback, private (RFC 1918, ULA), CGNAT
// (100.64.0.0/10), link-local (cloud metadata at 169.254.169.254),
// unspecified and "this network" (0.0.0.0/8), multicast, broadcast,
// deprecated site-local IPv6 (fec0::/10), and the IPv6 forms that carry an
// IPv4 address (embeddedIPv4) when that address is any of these, so that
// 64:ff9b::7f00:1 is loopback and 2002:c0a8:101::1 is 192.168.1.1. The
// local-use NAT64 prefix 64:ff9b:1::/48 is internal as a whole: where its
// IPv4 address sits depends on the length the operator chose for it
// (RFC 6052), so no one reading of it can be trusted.
func IsInternalAddr(a netip.Addr) bool {
	// A zone names an interface, not a network; left on, it hides the
	// address from every prefix (netip.Prefix.Contains is false for it).
	a = a.Unmap().WithZone("")
	if internalAddr(a) || nat64Local.Contains(a) {
		return true
	}
	for _, v4 := range embeddedIPv4(a) {
		if internalAddr(v4) {
			return true
		}
	}
	return false
}

func internalAddr(a netip.Addr) bool {
	return !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() ||
		a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() || a.IsMulticast() ||
		a.IsUnspecified() || cgnat.Contains(a) || thisNetwork.Contains(a) || siteLocal.Contains(a) || a == broadcast
}

var (
	cgnat       = netip.MustParsePrefix("100.64.0.0/10")
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	broadcast   = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	siteLocal   = netip.MustParsePrefix("fec0::/10")
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour   = netip.MustParsePrefix("2002::/16")
	teredo      = netip.MustParsePrefix("2001::/32")
	v4Compat    = netip.MustParsePrefix("::/96")
)

// embeddedIPv4 returns the IPv4 addresses an IPv6 address a reaches
// through a translator or tunnel: the NAT64 well-known prefix
// (64:ff9b::/96, RFC 6052) and the deprecated IPv4-compatible form
// (::/96, but :: and ::1) in the last 32 bits; 6to4 (2002::/16, RFC 3056)
// in bits 16 to 47; Teredo (2001::/32, RFC 4380) both its server (bits 32
// to 63) and its client (the last 32 bits, inverted). IPv4-mapped
// addresses are unmapped by the caller.
func embeddedIPv4(a netip.Addr) []netip.Addr {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	last := netip.AddrFrom4([4]byte(b[12:16]))
	switch {
	case nat64.Contains(a):
		return []netip.Addr{last}
	case v4Compat.Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
		return []netip.Addr{last}
	case sixToFour.Contains(a):
		return []netip.Addr{netip.AddrFrom4([4]byte(b[2:6]))}
	case teredo.Contains(a):
		return []netip.Addr{
			netip.AddrFrom4([4]byte(b[4:8])),
			netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}),
		}
	}
	return nil
}

// lists reports whether the allowlist names the server: host as the
// mailbox names it, addr and port where it is (or will be) reached. An
// allowlisted address covers its own form only: 127.0.0.1 does not cover
// 64:ff9b::7f00:1, which is a translator's loopback, not this host's.
func (p TransportPolicy) lists(host string, addr netip.Addr, port uint16) bool {
	addr = addr.Unmap()
	for _, n := range p.nets {
		if n.Contains(addr) {
			return true
		}
	}
	if p.addrPorts[netip.AddrPortFrom(addr, port)] {
		return true
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap() != addr && p.lists("", a, port)
	}
	host = strings.ToLower(host)
	return host != "" && (p.hosts[host] || p.hostPorts[hostPort{host, port}])
}

// DialRefusal says why an IMAP connection to host (as named by the
// mailbox) at the resolved address and port peer must not be made, or ""
// when it may: an internal address not allowlisted, or plain text (tls
// none) to an address that is neither loopback nor allowlisted. It is the
// dial-time half of the policy (CheckEndpoint is the ingest half).
func (p TransportPolicy) DialRefusal(host string, peer netip.AddrPort, tls TLSMode) string {
	addr := peer.Addr().Unmap().WithZone("") // as IsInternalAddr reads it
	listed := p.lists(host, addr, peer.Port())
	if IsInternalAddr(addr) && !listed {
		return "address " + addr.String() + " port " + strconv.Itoa(int(peer.Port())) + " is internal and not on the IMAP allowlist"
	}
	if tls != TLSImplicit && tls != TLSStartTLS && !listed && !addr.IsLoopback() {
		return "plain-text IMAP only to loopback or allowlisted servers"
	}
	return ""
}

// CheckEndpoint is the ingest half of the policy for a mailbox's endpoint
// (field paths relative to the imap object): tls none only to a loopback
// or allowlisted host, and an IP literal that is internal only when
// allowlisted. Host names are checked again when they are resolved.
func (p TransportPolicy) CheckEndpoint(ep IMAPEndpoint) Problems {
	var ps Problems
	a, err := netip.ParseAddr(ep.Host)
	literal := err == nil
	listed := p.lists(ep.Host, a, endpointPort(ep.Port))
	loopback := (literal && a.Unmap().IsLoopback()) || strings.EqualFold(ep.Host, "localhost")
	if literal && IsInternalAddr(a) && !listed {
		ps.Add("host", CodeEndpointRefused, "internal addresses are reached only when the operator allowlists them")
	}
	if ep.TLS == TLSNone && !loopback && !listed {
		ps.Add("tls", CodePlaintextRefused, "tls none is allowed only to loopback or allowlisted servers")
	}
	return ps
}

// CheckTransport applies p to an event's data: the endpoint of a
// mailbox.added (field paths relative to the data object). Other data
// passes.
func (p TransportPolicy) CheckTransport(d Data) Problems {
	m, ok := d.(*MailboxAdded)
	if !ok {
		return nil
	}
	return p.CheckEndpoint(m.IMAP).Prefixed("imap")
}

// endpointPort is ep.Port as a port number; outside 1 to 65535 (which
// validation refuses anyway) it is 0, a port no allowlist entry names.
func endpointPort(port int) uint16 {
	if port < 1 || port > 65535 {
		return 0
	}
	return uint16(port)
}
