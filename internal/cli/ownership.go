package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/ownership"
)

const ownershipUsage = `usage:
  mailplane ownership transfer (--mailbox ID | --org ID) --to SOURCE --comment TEXT --api URL [flags]
  mailplane ownership backfill --api-tokens-file FILE [flags]
  mailplane ownership show (--mailbox ID | --org ID) [flags]

transfer gives a mailbox or an org to another tenant (a caller's source in the
tokens file): an owner_transferred event, published through the API, which
applies it to the claims before producing it. The token needs ops and
publish:mailbox.owner_transferred (or publish:org.owner_transferred). A
mailbox's org is not moved with it, nor an org's mailboxes.

backfill gives the mailboxes and orgs already on the log their owners: the
tenant of the source of each mailbox's first mailbox.added (since its last
removal), transfers applied; it writes only the claims the database lacks and
records the backfill, without which the API answers 503 to mailbox events.
Run it after upgrading, before the new api role takes traffic, and once more
when no older api process is left.

show prints who owns a mailbox or an org ("unowned" when no one does), and a
removal of the mailbox still awaiting the log.
`

// Ownership is `mailplane ownership transfer|backfill`.
func Ownership(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, ownershipUsage)
		return usageError("a subcommand is required: transfer or backfill")
	}
	switch args[0] {
	case "transfer":
		return ownershipTransfer(ctx, args[1:], stdout)
	case "backfill":
		return ownershipBackfill(ctx, args[1:], stdout)
	case "show":
		return ownershipShow(ctx, args[1:], stdout)
	}
	fmt.Fprint(os.Stderr, ownershipUsage)
	return usageError(fmt.Sprintf("unknown subcommand %q", args[0]))
}

func ownershipTransfer(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ownership transfer", flag.ContinueOnError)
	mailbox := fs.String("mailbox", "", "the mailbox id to transfer")
	org := fs.String("org", "", "the org id to transfer")
	to := fs.String("to", "", "the new owner: a caller's source as the tokens file has it (e.g. /product-api)")
	comment := fs.String("comment", "", "why (a ticket, a request); kept on the log")
	id := fs.String("id", "", "event id (UUIDv7); a new one when empty (reuse one to retry safely)")
	source := config.Source.String(fs)
	apiURL := config.APIURL.String(fs)
	tokens := config.APITokens.String(fs)
	fs.Usage = func() { fmt.Fprint(fs.Output(), ownershipUsage+"\nFlags:\n"); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	var typ string
	var data map[string]string
	switch {
	case (*mailbox == "") == (*org == ""):
		return usageError("give one of --mailbox and --org")
	case *mailbox != "":
		typ, data = domain.TypeMailboxOwnerTransferred, map[string]string{"mailbox_id": *mailbox}
	default:
		typ, data = domain.TypeOrgOwnerTransferred, map[string]string{"org_id": *org}
	}
	if *apiURL == "" {
		// Straight to the brokers, the transfer would be on the log but
		// not in the claims the API checks.
		return usageError("--api is required: a transfer takes effect through the API")
	}
	data["owner"], data["comment"] = *to, *comment
	raw, err := json.Marshal(data)
	if err != nil {
		return err
	}
	if *id == "" {
		*id = domain.NewEventID()
	}
	attrs := domain.Attributes{SpecVersion: domain.SpecVersion, ID: *id, Type: typ, Source: *source}
	if _, ps := domain.FromAttributes(attrs, raw, time.Now(), nil, nil); len(ps) > 0 {
		printProblems(ps)
		return ps.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return publishHTTPTo(ctx, stdout, *apiURL, firstToken(*tokens), attrs, raw)
}

func ownershipBackfill(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ownership backfill", flag.ContinueOnError)
	brokers, dbURL := config.RegisterBrokerFlags(fs), config.DatabaseURL.String(fs)
	tokensFile := config.APITokensFile.String(fs)
	fs.Usage = func() { fmt.Fprint(fs.Output(), ownershipUsage+"\nFlags:\n"); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	if *tokensFile == "" {
		return usageError("--api-tokens-file is required: it names the tenants the log's sources belong to")
	}
	b, err := os.ReadFile(*tokensFile)
	if err != nil {
		return err
	}
	callers, _, err := access.Parse(b)
	if err != nil {
		return err
	}
	var tenants []string
	for _, c := range callers {
		tenants = append(tenants, c.Source)
	}
	slices.Sort(tenants)
	tenants = slices.Compact(tenants)
	pool, err := migrations.Open(ctx, *dbURL, config.NewLogger("warn", "text"))
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := ownership.Backfill(ctx, brokers.Config("mailplane-ownership"), ownership.NewStore(pool), tenants)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "claims on the log: %d mailboxes, %d orgs; written (missing before): %d\n", rep.Mailboxes, rep.Orgs, rep.Written)
	if rep.Undecodable > 0 {
		fmt.Fprintf(stdout, "records that did not decode (skipped, as every consumer did): %d\n", rep.Undecodable)
	}
	if len(rep.Unmapped) > 0 {
		fmt.Fprintf(stdout, "%d claims belong to sources no caller of the tokens file speaks as; only ops acts on them (mailplane ownership transfer):\n", rep.UnmappedClaims)
		for _, s := range rep.Unmapped {
			fmt.Fprintf(stdout, "  %s\n", s)
		}
	}
	return nil
}

func ownershipShow(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ownership show", flag.ContinueOnError)
	mailbox := fs.String("mailbox", "", "the mailbox id")
	org := fs.String("org", "", "the org id")
	dbURL := config.DatabaseURL.String(fs)
	fs.Usage = func() { fmt.Fprint(fs.Output(), ownershipUsage+"\nFlags:\n"); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	var k ownership.Key
	switch {
	case (*mailbox == "") == (*org == ""):
		return usageError("give one of --mailbox and --org")
	case *mailbox != "":
		k = ownership.Key{Kind: domain.OwnedMailbox, ID: *mailbox}
	default:
		k = ownership.Key{Kind: domain.OwnedOrg, ID: *org}
	}
	if !domain.IsUUID(k.ID) {
		return usageError(fmt.Sprintf("%s is not a lower-case UUID", k.ID))
	}
	pool, err := migrations.Open(ctx, *dbURL, config.NewLogger("warn", "text"))
	if err != nil {
		return err
	}
	defer pool.Close()
	claims, err := ownership.NewStore(pool).Claims(ctx, k)
	if err != nil {
		return err
	}
	c, ok := claims[k]
	switch {
	case !ok:
		fmt.Fprintf(stdout, "%s: unowned\n", k)
	case c.Releasing != "":
		fmt.Fprintf(stdout, "%s: %s (removal %s not yet acknowledged by the log)\n", k, c.Owner, c.Releasing)
	default:
		fmt.Fprintf(stdout, "%s: %s\n", k, c.Owner)
	}
	return nil
}
