package placement

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// TestOwnershipTransfersDecideNothing: the owner_transferred types are on
// the engine's input topics; ownership is the API's (internal/ownership),
// so the decider passes them by, whatever mailbox or org they name.
func TestOwnershipTransfersDecideNothing(t *testing.T) {
	t.Parallel()
	s := NewState(DefaultConfig())
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	const mb, org = "0190a5b2-4c5e-7b1a-9c3d-00000000c001", "0190a5b2-4c5e-7b1a-9c3d-00000000a001"
	s.Apply(Input{At: at, Event: &domain.MailboxAdded{MailboxID: mb, OrgID: org, UserID: mb, Provider: domain.ProviderSMTPIMAP}})
	for _, d := range []domain.Data{
		&domain.MailboxOwnerTransferred{MailboxID: mb, Owner: "/beta", Comment: "c"},
		&domain.OrgOwnerTransferred{OrgID: org, Owner: "/beta", Comment: "c"},
	} {
		if ds := s.Apply(Input{At: at.Add(time.Second), Event: d}); len(ds) != 0 {
			t.Errorf("%T decided %v", d, ds)
		}
	}
}
