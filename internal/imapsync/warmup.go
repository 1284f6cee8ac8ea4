package imapsync

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/textproto"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/outbox"
	"github.com/mailplane/mailplane/topics"
)

// DefaultWarmupHeader is the header warmup messages carry:
//
//	X-Mailplane-Warmup: mailbox=<sending mailbox id>; id=<warmup id>[; sig=<signature>]
//
// The id is 1-128 of [A-Za-z0-9._-], unique per message of the sender; see
// domain.FormatWarmupHeader for the signature.
const DefaultWarmupHeader = "X-Mailplane-Warmup"

// warmupTag is a recognised warmup header.
type warmupTag struct {
	sender string
	id     string
}

// warmupMax is the most of a message's warmup header section that is
// fetched (a partial FETCH) and read: the header is one line of about 200
// bytes, and a server's longer answer is cut here, not held.
const warmupMax = 4096

// parseWarmup reads the warmup header out of a fetched header section,
// streamed from r (at most warmupMax bytes of it are read; the caller
// discards the rest). The outcome is "" when the header is absent, else
// one of domain's WarmupValid, WarmupMalformed, WarmupUnsigned,
// WarmupForged; tag is set only when valid.
func parseWarmup(r io.Reader, header string, key []byte) (tag *warmupTag, outcome string) {
	// A header section ends with an empty line; one is added after the
	// section (a section that has one already ends the parse before it).
	br := bufio.NewReaderSize(io.MultiReader(io.LimitReader(r, warmupMax), strings.NewReader("\r\n\r\n")), 512)
	for {
		b, err := br.ReadByte()
		if err != nil {
			return nil, "" // nothing but white space: no header
		}
		if b != ' ' && b != '\t' && b != '\r' && b != '\n' {
			_ = br.UnreadByte()
			break
		}
	}
	h, err := textproto.NewReader(br).ReadMIMEHeader()
	if err != nil && len(h) == 0 {
		return nil, domain.WarmupMalformed
	}
	vs := h.Values(header)
	if len(vs) == 0 {
		return nil, ""
	}
	sender, id, outcome := domain.ParseWarmupHeader(vs[0], key)
	if outcome != domain.WarmupValid {
		return nil, outcome
	}
	return &warmupTag{sender: sender, id: id}, outcome
}

// seenSQL records the warmup messages not reported before and returns them.
const seenSQL = `INSERT INTO imap_warmup_seen (sender_mailbox_id, warmup_id, recipient_mailbox_id, placement, landed_at, seen_at)
SELECT u.sender, u.id, $1, u.placement, u.landed, $2
FROM unnest($3::uuid[], $4::text[], $5::text[], $6::timestamptz[]) AS u(sender, id, placement, landed)
ON CONFLICT (sender_mailbox_id, warmup_id) DO NOTHING
RETURNING sender_mailbox_id::text, warmup_id, placement, landed_at`

// observeWarmup records the batch's warmup messages found in an inbox or
// junk folder and queues a warmup_observed for each one not seen before,
// in tx (the batch's fenced transaction).
func (m *mailboxRun) observeWarmup(ctx context.Context, tx pgx.Tx, c cursor, batch []message) (int, error) {
	var placement domain.WarmupPlacement
	switch c.role {
	case RoleInbox:
		placement = domain.PlacedInbox
	case RoleJunk:
		placement = domain.PlacedJunk
	default:
		return 0, nil
	}
	var senders, ids, places []string
	var landed []time.Time
	seen := map[warmupTag]bool{}
	for _, b := range batch {
		if b.warmup == nil || seen[*b.warmup] {
			continue
		}
		seen[*b.warmup] = true
		senders = append(senders, b.warmup.sender)
		ids = append(ids, b.warmup.id)
		places = append(places, string(placement))
		landed = append(landed, b.internalDate)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	now := m.r.cfg.Now().UTC()
	rows, err := tx.Query(ctx, seenSQL, m.job.Mailbox.MailboxID, now, senders, ids, places, landed)
	if err != nil {
		return 0, err
	}
	var (
		recs              []*kgo.Record
		sender, id, place string
		at                time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&sender, &id, &place, &at}, func() error {
		ev := domain.Event{ID: domain.NewEventID(), Type: domain.TypeWarmupObserved, Source: warmupSource,
			Time: now, Subject: sender, Data: &domain.WarmupObserved{MailboxID: sender, WarmupID: id,
				Placement: domain.WarmupPlacement(place), LandedAt: at.UTC(), Source: domain.ObservedBySync,
				RecipientMailboxID: m.job.Mailbox.MailboxID}}
		r, err := topics.Encode(ev)
		if err != nil {
			return err
		}
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(recs), outbox.Add(ctx, tx, recs...)
}

const warmupSource = "mailplane/imap-sync"

// PruneWarmupSeen deletes the record of warmup messages reported before
// before, and returns how many it deleted. Prune only past the health
// scoring window: a message seen again after its record is gone would be
// reported again.
func PruneWarmupSeen(ctx context.Context, db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, before time.Time) (int64, error) {
	tag, err := db.Exec(ctx, `DELETE FROM imap_warmup_seen WHERE seen_at < $1`, before)
	if err != nil {
		return 0, fmt.Errorf("imapsync: prune warmup seen: %w", err)
	}
	return tag.RowsAffected(), nil
}
