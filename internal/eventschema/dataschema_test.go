package eventschema_test

import (
	"encoding/base64"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/examples"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/topics"
)

// Every record mailplane writes names its schema in ce_dataschema. The
// derived records (every decision type, mailbox.state, sync.tier and the
// sync.audit types) are checked by checkDataSchema in the conformance
// tests, which write them through the code's own encoders and fail when a
// type is not seen; this test covers the domain events, written by
// producers through the API or the Go client and by mailplane's roles
// (health_scored, warmup_observed, credentials_rotated), all through
// topics.Encode. A producer's own dataschema is kept.
func TestEveryDomainEventNamesItsSchema(t *testing.T) {
	t.Parallel()
	keys, err := sealing.ParseKeys("test:"+base64.StdEncoding.EncodeToString(make([]byte, sealing.KeySize)), "")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2024, 7, 12, 7, 0, 0, 0, time.UTC)
	seen := 0
	for _, typ := range domain.EventTypes() {
		raw, err := examples.Event(typ)
		if err != nil {
			t.Fatal(err)
		}
		seal := keys.Seal
		if domain.FromRolesOnly(typ) {
			seal = nil // its example is the log form, sealed already
		}
		ev, ps := domain.ParseStructured(raw, now, seal)
		if len(ps) > 0 {
			t.Fatalf("%s: %s", typ, ps)
		}
		ev.DataSchema = ""
		r, err := topics.Encode(ev)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		checkDataSchema(t, r, typ)
		seen++

		const own = "https://schemas.example.org/producer/own.json"
		ev.DataSchema = own
		if r, err = topics.Encode(ev); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if got, _ := topics.Header(r, topics.HeaderDataSchema); got != own {
			t.Errorf("%s: a producer's dataschema %q became %q", typ, own, got)
		}
	}
	if seen == 0 || seen != len(domain.EventTypes()) {
		t.Fatalf("checked %d of %d event types", seen, len(domain.EventTypes()))
	}
}
