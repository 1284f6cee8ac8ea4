package domain_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

func sealStub(plain, aad []byte) (domain.SealedSecret, error) {
	return domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "AAAA"}, nil
}

func addedFor(provider domain.Provider, ep domain.IMAPEndpoint) *domain.MailboxAdded {
	return &domain.MailboxAdded{MailboxID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", OrgID: "0190a5b2-4c5e-7b1a-9c3d-00000000a001",
		UserID: "0190a5b2-4c5e-7b1a-9c3d-00000000b001", Address: "ada@example.com", Provider: provider, IMAP: ep,
		Credentials: &domain.Credentials{Password: "dev-password"}}
}

// TestSealDataRefusesClientSealedAndMissingCredentials: only the sealer
// makes sealed credentials, and a mailbox.added always brings fresh ones.
func TestSealDataRefusesClientSealedAndMissingCredentials(t *testing.T) {
	t.Parallel()
	ep := domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: "ada"}
	copied := addedFor(domain.ProviderSMTPIMAP, ep)
	copied.Credentials = nil
	copied.SealedCredentials = &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "AAAA"}
	if ps := domain.RefuseSealed(copied); !ps.Has(domain.CodeSealedCredentialsRefused) {
		t.Errorf("client-supplied sealed credentials: %v", ps)
	}
	// Through the parse path producers' requests take, with a sealer.
	raw := `{"specversion":"1.0","id":"0190a5b2-4c5e-7b1a-9c3d-00000000e005","type":"mailplane.mailbox.added.v1","source":"/x",
		"data":{"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000c001","org_id":"0190a5b2-4c5e-7b1a-9c3d-00000000a001",
		"user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","address":"ada@example.com","provider":"smtp_imap",
		"imap":{"host":"attacker.example","port":143,"tls":"none","username":"ada@example.com"},
		"sealed_credentials":{"key_id":"k1","alg":"A256GCM","nonce":"AAAA","ciphertext":"AAAA"}}}`
	if _, ps := domain.ParseStructured([]byte(raw), time.Now(), sealStub); !ps.Has(domain.CodeSealedCredentialsRefused) {
		t.Errorf("parsed with a sealer: %v", ps)
	}
	if ev, ps := domain.ParseStructured([]byte(raw), time.Now(), nil); len(ps) > 0 || ev.Data == nil {
		t.Errorf("parsed as a log consumer: %v", ps)
	}
	both := addedFor(domain.ProviderSMTPIMAP, ep)
	both.SealedCredentials = copied.SealedCredentials
	if ps := domain.SealData(both, sealStub); !ps.Has(domain.CodeSealedCredentialsRefused) {
		t.Errorf("plain and sealed: %v", ps)
	}
	none := addedFor(domain.ProviderSMTPIMAP, ep)
	none.Credentials = nil
	if ps := domain.SealData(none, sealStub); !ps.Has(domain.CodeCredentialsRequired) {
		t.Errorf("no credentials: %v", ps)
	}
	ok := addedFor(domain.ProviderSMTPIMAP, ep)
	if ps := domain.SealData(ok, sealStub); len(ps) > 0 || ok.SealedCredentials == nil || ok.Credentials != nil {
		t.Errorf("fresh credentials: %v", ps)
	}
	// A log consumer (no sealer) reads sealed credentials as before.
	if ps := domain.SealData(copied, nil); len(ps) > 0 {
		t.Errorf("without a sealer: %v", ps)
	}
}

