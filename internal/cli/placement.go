package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/placement/projection"
	"github.com/mailplane/mailplane/internal/placement/replay"
)

const replayUsage = `usage: mailplane replay placement [--verify] [--swap] [--schema NAME] [--batch N] [--wait D]

Rebuilds the placement projection from decision-log offset 0 into a fresh
schema (default <live>_placement_<unix time>), with progress on stderr.
  --verify  compare it row for row with the live schema (EXCEPT both ways,
            at the live projection's offset); exit 1 when they differ
  --swap    swap it in atomically (one transaction); with --verify, only
            when they are identical. The previous projection is left in
            the rebuild's schema, to drop once satisfied.`

// Replay is `mailplane replay placement`.
func Replay(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "placement" {
		return errors.New(strings.TrimSpace(replayUsage))
	}
	fs := flag.NewFlagSet("replay placement", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), replayUsage); fs.PrintDefaults() }
	brokers, dbURL := config.RegisterBrokerFlags(fs), config.DatabaseURL.String(fs)
	logLevel, logFormat := config.LogLevel.String(fs), config.LogFormat.String(fs)
	verify := fs.Bool("verify", false, "compare the rebuild with the live projection row for row")
	swap := fs.Bool("swap", false, "swap the rebuild in (atomically)")
	schema := fs.String("schema", "", "name of the fresh schema (default <live>_placement_<unix time>)")
	batch := fs.Int("batch", replay.DefaultBatchSize, "decisions applied per transaction")
	wait := fs.Duration("wait", time.Minute, "--verify: how long to wait for a live projection that is behind the rebuild")
	fs.Parse(args[1:])
	if *dbURL == "" {
		return errors.New("no database: set DATABASE_URL (or --database-url)")
	}
	log := config.NewLogger(*logLevel, *logFormat)
	pool, err := migrations.Open(ctx, *dbURL, log)
	if err != nil {
		return err
	}
	defer pool.Close()

	bar := newProgressBar(os.Stderr)
	rb, err := replay.RebuildPlacement(ctx, replay.Config{
		Kafka:     brokers.Config("mailplane-replay"),
		Live:      pool,
		Schema:    *schema,
		BatchSize: *batch,
		Progress:  bar.update,
		Logger:    log,
	})
	if err != nil {
		return err
	}
	defer rb.Close()
	fmt.Printf("rebuilt the placement projection into schema %s: %d decisions up to offset %d in %s (%.0f decisions/s)\n",
		rb.Schema(), rb.Decisions(), rb.NextOffset(), rb.Took().Round(time.Millisecond), float64(rb.Decisions())/max(rb.Took().Seconds(), 1e-9))

	if *verify {
		rep, err := rb.Verify(ctx, *wait)
		if err != nil {
			return err
		}
		rep.Format(os.Stdout)
		if !rep.Equal() {
			return fmt.Errorf("the rebuild in schema %s differs from the live projection in %s", rb.Schema(), rb.LiveSchema())
		}
	}
	if *swap {
		if err := rb.Swap(ctx); err != nil {
			return err
		}
		fmt.Printf("swapped in; the previous placement projection is in schema %s (DROP SCHEMA %s CASCADE when satisfied)\n",
			rb.Schema(), rb.Schema())
		return nil
	}
	fmt.Printf("the rebuild stays in schema %s (DROP SCHEMA %s CASCADE when done)\n", rb.Schema(), rb.Schema())
	return nil
}

// progressBar draws replay progress on a terminal (one line, redrawn), or
// a line every few seconds elsewhere.
type progressBar struct {
	w    io.Writer
	tty  bool
	last time.Time
}

func newProgressBar(f *os.File) *progressBar {
	st, err := f.Stat()
	return &progressBar{w: f, tty: err == nil && st.Mode()&os.ModeCharDevice != 0}
}

func (b *progressBar) update(p replay.Progress) {
	if !b.tty && !p.Done && time.Since(b.last) < 2*time.Second {
		return
	}
	b.last = time.Now()
	fmt.Fprint(b.w, renderProgress(p, b.tty))
}

// renderProgress renders one progress line: bar, share, decisions, rate,
// offsets and time left.
func renderProgress(p replay.Progress, tty bool) string {
	const width = 30
	f := p.Fraction()
	n := int(f * width)
	bar := strings.Repeat("=", n)
	if n < width {
		bar += ">" + strings.Repeat(" ", width-n-1)
	}
	eta := "-"
	if r := f; r > 0 && !p.Done {
		eta = time.Duration(float64(p.Elapsed) * (1 - r) / r).Round(time.Second).String()
	} else if p.Done {
		eta = "done in " + p.Elapsed.Round(time.Millisecond).String()
	}
	line := fmt.Sprintf("replay placement [%s] %5.1f%%  %d decisions  %.0f/s  offset %d/%d  %s",
		bar, 100*f, p.Decisions, p.Rate(), p.Offset, p.To, eta)
	switch {
	case tty && p.Done:
		return "\r" + line + "\x1b[K\n"
	case tty:
		return "\r" + line + "\x1b[K"
	}
	return line + "\n"
}

