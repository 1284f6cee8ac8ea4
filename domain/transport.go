package domain

import (
	"net/netip"
	"strings"
)

// Where a mailbox's credentials may be sent (docs/design.md section 11,
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
// link-local, ...), and to which plain text (tls none) may be sent. The
// zero value allows no internal address and plain text to none.
type TransportPolicy struct {
	hosts map[string]bool
	nets  []netip.Prefix
}

// ParseTransportPolicy parses a comma-separated allowlist of CIDRs
// ("10.1.0.0/16"), IP addresses and host names ("imap.internal").
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
		default:
			if a, err := netip.ParseAddr(part); err == nil {
				p.nets = append(p.nets, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
				continue
			}
			if !isHost(part) {
				return TransportPolicy{}, Errorf(CodeInvalid, "IMAP allowlist entry %q is neither a CIDR, an IP address nor a host name", part)
			}
			if p.hosts == nil {
				p.hosts = map[string]bool{}
			}
			p.hosts[strings.ToLower(part)] = true
		}
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

// String renders the allowlist (for logs).
func (p TransportPolicy) String() string {
	var parts []string
	for _, n := range p.nets {
		parts = append(parts, n.String())
	}
	for h := range p.hosts {
		parts = append(parts, h)
	}
	return strings.Join(parts, ",")
}

// IsInternalAddr reports whether a is an address outbound IMAP must not
// reach unless allowlisted: loopback, private (RFC 1918, ULA), CGNAT
// (100.64.0.0/10), link-local (cloud metadata at 169.254.169.254),
// unspecified, multicast, and the IPv4-mapped forms of all of them.
func IsInternalAddr(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() ||
		a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() || a.IsMulticast() ||
		a.IsUnspecified() || cgnat.Contains(a) || a == broadcast
}

var (
	cgnat     = netip.MustParsePrefix("100.64.0.0/10")
	broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})
)

func (p TransportPolicy) listsAddr(a netip.Addr) bool {
	a = a.Unmap()
	for _, n := range p.nets {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

func (p TransportPolicy) listsHost(host string) bool {
	if a, err := netip.ParseAddr(host); err == nil {
		return p.listsAddr(a)
	}
	return p.hosts[strings.ToLower(host)]
}

// DialRefusal says why an IMAP connection to host (as named by the
// mailbox) at the resolved address addr must not be made, or "" when it
// may: an internal address not allowlisted, or plain text (tls none) to an
// address that is neither loopback nor allowlisted. It is the dial-time
// half of the policy (CheckEndpoint is the ingest half).
func (p TransportPolicy) DialRefusal(host string, addr netip.Addr, tls TLSMode) string {
	addr = addr.Unmap()
	listed := p.listsAddr(addr) || p.listsHost(host)
	if IsInternalAddr(addr) && !listed {
		return "address " + addr.String() + " is internal and not on the IMAP allowlist"
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
	listed := p.listsHost(ep.Host)
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
