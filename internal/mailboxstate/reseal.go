package mailboxstate

import (
	"context"
	"log/slog"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// ResealResult counts what Reseal did: the live mailboxes it read, those
// it re-sealed, those already under the active key, and those whose
// credentials did not open.
type ResealResult struct{ Live, Resealed, Current, Failed int }

// resealBatch bounds the events of one produce.
const resealBatch = 500

// Reseal re-seals, under the keyring's active key, the credentials of
// every live mailbox in mailbox.state sealed with another key, and
// publishes one credentials_rotated per mailbox through pc (`mailplane
// credentials reseal`). The plain text lives only between Open and Seal,
// and is wiped. Credentials that do not open (a key missing from the
// keyring, or sealed for another endpoint) are counted and logged, never
// re-sealed.
func Reseal(ctx context.Context, kcfg kafka.Config, keyring *sealing.Keyring, pc *producer.Client, log *slog.Logger) (ResealResult, error) {
	var res ResealResult
	live, bad, err := ReadLive(ctx, kcfg, kcfg.Topic(topics.MailboxState), log)
	if err != nil {
		return res, err
	}
	if bad > 0 {
		log.Warn("mailbox.state records that do not decode were skipped", "count", bad)
	}
	res.Live = len(live)
	var batch []domain.Event
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if _, err := pc.Publish(ctx, batch...); err != nil {
			return err
		}
		res.Resealed += len(batch)
		batch = batch[:0]
		return nil
	}
	for id, m := range live {
		if m.SealedCredentials == nil {
			continue
		}
		if m.SealedCredentials.KeyID == keyring.ActiveKeyID() {
			res.Current++
			continue
		}
		aad := domain.CredentialsAAD(m.MailboxID, m.Provider, m.IMAP)
		plain, err := keyring.Open(*m.SealedCredentials, aad)
		if err != nil {
			res.Failed++
			log.Warn("credentials do not open: not resealed", "mailbox", id, "key_id", m.SealedCredentials.KeyID, "code", domain.ErrorCode(err))
			continue
		}
		s, err := keyring.Seal(plain, aad)
		clear(plain)
		if err != nil {
			return res, err
		}
		batch = append(batch, pc.NewEvent(&domain.CredentialsRotated{MailboxID: id, SealedCredentials: &s, Cause: domain.RotationReseal, AddedAt: m.AddedAt}))
		if len(batch) == resealBatch {
			if err := flush(); err != nil {
				return res, err
			}
		}
	}
	return res, flush()
}