const placementUsage = `usage: mailplane placement show [--mailbox ID] [--summary]

Shows the placement projection: workers by tier and pool with load,
capacity and last heartbeat, dead workers not yet forgotten, pending
placements; --mailbox shows one mailbox's placement and
its history of decisions.`

// Placement is `mailplane placement show`.
func Placement(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "show" {
		return errors.New(strings.TrimSpace(placementUsage))
	}
	fs := flag.NewFlagSet("placement show", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), placementUsage); fs.PrintDefaults() }
	dbURL := config.DatabaseURL.String(fs)
	mailbox := fs.String("mailbox", "", "show this mailbox's placement and history of decisions")
	summary := fs.Bool("summary", false, "pools only, no worker list")
	fs.Parse(args[1:])
	if *dbURL == "" {
		return errors.New("no database: set DATABASE_URL (or --database-url)")
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if *mailbox != "" {
		if !domain.IsUUID(*mailbox) {
			return fmt.Errorf("--mailbox %q is not a lower-case UUID", *mailbox)
		}
		return showMailbox(ctx, tx, os.Stdout, *mailbox)
	}
	return showPlacement(ctx, tx, os.Stdout, !*summary)
}

// showPlacement prints the pools, the workers (grouped by tier and pool)
// and the pending placements, all from one snapshot.
func showPlacement(ctx context.Context, tx pgx.Tx, out io.Writer, workers bool) error {
	ck, err := projection.ReadCheckpoint(ctx, tx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "placement projection at decision-log offset %d\n\n", ck.NextOffset)

	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TIER\tPOOL\tWORKERS\tLIVE\tELIGIBLE\tLOAD\tCAPACITY\tUTIL\tMAILBOXES")
	rows, _ := tx.Query(ctx, `SELECT tier, pool, workers, live_workers, eligible_workers, load_milli, capacity, live_capacity, mailboxes
FROM placement_pool_summary ORDER BY tier, array_position(ARRAY['clean','risky','quarantine'], pool)`)
	var tier, pl string
	var nw, nlive, nelig, load, capacity, liveCap, mbs int64
	if _, err := pgx.ForEachRow(rows, []any{&tier, &pl, &nw, &nlive, &nelig, &load, &capacity, &liveCap, &mbs}, func() error {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\t%d\n", tier, pl, nw, nlive, nelig, milli(load), capacity, util(load, liveCap), mbs)
		return nil
	}); err != nil {
		return fmt.Errorf("pools: %w", err)
	}
	w.Flush()

	// Dead workers stay listed until the engine forgets them.
	var dead int64
	var oldest *time.Time
	if err := tx.QueryRow(ctx, `SELECT count(*), min(last_seen) FROM placement_workers WHERE NOT live`).Scan(&dead, &oldest); err != nil {
		return fmt.Errorf("dead workers: %w", err)
	}
	if dead > 0 && oldest != nil {
		fmt.Fprintf(out, "\ndead workers: %d, the oldest last seen %s; the engine forgets a dead worker once its last heartbeat is older than its --%s\n",
			dead, oldest.UTC().Format(time.RFC3339), config.WorkerRetention.Flag)
	}

	if workers {
		fmt.Fprintln(out)
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "TIER\tPOOL\tWORKER\tEGRESS\tHEALTH\tSTATE\tLOAD/CAPACITY\tUTIL\tMAILBOXES\tORG\tLAST SEEN")
		rows, _ = tx.Query(ctx, `SELECT tier, pool, worker_id::text, egress, health, live, stopping, releasing, load_milli, capacity, mailboxes,
    COALESCE(dedicated_org::text, ''), last_seen
FROM placement_workers ORDER BY tier, array_position(ARRAY['clean','risky','quarantine'], pool), worker_id`)
		var id, egress, health, org string
		var live, stopping, releasing bool
		var lastSeen time.Time
		if _, err := pgx.ForEachRow(rows, []any{&tier, &pl, &id, &egress, &health, &live, &stopping, &releasing, &load, &capacity, &mbs, &org, &lastSeen}, func() error {
			state := "live"
			switch {
			case !live:
				state = "dead"
			case releasing:
				state = "releasing"
			case stopping:
				state = "stopping"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s/%d\t%s\t%d\t%s\t%s\n", tier, pl, id, egress, health, state, milli(load), capacity, util(load, capacity), mbs,
				dash(org), lastSeen.UTC().Format(time.RFC3339))
			return nil
		}); err != nil {
			return fmt.Errorf("workers: %w", err)
		}
		w.Flush()
	}

	rows, _ = tx.Query(ctx, `SELECT c.org_id::text, c.dedicated_workers, count(w.worker_id) FILTER (WHERE NOT w.releasing)
FROM placement_org_classes c
LEFT JOIN placement_workers w ON w.dedicated_org = c.org_id AND w.tier = 'dedicated'
WHERE c.class = 'dedicated'
GROUP BY 1, 2
HAVING count(w.worker_id) FILTER (WHERE NOT w.releasing) < c.dedicated_workers
ORDER BY 1`)
	var org string
	var want, have int64
	if _, err := pgx.ForEachRow(rows, []any{&org, &want, &have}, func() error {
		fmt.Fprintf(out, "\ndedicated org %s has %d of its %d workers (short %d)", org, have, want, want-have)
		return nil
	}); err != nil {
		return fmt.Errorf("dedicated shortfalls: %w", err)
	}

	fmt.Fprintln(out)
	fmt.Fprintln(out)
	var refused, degraded int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE worker_id IS NULL), count(*) FILTER (WHERE worker_id IS NOT NULL)
