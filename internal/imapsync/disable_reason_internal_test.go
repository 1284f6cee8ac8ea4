package imapsync

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// A server's refusal text with characters no event text may hold (CR/LF
// forging a line, ESC, a tab, NUL, invalid UTF-8) still makes a
// mailbox.disabled that validates, so the mailbox is disabled.
func TestDisableReasonIsEventText(t *testing.T) {
	t.Parallel()
	since := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, text := range []string{"Invalid credentials\r\nforged: line", "\x1b[2J\tbad\x00", "bad \xff byte \u202e"} {
		d := DisableRequest{MailboxID: "00000002-0000-4000-8000-000000000001", AuthFailingSince: since, Reason: text, At: since.Add(time.Hour)}
		reason := disableReason(d)
		ev := domain.Event{ID: "0190a5b2-4c5e-7b1a-9c3d-00000000e001", Type: domain.TypeMailboxDisabled, Source: warmupSource, Time: d.At,
			Data: &domain.MailboxDisabled{MailboxID: d.MailboxID, Cause: domain.DisableAuthFailing, Reason: reason, FailingSince: &since}}
		if ps := ev.Validate(); len(ps) > 0 {
			t.Errorf("%+q: the mailbox.disabled does not validate: %s", text, ps)
		}
	}
}