// TestSealDataFixesProviderEndpoints: gmail and outlook credentials are
// sealed only for their provider's IMAP endpoint.
func TestSealDataFixesProviderEndpoints(t *testing.T) {
	t.Parallel()
	cases := []struct {
		p     domain.Provider
		ep    domain.IMAPEndpoint
		field string
	}{
		{domain.ProviderGmail, domain.IMAPEndpoint{Host: "imap.gmail.com", Port: 993, TLS: domain.TLSImplicit, Username: "a"}, ""},
		{domain.ProviderOutlook, domain.IMAPEndpoint{Host: "outlook.office365.com", Port: 993, TLS: domain.TLSImplicit, Username: "a"}, ""},
		{domain.ProviderGmail, domain.IMAPEndpoint{Host: "attacker.example", Port: 993, TLS: domain.TLSImplicit, Username: "a"}, "imap.host"},
		{domain.ProviderGmail, domain.IMAPEndpoint{Host: "IMAP.GMAIL.COM.attacker.example", Port: 993, TLS: domain.TLSImplicit, Username: "a"}, "imap.host"},
		{domain.ProviderGmail, domain.IMAPEndpoint{Host: "imap.gmail.com", Port: 143, TLS: domain.TLSImplicit, Username: "a"}, "imap.port"},
		{domain.ProviderOutlook, domain.IMAPEndpoint{Host: "outlook.office365.com", Port: 993, TLS: domain.TLSNone, Username: "a"}, "imap.tls"},
		{domain.ProviderOutlook, domain.IMAPEndpoint{Host: "outlook.office365.com", Port: 993, TLS: domain.TLSStartTLS, Username: "a"}, "imap.tls"},
	}
	for _, c := range cases {
		m := addedFor(c.p, c.ep)
		ps := domain.SealData(m, sealStub)
		switch {
		case c.field == "" && len(ps) > 0:
			t.Errorf("%s %+v: %v", c.p, c.ep, ps)
		case c.field != "" && (len(ps) == 0 || ps[0].Code != domain.CodeProviderEndpoint || ps[0].Field != c.field):
			t.Errorf("%s %+v: %v; want provider_endpoint at %s", c.p, c.ep, ps, c.field)
		case c.field != "" && m.SealedCredentials != nil:
			t.Errorf("%s %+v: sealed although refused", c.p, c.ep)
		}
	}
}