FROM placement_pending`).Scan(&refused, &degraded); err != nil {
		return fmt.Errorf("pending: %w", err)
	}
	fmt.Fprintf(out, "pending: %d refused (no eligible worker), %d degraded (waiting for dedicated capacity)\n", refused, degraded)
	if refused+degraded == 0 {
		return nil
	}
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "MAILBOX\tORG\tBAND\tWEIGHT\tREASON\tSINCE\tON WORKER")
	rows, _ = tx.Query(ctx, `SELECT mailbox_id::text, org_id::text, band, weight_milli, reason, since, COALESCE(worker_id::text, '-')
FROM placement_pending ORDER BY since, mailbox_id LIMIT 50`)
	var mb, band, reason, on string
	var weight int64
	var since time.Time
	if _, err := pgx.ForEachRow(rows, []any{&mb, &org, &band, &weight, &reason, &since, &on}, func() error {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", mb, org, band, milli(weight), reason, since.UTC().Format(time.RFC3339), on)
		return nil
	}); err != nil {
		return fmt.Errorf("pending: %w", err)
	}
	w.Flush()
	if refused+degraded > 50 {
		fmt.Fprintf(out, "(%d more)\n", refused+degraded-50)
	}
	return nil
}

// showMailbox prints one mailbox's placement and its decisions.
func showMailbox(ctx context.Context, tx pgx.Tx, out io.Writer, id string) error {
	var org, band, worker, tier, pending string
	var weight, offset int64
	var degraded bool
	err := tx.QueryRow(ctx, `SELECT org_id::text, band, weight_milli, COALESCE(worker_id::text, ''), COALESCE(tier, ''), degraded,
    COALESCE(pending_reason, ''), decision_offset
FROM placement_mailbox_status WHERE mailbox_id = $1`, id).Scan(&org, &band, &weight, &worker, &tier, &degraded, &pending, &offset)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		fmt.Fprintf(out, "mailbox %s is not placed (unknown, or removed)\n", id)
	case err != nil:
		return err
	default:
		fmt.Fprintf(out, "mailbox %s  org %s  band %s  weight %s\n", id, org, band, milli(weight))
		switch {
		case worker == "":
			fmt.Fprintf(out, "pending: %s\n", pending)
		case degraded:
			fmt.Fprintf(out, "on worker %s (%s), degraded: waiting for dedicated capacity\n", worker, tier)
		default:
			fmt.Fprintf(out, "on worker %s (%s)\n", worker, tier)
		}
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "OFFSET\tAT\tDECISION\tREASON\tFROM\tTO\tBAND\tDETAIL")
	rows, _ := tx.Query(ctx, `SELECT decision_offset, at, type, reason, COALESCE(from_worker::text, ''), COALESCE(to_worker::text, ''),
    COALESCE(from_band, ''), COALESCE(to_band, ''), COALESCE(cause, ''), COALESCE(detail, ''), COALESCE(health, '')
FROM placement_history WHERE mailbox_id = $1 ORDER BY decision_offset`, id)
	var at time.Time
	var typ, reason, from, to, fromBand, toBand, cause, detail, health string
	n := 0
	if _, err := pgx.ForEachRow(rows, []any{&offset, &at, &typ, &reason, &from, &to, &fromBand, &toBand, &cause, &detail, &health}, func() error {
		n++
		bands := toBand
		if fromBand != "" && fromBand != toBand {
			bands = fromBand + " → " + toBand
		}
		var extra []string
		for _, kv := range [][2]string{{"cause", cause}, {"health", health}, {"", detail}} {
			if kv[1] != "" {
				if kv[0] != "" {
					extra = append(extra, kv[0]+" "+kv[1])
				} else {
					extra = append(extra, kv[1])
				}
			}
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", offset, at.UTC().Format(time.RFC3339Nano), typ, reason,
			dash(from), dash(to), dash(bands), strings.Join(extra, "; "))
		return nil
	}); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	w.Flush()
	if n == 0 {
		fmt.Fprintln(out, "(no decisions)")
	}
	return nil
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
