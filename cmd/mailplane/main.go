// Command mailplane is the mailplane control plane: one binary whose
// subcommands are its roles (API, projectors, placement engine, mailbox.state
// processor, sync workers), its embedded dev mode, and its operator tools.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/mailplane/mailplane/internal/buildinfo"

	"github.com/mailplane/mailplane/internal/cli"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/roles"
)

const usage = `mailplane — control plane for fleets of email mailboxes

Usage: mailplane <command> [flags]

Run:
  dev              everything embedded (broker, Postgres, API, engine, projectors, sync); what 'make run' runs
  api              the ingest API role
  project          the projector role (Postgres projections of the log)
  engine           the placement engine (one active, others standby)
  sync             a sync worker (owns mailbox.state partitions; --state adds the processor)
  state            the mailbox.state processor (folds mailbox events for sync)

Operate:
  topics apply     create missing topics, report drift (exit 3 on drift)
  topics list      show the topic catalog
  schemas register every record type's reader schema into the Schema Registry (--registry, --dry-run)
  migrate          apply database migrations
  publish TYPE     publish one event (data as --data JSON or on stdin)
  import [FILE]    stream a fleet of mailboxes (JSON lines or CSV, with credentials) to the API (--api, exit 5: rows refused)
  token            make an API caller's token and its tokens-file line (--name, --scopes, --source)
  token worker     print a sending worker's credential (--worker-id)
  credentials reseal  re-seal every live mailbox's credentials under the active key (to retire a key)
  acls plan|apply  broker ACLs giving each role only what it needs (--principals role=user,...)
  dlq list         show dead letters (and whether each was redriven)
  dlq redrive      hand a consumer's dead letters back to it after a fix (--consumer, --dry-run, --yes)
  rebuild registry|placement|health  rebuild a projection into a fresh schema (--verify, --swap [--yes])
  rebuild cleanup  drop the old schemas rebuild left (--keep N, --older-than D, --dry-run | --yes)
  placement show   workers by tier and pool, pending placements (--mailbox ID: its decisions)
  ownership transfer  give a mailbox or org to another tenant (--mailbox ID | --org ID, --to SOURCE, --comment, --api)
  ownership backfill  give what is on the log its owners (--api-tokens-file; after upgrading)
  ownership show   who owns a mailbox or an org (--mailbox ID | --org ID)
  projector positions|seek  where each projector stands in Postgres; move one partition's position
  policy validate|show|diff  the policy document (every health and placement rule): check, print, compare
                   (the policy in force is the default one until policy apply exists; it does not yet)
  help config      the configuration reference (flags and environment)
  newid            print a new event id (UUIDv7)
  version          print the version

Every command takes -h for its flags. Flags fall back to environment variables.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	// Before any command reads its settings; the flags are not parsed yet,
	// so the log format is the environment's.
	config.WarnDeprecated(config.NewLogger("warn", os.Getenv(config.LogFormat.Env)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd, args := os.Args[1], os.Args[2:]
	code := run(ctx, cmd, args)
	stop()
	os.Exit(code)
}

// run runs one command and returns the process's exit code (cli.ExitCode:
// 0 done, 1 failed, 2 usage, 3 drift, 4 a failed verify, 5 some dead letters or
// rows refused, 6 an incompatible schema).
func run(ctx context.Context, cmd string, args []string) int {
	var err error
	switch cmd {
	case "dev":
		err = roles.Dev(ctx, args)
	case "api":
		err = roles.API(ctx, args)
	case "engine":
		err = roles.Engine(ctx, args)
	case "sync":
		err = roles.Sync(ctx, args)
	case "state":
		err = roles.State(ctx, args)
	case "project":
		err = roles.Project(ctx, args)
	case "topics":
		err = cli.Topics(ctx, args)
	case "schemas":
		err = cli.Schemas(ctx, args, os.Stdout, os.Stderr)
	case "migrate":
		err = cli.Migrate(ctx, args)
	case "publish":
		err = cli.Publish(ctx, args)
	case "import":
		err = cli.Import(ctx, args, os.Stdin, os.Stdout, os.Stderr)
	case "token":
		err = cli.Token(args, os.Stdout)
	case "credentials":
		err = cli.Credentials(ctx, args)
	case "acls":
		err = cli.ACLs(ctx, args, os.Stdout)
	case "dlq":
		err = cli.DLQ(ctx, args)
	case "rebuild":
		err = cli.Rebuild(ctx, args)
	case "replay": // deprecated: rebuild (warns), for one release
		err = cli.Replay(ctx, args, os.Stderr)
	case "placement":
		err = cli.Placement(ctx, args)
	case "ownership":
		err = cli.Ownership(ctx, args, os.Stdout)
	case "projector":
		err = cli.Projector(ctx, args, os.Stdout)
	case "policy":
		err = cli.Policy(args, os.Stdout)
	case "help", "-h", "--help":
		if len(args) > 0 && args[0] == "config" {
			config.PrintReference(os.Stdout)
		} else {
			fmt.Print(usage)
		}
	case "newid":
		cli.NewID(os.Stdout)
	case "version":
		fmt.Println(buildinfo.Read())
	default:
		fmt.Fprintf(os.Stderr, "mailplane: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mailplane %s: %v\n", cmd, err)
	}
	return cli.ExitCode(err)
}
