package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
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

// Credentials is `mailplane credentials reseal` (mailboxstate.Reseal).
func Credentials(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("credentials reseal", flag.ExitOnError)
	brokers := config.RegisterBrokerFlags(fs)
	source := config.Source.String(fs)
	sealKeys, sealKeyID := config.SealKeys.String(fs), config.SealKeyID.String(fs)
	dataDir := config.DataDir.String(fs)
	logLevel, logFormat := config.LogLevel.String(fs), config.LogFormat.String(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), credentialsUsage)
		fs.PrintDefaults()
	}
	if len(args) == 0 || args[0] != "reseal" {
		fs.Usage()
		return errors.New("want: credentials reseal")
	}
	fs.Parse(args[1:])
	kcfg := brokers.Config("mailplane-reseal")
	var act cliAction
	act.begin(kcfg, domain.OpsCredentialsReseal, domain.OpsParams{})
	return act.finish(ctx, reseal(ctx, kcfg, *source, *sealKeys, *sealKeyID, *dataDir, config.NewLogger(*logLevel, *logFormat), &act))
}

// reseal is Credentials after its flags; act records it in the operator
// audit with the active key's id (never a key) and the count resealed.
func reseal(ctx context.Context, kcfg kafka.Config, source, sealKeys, sealKeyID, dataDir string, log *slog.Logger, act *cliAction) error {
	keyring, err := sealing.Load(sealKeys, sealKeyID, dataDir, false)
	if err != nil {
		return err
	}
	if keyring == nil {
		return domain.Errorf(domain.CodeInvalid, "no sealing keys: set MAILPLANE_SEAL_KEYS (the old keys and the new one, active)")
	}
	act.params.Target = keyring.ActiveKeyID()
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		return err
	}
	defer kc.Close()
	pc := producer.New(kc, producer.WithSource(source), producer.WithNamespace(kcfg.Namespace))
	act.started = true
	res, err := mailboxstate.Reseal(ctx, kcfg, keyring, pc, log)
	act.params.Count = int64(res.Resealed)
	fmt.Fprintf(os.Stdout, "resealed %d, already under %s %d, failed %d (of %d live mailboxes)\n",
		res.Resealed, keyring.ActiveKeyID(), res.Current, res.Failed, res.Live)
	if err == nil && res.Failed > 0 {
		err = fmt.Errorf("%d mailboxes could not be resealed (see the log): keep their keys", res.Failed)
	}
	return err
}
