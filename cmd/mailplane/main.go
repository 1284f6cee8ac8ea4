// Command mailplane is the mailplane control plane: one binary whose
// subcommands are its roles (API, projectors, and later the placement engine
// and sync workers), its embedded dev mode, and its operator tools.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/mailplane/mailplane/domain"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

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
  topics apply     create missing topics, report drift (exit 1 on drift)
  topics list      show the topic catalog
  migrate          apply database migrations
  publish TYPE     publish one event (data as --data JSON or on stdin)
  token            make an API caller's token and its tokens-file line (--name, --scopes, --source)
  token worker     print a sending worker's credential (--worker-id)
  credentials reseal  re-seal every live mailbox's credentials under the active key (to retire a key)
  acls plan|apply  broker ACLs giving each role only what it needs (--principals role=user,...)
  dlq list         show dead letters
  replay placement rebuild the placement projection into a fresh schema (--verify, --swap)
  placement show   workers by tier and pool, pending placements (--mailbox ID: its decisions)
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "dev":
		err = runDev(ctx, args)
	case "api":
		err = runAPI(ctx, args)
	case "engine":
		err = runEngine(ctx, args)
	case "sync":
		err = runSync(ctx, args)
	case "state":
		err = runState(ctx, args)
	case "project":
		err = runProject(ctx, args)
	case "topics":
		err = runTopics(ctx, args)
	case "migrate":
		err = runMigrate(ctx, args)
	case "publish":
		err = runPublish(ctx, args)
	case "token":
		err = runToken(args, os.Stdout)
	case "credentials":
		err = runCredentials(ctx, args)
	case "acls":
		err = runACLs(ctx, args, os.Stdout)
	case "dlq":
		err = runDLQ(ctx, args)
	case "replay":
		err = runReplay(ctx, args)
	case "placement":
		err = runPlacement(ctx, args)
	case "help", "-h", "--help":
		if len(args) > 0 && args[0] == "config" {
			printConfig(os.Stdout)
			return
		}
		fmt.Print(usage)
		return
	case "newid":
		fmt.Println(domain.NewEventID())
		return
	case "version":
		fmt.Println("mailplane", version)
		return
	default:
		fmt.Fprintf(os.Stderr, "mailplane: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mailplane %s: %v\n", cmd, err)
		os.Exit(1)
	}
}
