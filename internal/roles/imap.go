package roles

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/imapsync"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/topics"
)

// auditReporter sends IMAP failures to sync.audit and logs disable
// requests. Failures carry a category and mailplane's own words: never a
// secret, never the remote server's bytes.
type auditReporter struct {
	kc    *kgo.Client
	topic string // sync.audit, in the deployment's namespace
	log   *slog.Logger
	owner string
}

func (r *auditReporter) SyncFailed(ctx context.Context, f imapsync.Failure) {
	rec, err := topics.EncodeTo(r.topic, domain.Event{
		ID: domain.NewEventID(), Type: domain.TypeSyncFailed, Source: "mailplane/sync/" + r.owner,
		Time: f.At.UTC(), Subject: f.MailboxID,
		Data: &domain.SyncFailed{MailboxID: f.MailboxID, Partition: f.Partition, Epoch: f.Epoch, Owner: r.owner,
			Error: truncate(f.Err.Error(), 500), Category: string(f.Err.Kind), Attempt: max(f.Consecutive, 1), At: f.At.UTC()},
	})
	if err != nil {
		r.log.Error("encode sync.failed", "err", err)
		return
	}
	// Best effort, never blocking the runner: the failure is also in logs
	// and metrics.
	r.kc.TryProduce(ctx, rec, func(_ *kgo.Record, err error) {
		if err != nil {
			r.log.Warn("produce sync.failed", "err", err)
		}
	})
}

func (r *auditReporter) DisableRequested(_ context.Context, d imapsync.DisableRequest) {
	// The runner queued the mailbox.disabled event already; this is for
	// the operator reading the logs.
	r.log.Warn("IMAP authentication keeps failing: mailbox disabled", "mailbox", d.MailboxID,
		"failing_since", d.AuthFailingSince, "reason", d.Reason)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// newRunner returns the runner sync workers run per mailbox.
func newRunner(rc *roleConfig, kc *kgo.Client, log *slog.Logger) (mailsync.Runner, error) {
	switch rc.syncRunner {
	case "record", "":
		return &mailsync.RecordingRunner{Beat: 30 * time.Second}, nil
	case "imap":
	default:
		return nil, fmt.Errorf("sync runner %q: want imap or record", rc.syncRunner)
	}
	if rc.keyring == nil {
		return nil, fmt.Errorf("the IMAP runner needs the sealing keys (MAILPLANE_SEAL_KEYS) to open mailbox credentials")
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if rc.imapCAFile != "" {
		pem, err := os.ReadFile(rc.imapCAFile)
		if err != nil {
			return nil, fmt.Errorf("IMAP CA file: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("IMAP CA file %s holds no PEM certificate", rc.imapCAFile)
		}
	}
	return imapsync.New(imapsync.Config{
		Keyring: rc.keyring, RootCAs: pool, Logger: log, Registerer: rc.reg,
		Reporter:     &auditReporter{kc: kc, topic: rc.kafka.Topic(topics.SyncAudit), log: log, owner: rc.syncConfig.WorkerID},
		DisableAfter: rc.imapDisableAfter,
		WarmupHeader: rc.imapWarmupHeader,
		WarmupKey:    rc.imapWarmupKey,
		OAuth:        rc.imapOAuth,
		Transport:    rc.imapTransport,

		SetupTimeout: rc.imapBounds.SetupTimeout, SetupSharePerHost: rc.imapBounds.SetupSharePerHost,
		MaxResponseBytes: rc.imapBounds.MaxResponseBytes, MaxSessionBytes: rc.imapBounds.MaxSessionBytes,
	})
}

// oauthFlags registers the OAuth client settings.
func oauthFlags(fs *flag.FlagSet) func() map[domain.Provider]imapsync.OAuthClient {
	gid, gsec, gurl := config.GmailClientID.String(fs), config.GmailClientSecret.String(fs), config.GmailTokenURL.String(fs)
	oid, osec, ourl := config.OutlookClientID.String(fs), config.OutlookClientSecret.String(fs), config.OutlookTokenURL.String(fs)
	return func() map[domain.Provider]imapsync.OAuthClient {
		m := map[domain.Provider]imapsync.OAuthClient{}
		if *gid != "" {
			m[domain.ProviderGmail] = imapsync.OAuthClient{TokenURL: *gurl, ClientID: *gid, ClientSecret: *gsec}
		}
		if *oid != "" {
			m[domain.ProviderOutlook] = imapsync.OAuthClient{TokenURL: *ourl, ClientID: *oid, ClientSecret: *osec}
		}
		return m
	}
}
