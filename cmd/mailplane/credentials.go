package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

const credentialsUsage = `Usage: mailplane credentials reseal [flags]

Re-seals every live mailbox's credentials under the active sealing key
(MAILPLANE_SEAL_KEYS with MAILPLANE_SEAL_KEY_ID, or the first key): each
mailbox in mailbox.state whose credentials are sealed with another key gets
a mailbox.credentials_rotated event (cause reseal). Once the mailbox.state
processor has folded them, the old key can be removed from every role.
Run it with both keys configured, the new one active. Idempotent: mailboxes
already under the active key are left alone.

Flags:
`

func runCredentials(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("credentials reseal", flag.ExitOnError)
	brokers := registerBrokerFlags(fs)
	source := cfgSource.String(fs)
	sealKeys, sealKeyID := cfgSealKeys.String(fs), cfgSealKeyID.String(fs)
	dataDir := cfgDataDir.String(fs)
	logLevel, logFormat := cfgLogLevel.String(fs), cfgLogFormat.String(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), credentialsUsage)
		fs.PrintDefaults()
	}
	if len(args) == 0 || args[0] != "reseal" {
		fs.Usage()
		return errors.New("want: credentials reseal")
	}
	fs.Parse(args[1:])
	keyring, err := loadKeyring(*sealKeys, *sealKeyID, *dataDir, false)
	if err != nil {
		return err
	}
	if keyring == nil {
		return errors.New("no sealing keys: set MAILPLANE_SEAL_KEYS (the old keys and the new one, active)")
	}
	log := newLogger(*logLevel, *logFormat)
	kcfg := brokers.config("mailplane-reseal")
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		return err
	}
	defer kc.Close()
	pc := producer.New(kc, producer.WithSource(*source))
	res, err := reseal(ctx, kcfg, keyring, pc, log)
	fmt.Fprintf(os.Stdout, "resealed %d, already under %s %d, failed %d (of %d live mailboxes)\n",
		res.resealed, keyring.ActiveKeyID(), res.current, res.failed, res.live)
	if err == nil && res.failed > 0 {
		err = fmt.Errorf("%d mailboxes could not be resealed (see the log): keep their keys", res.failed)
	}
	return err
}

type resealResult struct{ live, resealed, current, failed int }

// resealBatch bounds the events of one produce.
const resealBatch = 500

// reseal re-seals, under the keyring's active key, the credentials of every
// live mailbox in mailbox.state sealed with another key, and publishes one
// credentials_rotated per mailbox. The plain text lives only between Open
// and Seal, and is wiped. Credentials that do not open (a key missing from
// the keyring, or sealed for another endpoint) are counted and logged,
// never re-sealed.
func reseal(ctx context.Context, kcfg kafka.Config, keyring *sealing.Keyring, pc *producer.Client, log *slog.Logger) (resealResult, error) {
	var res resealResult
	live, bad, err := mailboxstate.ReadLive(ctx, kcfg, topics.MailboxState, log)
	if err != nil {
		return res, err
	}
	if bad > 0 {
		log.Warn("mailbox.state records that do not decode were skipped", "count", bad)
	}
	res.live = len(live)
	var batch []domain.Event
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if _, err := pc.Publish(ctx, batch...); err != nil {
			return err
		}
		res.resealed += len(batch)
		batch = batch[:0]
		return nil
	}
	for id, m := range live {
		if m.SealedCredentials == nil {
			continue
		}
		if m.SealedCredentials.KeyID == keyring.ActiveKeyID() {
			res.current++
			continue
		}
		aad := domain.CredentialsAAD(m.MailboxID, m.Provider, m.IMAP)
		plain, err := keyring.Open(*m.SealedCredentials, aad)
		if err != nil {
			res.failed++
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
