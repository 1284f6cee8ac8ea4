package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/producer"
)

// Owners decides who may change what (domain/ownership.go);
// *ownership.Guard is one. Check runs before anything is produced, with
// the authenticated caller, and records the claims of what it lets
// through; Landed runs with the events the log acknowledged.
type Owners interface {
	Check(ctx context.Context, caller *domain.Caller, events []domain.Event) error
	Landed(ctx context.Context, caller *domain.Caller, events []domain.Event)
}

// OwnershipAdmission is the admission of o: a request acting on a mailbox
// or org of another tenant is refused whole, 403 not_owner, and nothing
// is produced. Requests of events without an ownership effect
// (heartbeats, user.active) never reach o's database.
func OwnershipAdmission(o Owners) Admission {
	return func(ctx context.Context, events []domain.Event) error {
		return o.Check(ctx, CallerFrom(ctx), events)
	}
}

// OwnershipProducer wraps p so that o hears of the events the log
// acknowledged, with the caller of the request (a removal frees its
// mailbox only once it is on the log). The produce's context carries the
// request's values (ingest detaches only its cancellation).
func OwnershipProducer(p Producer, o Owners) Producer { return ownedProducer{p, o} }

type ownedProducer struct {
	Producer
	owners Owners
}

// ProduceRecords produces through the wrapped producer, then hands o the
// events whose records carry an offset (ingest sets -1 before producing,
// so an offset means the broker acknowledged that record).
func (p ownedProducer) ProduceRecords(ctx context.Context, events []domain.Event, recs []*kgo.Record) ([]producer.Receipt, error) {
	rs, err := p.Producer.ProduceRecords(ctx, events, recs)
	var landed []domain.Event
	for i, r := range recs {
		if r != nil && r.Offset >= 0 && i < len(events) {
			landed = append(landed, events[i])
		}
	}
	if len(landed) > 0 {
		p.owners.Landed(ctx, CallerFrom(ctx), landed)
	}
	return rs, err
}

// Admissions runs each admission in turn; the first refusal refuses the
// request and the later ones do not run. Put those that record something
// (OwnershipAdmission) last, so that a request another one refuses
// records nothing.
func Admissions(as ...Admission) Admission {
	return func(ctx context.Context, events []domain.Event) error {
		for _, a := range as {
			if a == nil {
				continue
			}
			if err := a(ctx, events); err != nil {
				return err
			}
		}
		return nil
	}
}

// writeAdmissionError writes an admission's refusal: WriteDomainError's
// response, with each problem at the index of its event when the error
// says which (an EventIndexes method, one index per problem, as
// ownership's refusals have), so a client such as mailplane import sets
// aside the right rows.
func writeAdmissionError(w http.ResponseWriter, err error) {
	var de *domain.Error
	var ix interface{ EventIndexes() []int }
	if !errors.As(err, &de) || !errors.As(err, &ix) || len(ix.EventIndexes()) != len(de.Problems) || de.Code == domain.CodeInternal {
		WriteDomainError(w, err)
		return
	}
	resp := ErrorResponse{Error: ErrorInfo{Code: de.Code, Message: de.Message}}
	for i, p := range de.Problems {
		resp.Problems = append(resp.Problems, Problem{Index: ix.EventIndexes()[i], Field: p.Field, Code: p.Code, Message: p.Message})
	}
	WriteJSON(w, StatusOf(de.Code), resp)
}
