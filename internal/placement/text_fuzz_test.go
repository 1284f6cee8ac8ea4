package placement_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/placement"
)

// FuzzDecisionsStorable: whatever text an input carries, the decider only
// ever sees inputs that validate (ingest and every consumer refuse the
// rest), and every decision it makes from them validates too, so it encodes
// and every projection can store it: no string the decider can emit holds a
// character Postgres or a viewer cannot take. The seeds run with go test;
// `make fuzz` explores further.
func FuzzDecisionsStorable(f *testing.F) {
	for _, s := range []string{"10.0.0.1:25", "10.0.0.1:25\x00", "a\r\nb", "\xff", "\u202e", "'); DROP TABLE x;--", "é\u0301😀\u200f", "\uFEFF"} {
		f.Add(s, s, s)
	}
	f.Fuzz(func(t *testing.T, address, source, reason string) {
		st := placement.NewState(placement.DefaultConfig())
		at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		org, mailbox, worker := "00000003-0000-4000-8000-000000000001", "00000002-0000-4000-8000-000000000001", "00000001-0000-4000-8000-000000000001"
		inputs := []domain.Data{
			&domain.OrgPlanChanged{OrgID: org, Plan: domain.PlanPremium, Paid: true, Source: source},
			&domain.WorkerHeartbeat{WorkerID: worker, Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: address},
			&domain.OrgPlanChanged{OrgID: org, Plan: domain.PlanPremium, Paid: true, Source: "billing"},
			&domain.WorkerHeartbeat{WorkerID: worker, Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: "10.0.0.1:25"},
			&domain.MailboxAdded{MailboxID: mailbox, OrgID: org, UserID: org, Address: "a@b.c", Provider: domain.ProviderGmail,
				IMAP:              domain.IMAPEndpoint{Host: "imap.gmail.com", Port: 993, TLS: domain.TLSImplicit, Username: "a@b.c"},
				SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "AAAA"}},
			&domain.WorkerHeartbeat{WorkerID: worker, Tier: domain.TierSharedPremium, Egress: domain.EgressOAuthAPI, Address: address},
			&domain.MailboxRemoved{MailboxID: mailbox, Reason: reason},
		}
		for i, d := range inputs {
			if len(d.Validate()) > 0 {
				continue // refused at ingest and by every consumer
			}
			at = at.Add(time.Second)
			for _, dec := range st.Apply(placement.Input{At: at, Event: d}) {
				if ps := dec.Validate(); len(ps) > 0 {
					t.Fatalf("input %d: the decider made a decision that does not validate: %s: %s", i, dec.EventType(), ps)
				}
				b, err := json.Marshal(dec)
				if err != nil {
					t.Fatal(err)
				}
				back, err := domain.DecodePlacementDecision(dec.EventType(), b)
				if err != nil {
					t.Fatalf("input %d: %s does not read back: %v", i, dec.EventType(), err)
				}
				if b2, _ := json.Marshal(back); string(b2) != string(b) {
					t.Fatalf("input %d: %s reads back as %s, wrote %s", i, dec.EventType(), b2, b)
				}
			}
		}
	})
}
