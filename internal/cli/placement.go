package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/placement/postgres"
)

const placementUsage = `usage: mailplane placement show [--mailbox ID] [--summary]

Shows the placement projection: workers by tier and pool with load,
capacity and last heartbeat, dead workers not yet forgotten, pending
placements; --mailbox shows one mailbox's placement and
its history of decisions.`

// Placement is `mailplane placement show`.
func Placement(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "show" {
		return usageError(strings.TrimSpace(placementUsage))
	}
	fs := flag.NewFlagSet("placement show", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), placementUsage); fs.PrintDefaults() }
	dbURL := config.DatabaseURL.String(fs)
	mailbox := fs.String("mailbox", "", "show this mailbox's placement and history of decisions")
	summary := fs.Bool("summary", false, "pools only, no worker list")
	format := fs.String("format", FormatText, "output: text or json (for scripts)")
	fs.Parse(args[1:])
	if err := checkFormat(*format); err != nil {
		return err
	}
	if *dbURL == "" {
		return config.ErrNoDatabase
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := postgres.NewStore(pool)
	if *mailbox != "" {
		if !domain.IsUUID(*mailbox) {
			return fmt.Errorf("--mailbox %q is not a lower-case UUID", *mailbox)
		}
		m, err := store.Mailbox(ctx, *mailbox)
		if err != nil {
			return err
		}
		if *format == FormatJSON {
			return writeJSON(os.Stdout, m)
		}
		showMailbox(os.Stdout, *mailbox, m)
		return nil
	}
	o, err := store.Overview(ctx, !*summary, pendingShown)
	if err != nil {
		return err
	}
	if *format == FormatJSON {
		return writeJSON(os.Stdout, o)
	}
	showPlacement(os.Stdout, o)
	return nil
}

// pendingShown is how many pending placements placement show lists.
const pendingShown = 50

// showPlacement prints the pools, the workers (grouped by tier and pool)
// and the pending placements.
func showPlacement(out io.Writer, o postgres.Overview) {
	fmt.Fprintf(out, "placement projection at decision-log offset %d\n\n", o.NextOffset)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TIER\tPOOL\tWORKERS\tLIVE\tELIGIBLE\tLOAD\tCAPACITY\tUTIL\tMAILBOXES")
	for _, p := range o.Pools {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\t%d\n", p.Tier, p.Pool, p.Workers, p.LiveWorkers, p.EligibleWorkers,
			milli(p.LoadMilli), p.Capacity, util(p.LoadMilli, p.LiveCapacity), p.Count)
	}
	w.Flush()
	if lv := o.Liveness; lv.Holding {
		fmt.Fprintf(out, "\nliveness held since %s: %d of %d workers silent at once; no worker is declared dead for silence until heartbeats flow again (docs/runbook.md#mailplaneplacementlivenessheld)\n",
			lv.HeldSince.Format(time.RFC3339), lv.Silent, lv.Live)
	}
	// Dead workers stay listed until the engine forgets them.
	if o.DeadWorkers > 0 && !o.OldestDead.IsZero() {
		fmt.Fprintf(out, "\ndead workers: %d, the oldest last seen %s; the engine forgets a dead worker once its last heartbeat is older than its --%s\n",
			o.DeadWorkers, o.OldestDead.Format(time.RFC3339), config.WorkerRetention.Flag)
	}
	if o.Workers != nil {
		fmt.Fprintln(out)
		showWorkers(out, o.Workers)
	}
	for _, s := range o.Shortfalls {
		fmt.Fprintf(out, "\ndedicated org %s has %d of its %d workers (short %d)", s.OrgID, s.Have, s.Want, s.Want-s.Have)
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out)
	fmt.Fprintf(out, "pending: %d refused (no eligible worker), %d degraded (waiting for dedicated capacity)\n", o.Refused, o.Degraded)
	if o.Refused+o.Degraded == 0 {
		return
	}
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "MAILBOX\tORG\tBAND\tWEIGHT\tREASON\tSINCE\tON WORKER")
	for _, p := range o.Pending {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.MailboxID, p.OrgID, p.Band, milli(p.WeightMilli), p.Reason,
			p.Since.UTC().Format(time.RFC3339), dash(p.WorkerID))
	}
	w.Flush()
	if n := o.Refused + o.Degraded; n > int64(len(o.Pending)) {
		fmt.Fprintf(out, "(%d more)\n", n-int64(len(o.Pending)))
	}
}

func showWorkers(out io.Writer, workers []postgres.WorkerRow) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TIER\tPOOL\tWORKER\tEGRESS\tHEALTH\tSTATE\tLOAD/CAPACITY\tUTIL\tMAILBOXES\tORG\tLAST SEEN")
	for _, r := range workers {
		state := "live"
		switch {
		case !r.Live:
			state = "dead"
		case r.Releasing:
			state = "releasing"
		case r.Stopping:
			state = "stopping"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s/%d\t%s\t%d\t%s\t%s\n", r.Tier, r.Pool, r.ID, r.Egress, r.Health, state,
			milli(r.LoadMilli), r.Capacity, util(r.LoadMilli, r.Capacity), r.Mailboxes, dash(r.DedicatedOrg), r.LastSeen.UTC().Format(time.RFC3339))
	}
	w.Flush()
}

// showMailbox prints one mailbox's placement and its decisions.
func showMailbox(out io.Writer, id string, m postgres.MailboxStory) {
	switch {
	case !m.Placed:
		fmt.Fprintf(out, "mailbox %s is not placed (unknown, or removed)\n", id)
	default:
		fmt.Fprintf(out, "mailbox %s  org %s  band %s  weight %s\n", id, m.OrgID, m.Band, milli(m.WeightMilli))
		switch {
		case m.WorkerID == "":
			fmt.Fprintf(out, "pending: %s\n", m.PendingReason)
		case m.Degraded:
			fmt.Fprintf(out, "on worker %s (%s), degraded: waiting for dedicated capacity\n", m.WorkerID, m.Tier)
		default:
			fmt.Fprintf(out, "on worker %s (%s)\n", m.WorkerID, m.Tier)
		}
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "OFFSET\tAT\tDECISION\tREASON\tFROM\tTO\tBAND\tDETAIL")
	for _, h := range m.History {
		bands := h.ToBand
		if h.FromBand != "" && h.FromBand != h.ToBand {
			bands = h.FromBand + " → " + h.ToBand
		}
		var extra []string
		for _, kv := range [][2]string{{"cause", h.Cause}, {"health", h.Health}, {"", h.Detail}} {
			switch {
			case kv[1] == "":
			case kv[0] != "":
				extra = append(extra, kv[0]+" "+kv[1])
			default:
				extra = append(extra, kv[1])
			}
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Offset, h.At.UTC().Format(time.RFC3339Nano), h.Type, h.Reason,
			dash(h.FromWorker), dash(h.ToWorker), dash(bands), strings.Join(extra, "; "))
	}
	w.Flush()
	if len(m.History) == 0 {
		fmt.Fprintln(out, "(no decisions)")
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// milli renders thousandths: 1400 → "1.400".
func milli(v int64) string { return fmt.Sprintf("%d.%03d", v/1000, v%1000) }

func util(loadMilli, capacity int64) string {
	if capacity <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", float64(loadMilli)/float64(capacity)/10)
}