func TestTransportPolicyEndpoint(t *testing.T) {
	t.Parallel()
	none := domain.TransportPolicy{}
	allow := domain.MustTransportPolicy("10.1.0.0/16, imap.corp.internal ,192.168.7.7")
	cases := []struct {
		p    domain.TransportPolicy
		host string
		tls  domain.TLSMode
		code domain.Code
	}{
		{none, "imap.example.com", domain.TLSImplicit, ""},
		{none, "imap.example.com", domain.TLSStartTLS, ""},
		{none, "imap.example.com", domain.TLSNone, domain.CodePlaintextRefused},
		{none, "127.0.0.1", domain.TLSNone, domain.CodeEndpointRefused}, // loopback is internal: allowlist it
		{none, "10.1.2.3", domain.TLSImplicit, domain.CodeEndpointRefused},
		{none, "169.254.169.254", domain.TLSImplicit, domain.CodeEndpointRefused},
		{none, "100.64.1.1", domain.TLSImplicit, domain.CodeEndpointRefused},
		{none, "0.0.0.0", domain.TLSImplicit, domain.CodeEndpointRefused},
		{none, "224.0.0.1", domain.TLSImplicit, domain.CodeEndpointRefused},
		{none, "8.8.8.8", domain.TLSImplicit, ""},
		{allow, "10.1.2.3", domain.TLSNone, ""},
		{allow, "10.2.2.3", domain.TLSImplicit, domain.CodeEndpointRefused},
		{allow, "imap.corp.internal", domain.TLSNone, ""},
		{allow, "IMAP.CORP.INTERNAL", domain.TLSNone, ""},
		{allow, "192.168.7.7", domain.TLSNone, ""},
		{allow, "192.168.7.8", domain.TLSImplicit, domain.CodeEndpointRefused},
		{domain.MustTransportPolicy("127.0.0.1"), "127.0.0.1", domain.TLSNone, ""},
		// IPv6 forms of internal IPv4 addresses are internal: NAT64
		// (well-known and local-use), 6to4, IPv4-compatible, Teredo.
		{none, "64:ff9b::7f00:1", domain.TLSImplicit, domain.CodeEndpointRefused},                      // 127.0.0.1
		{none, "64:ff9b::a9fe:a9fe", domain.TLSImplicit, domain.CodeEndpointRefused},                   // 169.254.169.254
		{none, "64:ff9b::10.1.2.3", domain.TLSImplicit, domain.CodeEndpointRefused},                    // private
		{none, "64:ff9b::6440:101", domain.TLSImplicit, domain.CodeEndpointRefused},                    // CGNAT 100.64.1.1
		{none, "64:ff9b:1::5db8:d822", domain.TLSImplicit, domain.CodeEndpointRefused},                 // local-use prefix: internal whatever it carries
		{none, "64:ff9b:1:7f00:1::", domain.TLSImplicit, domain.CodeEndpointRefused},                   // 127.0.0.1 in a /48 embedding
		{none, "2002:c0a8:101::1", domain.TLSImplicit, domain.CodeEndpointRefused},                     // 192.168.1.1
		{none, "2002:a9fe:a9fe::", domain.TLSImplicit, domain.CodeEndpointRefused},                     // 169.254.169.254
		{none, "2002:7f00:1::1", domain.TLSImplicit, domain.CodeEndpointRefused},                       // 127.0.0.1
		{none, "::7f00:1", domain.TLSImplicit, domain.CodeEndpointRefused},                             // IPv4-compatible 127.0.0.1
		{none, "::ffff:a9fe:a9fe", domain.TLSImplicit, domain.CodeEndpointRefused},                     // IPv4-mapped 169.254.169.254
		{none, "2001:0:4136:e378:8000:63bf:80ff:fffe", domain.TLSImplicit, domain.CodeEndpointRefused}, // Teredo, client 127.0.0.1
		{none, "2001:0:a00:1::1", domain.TLSImplicit, domain.CodeEndpointRefused},                      // Teredo, server 10.0.0.1
		{none, "fec0::1", domain.TLSImplicit, domain.CodeEndpointRefused},                              // site-local
		{none, "0.1.2.3", domain.TLSImplicit, domain.CodeEndpointRefused},                              // "this network"
		// The same forms of public addresses stay public.
		{none, "64:ff9b::5db8:d822", domain.TLSImplicit, ""}, // 93.184.216.34
		{none, "2002:5db8:d822::1", domain.TLSImplicit, ""},
		{none, "2001:0:4136:e378:8000:63bf:a247:27dd", domain.TLSImplicit, ""}, // client 93.184.216.34
		{none, "2606:2800:220:1:248:1893:25c8:1946", domain.TLSImplicit, ""},
		// Allowlisting an IPv4 address does not allowlist a translator's
		// form of it; the form itself can be allowlisted.
		{domain.MustTransportPolicy("127.0.0.0/8"), "64:ff9b::7f00:1", domain.TLSImplicit, domain.CodeEndpointRefused},
		{domain.MustTransportPolicy("64:ff9b::/96"), "64:ff9b::a00:1", domain.TLSImplicit, ""},
		// An entry with a port allows that port only (the cases are on
		// 993); bare entries allow every port.
		{domain.MustTransportPolicy("127.0.0.1:1143"), "127.0.0.1", domain.TLSNone, domain.CodeEndpointRefused},
		{domain.MustTransportPolicy("127.0.0.1:993"), "127.0.0.1", domain.TLSNone, ""},
		{domain.MustTransportPolicy("[::1]:993"), "::1", domain.TLSNone, ""},
		{domain.MustTransportPolicy("[::1]:1143"), "::1", domain.TLSNone, domain.CodeEndpointRefused},
		{domain.MustTransportPolicy("imap.corp.internal:1143"), "imap.corp.internal", domain.TLSNone, domain.CodePlaintextRefused},
		{domain.MustTransportPolicy("imap.corp.internal:993"), "imap.corp.internal", domain.TLSNone, ""},
	}
	for _, c := range cases {
		ps := c.p.CheckEndpoint(domain.IMAPEndpoint{Host: c.host, Port: 993, TLS: c.tls, Username: "a"})
		if (c.code == "") != (len(ps) == 0) || (c.code != "" && !ps.Has(c.code)) {
			t.Errorf("%s tls %s under %q: %v; want %q", c.host, c.tls, c.p, ps, c.code)
		}
	}
	if _, err := domain.ParseTransportPolicy("10.0.0.0/33"); err == nil {
		t.Error("bad CIDR accepted")
	}
	for _, bad := range []string{"bad host!", "127.0.0.1:0", "127.0.0.1:65536", "imap.corp.internal:", "imap.corp.internal:+993",
		"imap.corp.internal:99x", ":993", "::1:993:x", "[::1]", "[fe80::1%eth0]:993"} {
		if _, err := domain.ParseTransportPolicy(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	p := domain.MustTransportPolicy(" 10.0.0.0/8, imap.corp.internal, IMAP.Other:1143, 127.0.0.1:1143, [::1]:1143, [::ffff:127.0.0.2]:1143 ")
	if got, want := p.String(), "10.0.0.0/8,127.0.0.1:1143,127.0.0.2:1143,[::1]:1143,imap.corp.internal,imap.other:1143"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestTransportPolicyDialPort: an entry with a port allows that port of
// the address or host name it names, and no other, at dial time too (a
// host name resolving to an allowlisted address on another port);
// entries without one allow every port, as MAILPLANE_IMAP_ALLOW always
// did.
func TestTransportPolicyDialPort(t *testing.T) {
	t.Parallel()
	dev := domain.MustTransportPolicy("127.0.0.1:1143")
	cases := []struct {
		p      domain.TransportPolicy
		host   string
		peer   string
		tls    domain.TLSMode
		refuse bool
	}{
		{dev, "127.0.0.1", "127.0.0.1:1143", domain.TLSNone, false},
		{dev, "localhost", "127.0.0.1:1143", domain.TLSNone, false},
		{dev, "127.0.0.1", "127.0.0.1:5432", domain.TLSNone, true},
		{dev, "127.0.0.1", "127.0.0.1:9090", domain.TLSImplicit, true},
		{dev, "rebind.example.com", "127.0.0.1:6379", domain.TLSImplicit, true},
		{dev, "127.0.0.2", "127.0.0.2:1143", domain.TLSNone, true},
		{dev, "rebind.example.com", "[::ffff:127.0.0.1]:1143", domain.TLSNone, false},
		{dev, "rebind.example.com", "[::1]:1143", domain.TLSNone, true},
		{domain.MustTransportPolicy("imap.corp.internal:993"), "imap.corp.internal", "10.9.9.9:993", domain.TLSNone, false},
		{domain.MustTransportPolicy("imap.corp.internal:993"), "imap.corp.internal", "10.9.9.9:22", domain.TLSImplicit, true},
		{domain.MustTransportPolicy("imap.corp.internal:993"), "IMAP.CORP.INTERNAL", "10.9.9.9:993", domain.TLSImplicit, false},
		// Backward compatible: a bare address, network or name, any port.
		{domain.MustTransportPolicy("127.0.0.1"), "127.0.0.1", "127.0.0.1:5432", domain.TLSNone, false},
		{domain.MustTransportPolicy("10.0.0.0/8"), "imap.corp.internal", "10.9.9.9:22", domain.TLSNone, false},
		{domain.MustTransportPolicy("imap.corp.internal"), "imap.corp.internal", "10.9.9.9:22", domain.TLSNone, false},
	}
	for _, c := range cases {
		why := c.p.DialRefusal(c.host, netip.MustParseAddrPort(c.peer), c.tls)
		if (why != "") != c.refuse {
			t.Errorf("%s at %s tls %s under %q: refusal %q, want refused %v", c.host, c.peer, c.tls, c.p, why, c.refuse)
		}
	}
}

// TestTransportPolicyDial is the dial-time half, on resolved addresses: a
// public host name resolving to an internal address is refused.
func TestTransportPolicyDial(t *testing.T) {
	t.Parallel()
	none := domain.TransportPolicy{}
	loop := domain.MustTransportPolicy("127.0.0.0/8")
	cases := []struct {
		p      domain.TransportPolicy
		host   string
		addr   string
		tls    domain.TLSMode
		refuse bool
	}{
		{none, "imap.example.com", "93.184.216.34", domain.TLSImplicit, false},
		{none, "imap.example.com", "93.184.216.34", domain.TLSNone, true},
		{none, "rebind.example.com", "127.0.0.1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "169.254.169.254", domain.TLSImplicit, true},
		{none, "rebind.example.com", "::ffff:10.0.0.1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "fd00::1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "fe80::1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "::1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "::", domain.TLSImplicit, true},
		{none, "rebind.example.com", "ff02::1", domain.TLSImplicit, true},
		{loop, "localhost", "127.0.0.1", domain.TLSNone, false},
		{loop, "imap.example.com", "93.184.216.34", domain.TLSNone, true},
		{domain.MustTransportPolicy("imap.corp.internal"), "imap.corp.internal", "10.9.9.9", domain.TLSNone, false},
		// A public name resolving to an IPv6 form of an internal IPv4
		// address (a DNS64 answer, 6to4, IPv4-compatible, Teredo).
		{none, "rebind.example.com", "64:ff9b::7f00:1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "64:ff9b::a9fe:a9fe", domain.TLSImplicit, true},
		{none, "rebind.example.com", "64:ff9b::c0a8:101", domain.TLSImplicit, true},
		{none, "rebind.example.com", "64:ff9b:1::a00:1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "2002:c0a8:101::1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "2002:a9fe:a9fe::1", domain.TLSImplicit, true},
		{none, "rebind.example.com", "::a9fe:a9fe", domain.TLSImplicit, true},
		{none, "rebind.example.com", "2001:0:4136:e378:8000:63bf:80ff:fffe", domain.TLSImplicit, true},
		{none, "imap.example.com", "64:ff9b::5db8:d822", domain.TLSImplicit, false},
		{none, "imap.example.com", "2002:5db8:d822::1", domain.TLSImplicit, false},
		{loop, "rebind.example.com", "64:ff9b::7f00:1", domain.TLSImplicit, true},
		// With a zone (an address read from a connection, a hosts file):
		// the zone said nothing about internal, but it hid the address
		// from every prefix (netip.Prefix.Contains is false for a zoned
		// address), so these were public.
		{none, "rebind.example.com", "64:ff9b::7f00:1%eth0", domain.TLSImplicit, true},
		{none, "rebind.example.com", "64:ff9b:1::a00:1%eth0", domain.TLSImplicit, true},
		{none, "rebind.example.com", "2002:c0a8:101::1%eth0", domain.TLSImplicit, true},
		{none, "rebind.example.com", "::a9fe:a9fe%eth0", domain.TLSImplicit, true},
		{none, "rebind.example.com", "fec0::1%eth0", domain.TLSImplicit, true},
		{none, "rebind.example.com", "2001:0:4136:e378:8000:63bf:80ff:fffe%eth0", domain.TLSImplicit, true},
		{none, "rebind.example.com", "fe80::1%eth0", domain.TLSImplicit, true},
		{domain.MustTransportPolicy("fe80::/10"), "rebind.example.com", "fe80::1%eth0", domain.TLSImplicit, false},
	}
	for _, c := range cases {
		why := c.p.DialRefusal(c.host, netip.AddrPortFrom(netip.MustParseAddr(c.addr), 993), c.tls)
		if (why != "") != c.refuse {
			t.Errorf("%s at %s tls %s under %q: refusal %q, want refused %v", c.host, c.addr, c.tls, c.p, why, c.refuse)
		}
	}
}
