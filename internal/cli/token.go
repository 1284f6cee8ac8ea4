package cli

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/config"
)

const tokenUsage = `Usage:
  mailplane token --name NAME --scopes SCOPE[,SCOPE...] --source SOURCE
      make a caller's token: prints the token (once: only its hash is kept)
      and the line to add to the API tokens file (MAILPLANE_API_TOKENS_FILE)
  mailplane token worker --worker-id ID
      print a sending worker's credential, derived from the fleet secret
      (MAILPLANE_WORKER_FLEET_SECRET; dev mode's is in its data dir)

Scopes: publish:public (mailbox.added, mailbox.removed, user.active),
publish:<type> for one type (internal types need theirs: publish:mailbox.health_scored,
publish:org.plan_changed (with ops), publish:mailbox.warmup_observed, ...),
workers:read, ops, audit:read, fleet:read (the query API).

Flags:
`

// Token is `mailplane token`.
func Token(args []string, out io.Writer) error {
	if len(args) > 0 && args[0] == "worker" {
		return workerToken(args[1:], out)
	}
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	name := fs.String("name", "", "caller name, 1-64 of [a-z0-9._-] (shows in logs and metrics)")
	scopes := fs.String("scopes", "", "comma-separated scopes")
	source := fs.String("source", "", "the ce source the caller speaks as (its events' source is it or a path below it)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), tokenUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return err
	}
	list := config.SplitList(*scopes)
	slices.Sort(list)
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return err
	}
	tok := "mpt_" + base64.RawURLEncoding.EncodeToString(buf)
	line := access.Line(*name, tok, slices.Compact(list), *source)
	// The line must be one the server loads: the same parser checks it.
	if _, _, err := access.Parse([]byte(line)); err != nil {
		return err
	}
	fmt.Fprintf(out, "token (shown once; give it to the caller, keep it secret):\n  %s\n\nadd this line to the API tokens file (reloaded on SIGHUP or within seconds):\n  %s\n", tok, line)
	return nil
}

// workerToken is `mailplane token worker`.
func workerToken(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("token worker", flag.ContinueOnError)
	id := fs.String("worker-id", "", "the worker's id (a lower-case UUID)")
	secret := config.WorkerFleetSecret.String(fs)
	dataDir := config.DataDir.String(fs)
	fs.Usage = func() { fmt.Fprint(fs.Output(), tokenUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !domain.IsUUID(*id) {
		return errors.New("--worker-id must be a lower-case UUID")
	}
	key := []byte(*secret)
	if len(key) == 0 {
		// Dev mode keeps its fleet secret in the data dir.
		b, err := os.ReadFile(filepath.Join(*dataDir, "worker-fleet.key"))
		if err != nil {
			return errors.New("no fleet secret: set MAILPLANE_WORKER_FLEET_SECRET (or --worker-fleet-secret), or --data-dir of a dev mode")
		}
		key = []byte(strings.TrimSpace(string(b)))
	}
	if len(key) < access.MinFleetSecretBytes {
		return fmt.Errorf("the fleet secret must be at least %d bytes", access.MinFleetSecretBytes)
	}
	fmt.Fprintln(out, access.WorkerToken(key, *id))
	return nil
}
