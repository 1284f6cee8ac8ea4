package roles

import (
	"context"
	"flag"
	"net/netip"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/placement"
)

// TestDevModeAllowlistsOnlyItsIMAPPort: dev mode's roles get its own IMAP
// server's address and port on the allowlist, not every port of
// 127.0.0.1 (where its Postgres, broker and ops listener also are), on top
// of the operator's MAILPLANE_IMAP_ALLOW, whose bare entries still allow
// every port.
func TestDevModeAllowlistsOnlyItsIMAPPort(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := devfleet.Start(ctx, devfleet.WithAddr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(sctx)
	})
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	f := registerDevFlags(fs)
	if err := fs.Parse([]string{"--imap-allow", "10.0.0.0/8"}); err != nil {
		t.Fatal(err)
	}
	e := &devEnv{f: f, imap: srv}
	rc, err := e.roleConfig(placement.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tr := rc.imapTransport
	imap := netip.MustParseAddrPort(srv.Addr())
	if why := tr.DialRefusal("127.0.0.1", imap, domain.TLSNone); why != "" {
		t.Fatalf("dev IMAP server %s refused: %s", imap, why)
	}
	if ps := tr.CheckEndpoint(domain.IMAPEndpoint{Host: "127.0.0.1", Port: int(imap.Port()), TLS: domain.TLSNone, Username: "a"}); len(ps) > 0 {
		t.Fatalf("dev IMAP endpoint refused at ingest: %v", ps)
	}
	others := []uint16{imap.Port() + 1, 5432, 6379, uint16(*f.kafkaPort), uint16(*f.pgPort)}
	if ops, err := netip.ParseAddrPort(*f.opsAddr); err == nil {
		others = append(others, ops.Port())
	}
	for _, port := range others {
		if port == imap.Port() {
			continue
		}
		other := netip.AddrPortFrom(imap.Addr(), port)
		if why := tr.DialRefusal("127.0.0.1", other, domain.TLSImplicit); why == "" {
			t.Errorf("dial to %s allowed", other)
		}
		if why := tr.DialRefusal("localhost", other, domain.TLSNone); why == "" {
			t.Errorf("dial to localhost at %s allowed", other)
		}
		if ps := tr.CheckEndpoint(domain.IMAPEndpoint{Host: "127.0.0.1", Port: int(port), TLS: domain.TLSImplicit, Username: "a"}); !ps.Has(domain.CodeEndpointRefused) {
			t.Errorf("endpoint 127.0.0.1:%d at ingest: %v", port, ps)
		}
	}
	if why := tr.DialRefusal("imap.corp.internal", netip.MustParseAddrPort("10.1.2.3:143"), domain.TLSNone); why != "" {
		t.Errorf("the operator's entry lost: %s", why)
	}
}
