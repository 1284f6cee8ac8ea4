package ownership

import (
	"testing"

	"github.com/google/uuid"

	"github.com/mailplane/mailplane/domain"
)

// BenchmarkDecide: one ingest request of 1,000 mailbox.added (the
// importer's batch): new mailboxes (every claim written) and the same
// mailboxes again (locks and reads only).
func BenchmarkDecide(b *testing.B) {
	s, _ := newStoreTB(b)
	org := uuid.NewString()
	batch := func() []domain.Event {
		evs := make([]domain.Event, 1000)
		for i := range evs {
			evs[i] = added("/alpha", uuid.NewString(), org)
		}
		return evs
	}
	b.Run("new", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			evs := batch()
			b.StartTimer()
			if r, err := s.Decide(b.Context(), alpha, evs); err != nil || r != nil {
				b.Fatal(r, err)
			}
		}
	})
	b.Run("again", func(b *testing.B) {
		evs := batch()
		if _, err := s.Decide(b.Context(), alpha, evs); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if r, err := s.Decide(b.Context(), alpha, evs); err != nil || r != nil {
				b.Fatal(r, err)
			}
		}
	})
}
