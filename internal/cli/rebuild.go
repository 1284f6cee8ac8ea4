package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/rebuild"
)

const rebuildUsage = `usage: mailplane rebuild registry|placement|health [--verify] [--swap [--yes]] [--schema NAME] [--wait D] [--format text|json]
       mailplane rebuild cleanup [--keep N] [--older-than D] [--dry-run | --yes] [--format text|json]

Rebuilds a projection from offset 0 of every partition of its topics (to
their ends as the command starts) into a fresh schema, default
<live>_<projection>_<unix time><6 digits>; the health projection is rebuilt
without publishing anything. Progress shows on a terminal (not when stdout
is not one, nor with --format json).
  --verify  compare it row for row with the live schema, both at the same
            positions (the rebuild catches up to a live projection ahead of
            it; waits up to --wait for one behind); exit 4 when they differ
  --swap    swap it in atomically (one transaction). Needs a verify that
            passed in the same run, or --yes (swap without a verify, or
            despite a difference). The previous projection is left in the
            rebuild's schema.
cleanup drops the schemas rebuild created (named <prefix>_<projection>_<digits>
AND holding rebuild's marker table), never the live schema: --keep N newest per
projection stay, --older-than D spares younger ones; --dry-run lists,
--yes drops.
(mailplane replay is the deprecated name of this command, for one release.)`

// Rebuild is `mailplane rebuild`.
func Rebuild(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError(strings.TrimSpace(rebuildUsage))
	}
	if args[0] == "cleanup" {
		return rebuildCleanup(ctx, args[1:], os.Stdout)
	}
	if !slices.Contains(rebuild.Projections, args[0]) {
		return usageError(strings.TrimSpace(rebuildUsage))
	}
	return rebuildProjection(ctx, args[0], args[1:], os.Stdout)
}

// Replay is `mailplane replay`, the deprecated name of `mailplane rebuild`
// (kept for one release): it warns on stderr, then rebuilds.
func Replay(ctx context.Context, args []string, stderr io.Writer) error {
	fmt.Fprintln(stderr, "mailplane replay is deprecated and will be removed in the next release: use mailplane rebuild (same arguments)")
	return Rebuild(ctx, args)
}

// rebuildSummary is what `rebuild <projection>` prints with --format json.
type rebuildSummary struct {
	Projection string `json:"projection"`
	Schema     string `json:"schema"`
	LiveSchema string `json:"live_schema"`
	// Records applied (decisions for placement, events otherwise); Poison
	// those passed without applying, as the projector dead-letters them.
	Records     int64              `json:"records"`
	Poison      int64              `json:"poison_records"`
	Positions   []rebuild.Position `json:"positions"`
	TookSeconds float64            `json:"took_seconds"`
	Verify      *verifyResult      `json:"verify,omitempty"`
	Swapped     bool               `json:"swapped"`
	// Previous is the schema holding the projection that was live before
	// the swap (rebuild cleanup drops it).
	Previous string `json:"previous_schema,omitempty"`
}

type verifyResult struct {
	Equal     bool                  `json:"equal"`
	Positions []rebuild.Position    `json:"positions"`
	Tables    []rebuild.TableReport `json:"tables"`
}

// startRebuild rebuilds projection name into a fresh schema.
func startRebuild(ctx context.Context, name string, kcfg kafka.Config, pool *pgxpool.Pool, schema string, batch int, bar *progressBar, log *slog.Logger) (*rebuild.Rebuild, error) {
	spec, err := rebuild.Of(name)
	if err != nil {
		return nil, err
	}
	return rebuild.Start(ctx, spec, rebuild.Config{Kafka: kcfg, Live: pool, Schema: schema, BatchSize: batch, Progress: bar.report, Logger: log})
}

func summarize(rb *rebuild.Rebuild) rebuildSummary {
	return rebuildSummary{Projection: rb.Name(), Schema: rb.Schema(), LiveSchema: rb.LiveSchema(), Records: rb.Records(),
		Poison: rb.Poison(), Positions: rb.Positions(), TookSeconds: rb.Took().Seconds()}
}

func rebuildProjection(ctx context.Context, name string, args []string, stdout *os.File) error {
	var act cliAction
	return act.finish(ctx, runRebuildProjection(ctx, name, args, stdout, &act))
}

// runRebuildProjection is rebuildProjection; act records a --swap in the
// operator audit.
func runRebuildProjection(ctx context.Context, name string, args []string, stdout *os.File, act *cliAction) error {
	fs := flag.NewFlagSet("rebuild "+name, flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), rebuildUsage); fs.PrintDefaults() }
	brokers, dbURL := config.RegisterBrokerFlags(fs), config.DatabaseURL.String(fs)
	logLevel, logFormat := config.LogLevel.String(fs), config.LogFormat.String(fs)
	verify := fs.Bool("verify", false, "compare the rebuild with the live projection row for row")
	swap := fs.Bool("swap", false, "swap the rebuild in (atomically); needs --verify passing or --yes")
	yes := fs.Bool("yes", false, "--swap without a verify, or despite a difference")
	schema := fs.String("schema", "", "name of the fresh schema, <prefix>_"+name+"_<digits> (default <live>_"+name+"_<unix time><6 digits>)")
	batch := fs.Int("batch", 0, "records applied per transaction (default: the projection's)")
	wait := fs.Duration("wait", time.Minute, "--verify: how long to wait for a live projection that is behind the rebuild")
	format := fs.String("format", FormatText, "output: text or json (for scripts)")
	fs.Parse(args)
	if *swap {
		act.begin(brokers.Config("mailplane-rebuild"), domain.OpsRebuildSwap, domain.OpsParams{Target: name, Filter: swapFilter(*verify, *yes)})
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usageError(fmt.Sprintf("rebuild %s: unexpected argument %q", name, fs.Arg(0)))
	case *swap && !*verify && !*yes:
		return usageError("refusing --swap without --verify: a swap needs a verify that passes in the same run (--verify --swap), or --yes to swap without one")
	case *yes && !*swap:
		return usageError("--yes only goes with --swap")
	}
	if *schema != "" {
		if err := rebuild.CheckName(*schema, name, ""); err != nil {
			return usageError(err.Error())
		}
	}
	if *dbURL == "" {
		return config.ErrNoDatabase
	}
	log := config.NewLogger(*logLevel, *logFormat)
	pool, err := migrations.Open(ctx, *dbURL, log)
	if err != nil {
		return err
	}
	defer pool.Close()

	bar := newProgressBar(stdout, os.Stderr, *format, name)
	kcfg := brokers.Config("mailplane-rebuild")
	rb, err := startRebuild(ctx, name, kcfg, pool, *schema, *batch, bar, log)
	if err != nil {
		return err
	}
	defer rb.Close()
	sum := summarize(rb)
	if *format == FormatText {
		fmt.Fprintf(stdout, "rebuilt the %s projection into schema %s: %s in %.3fs (%.0f records/s)\n",
			name, sum.Schema, describeRecords(name, sum), sum.TookSeconds, float64(sum.Records)/max(sum.TookSeconds, 1e-9))
	}
	finish := func(err error) error {
		if *format == FormatJSON {
			if jerr := writeJSON(stdout, sum); jerr != nil && err == nil {
				err = jerr
			}
		}
		return err
	}

	if *verify {
		rep, err := rb.Verify(ctx, *wait)
		if err != nil {
			return finish(fmt.Errorf("cannot compare the rebuild with the live projection: %w", err))
		}
		v := verifyResult{Equal: rep.Equal(), Positions: rep.Positions, Tables: rep.Tables}
		sum.Verify = &v
		if *format == FormatText {
			rep.Format(stdout)
		}
		if !v.Equal && !*yes {
			return finish(&ExitCodeError{Code: ExitVerifyFailed,
				Err: fmt.Errorf("the rebuild in schema %s differs from the live %s projection in %s", sum.Schema, name, sum.LiveSchema)})
		}
		if !v.Equal && *format == FormatText {
			fmt.Fprintln(stdout, "swapping despite the difference (--yes)")
		}
	}
	if *swap {
		act.started, act.params.To = true, sum.Schema
		if err := rb.Swap(ctx); err != nil {
			return finish(err)
		}
		sum.Swapped, sum.Previous = true, sum.Schema
		if *format == FormatText {
			fmt.Fprintf(stdout, "swapped in; the previous %s projection is in schema %s (mailplane rebuild cleanup drops it)\n", name, sum.Schema)
		}
		return finish(nil)
	}
	if *format == FormatText {
		fmt.Fprintf(stdout, "the rebuild stays in schema %s (mailplane rebuild cleanup drops it)\n", sum.Schema)
	}
	return finish(nil)
}

// swapFilter says, for the audit, what a swap was conditioned on.
func swapFilter(verify, yes bool) string {
	switch {
	case verify && yes:
		return "verify, yes"
	case verify:
		return "verify"
	case yes:
		return "yes"
	}
	return ""
}

func describeRecords(name string, s rebuildSummary) string {
	unit := "events"
	if name == rebuild.Placement {
		unit = "decisions"
	}
	out := fmt.Sprintf("%d %s up to %s", s.Records, unit, rebuild.DescribePositions(s.Positions))
	if s.Poison > 0 {
		out += fmt.Sprintf(", %d poison records passed", s.Poison)
	}
	return out
}

// cleanupReport is what `rebuild cleanup` prints with --format json.
type cleanupReport struct {
	DryRun  bool               `json:"dry_run"`
	Dropped []rebuild.Leftover `json:"dropped"`
	Kept    []rebuild.Leftover `json:"kept"`
	Failed  []string           `json:"failed,omitempty"`
}

func rebuildCleanup(ctx context.Context, args []string, stdout io.Writer) error {
	var act cliAction
	return act.finish(ctx, runRebuildCleanup(ctx, args, stdout, &act))
}

// runRebuildCleanup is rebuildCleanup; act records it in the operator
// audit.
func runRebuildCleanup(ctx context.Context, args []string, stdout io.Writer, act *cliAction) error {
	fs := flag.NewFlagSet("rebuild cleanup", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), rebuildUsage); fs.PrintDefaults() }
	brokers, dbURL := config.RegisterBrokerFlags(fs), config.DatabaseURL.String(fs)
	keep := fs.Int("keep", 0, "keep the N newest rebuild schemas of each projection")
	olderThan := fs.Duration("older-than", 0, "drop only rebuild schemas created longer ago than this (0: any age)")
	dryRun := fs.Bool("dry-run", false, "list what would be dropped, drop nothing")
	yes := fs.Bool("yes", false, "drop them")
	format := fs.String("format", FormatText, "output: text or json (for scripts)")
	fs.Parse(args)
	act.begin(brokers.Config("mailplane-rebuild-cleanup"), domain.OpsRebuildCleanup,
		domain.OpsParams{Filter: fmt.Sprintf("keep=%d older_than=%s", *keep, *olderThan), DryRun: *dryRun})
	if err := checkFormat(*format); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usageError(fmt.Sprintf("rebuild cleanup: unexpected argument %q", fs.Arg(0)))
	case *keep < 0 || *olderThan < 0:
		return usageError("--keep and --older-than are not negative")
	case *dryRun == *yes:
		return usageError("rebuild cleanup drops schemas: pass --dry-run to list what it would drop, or --yes to drop it")
	}
	if *dbURL == "" {
		return config.ErrNoDatabase
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	all, err := rebuild.List(ctx, pool)
	if err != nil {
		return err
	}
	drop, kept := rebuild.Pick(all, *keep, *olderThan, time.Now())
	rep := cleanupReport{DryRun: *dryRun, Dropped: []rebuild.Leftover{}, Kept: kept}
	if rep.Kept == nil {
		rep.Kept = []rebuild.Leftover{}
	}
	var errs []error
	act.started = !*dryRun
	defer func() { act.params.Count = int64(len(rep.Dropped)) }()
	for _, l := range drop {
		if *dryRun {
			rep.Dropped = append(rep.Dropped, l)
			continue
		}
		if err := rebuild.Drop(ctx, pool, l.Schema); err != nil {
			errs = append(errs, err)
			rep.Failed = append(rep.Failed, l.Schema)
			continue
		}
		rep.Dropped = append(rep.Dropped, l)
	}
	if *format == FormatJSON {
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		showCleanup(stdout, rep)
	}
	return errors.Join(errs...)
}

func showCleanup(out io.Writer, rep cleanupReport) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SCHEMA\tPROJECTION\tSTATE\tCREATED\tSIZE\tACTION")
	action := "dropped"
	if rep.DryRun {
		action = "would drop"
	}
	row := func(l rebuild.Leftover, a string) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.1f MiB\t%s\n", l.Schema, l.Projection, l.State, l.CreatedAt.UTC().Format(time.RFC3339),
			float64(l.Bytes)/(1<<20), a)
	}
	for _, l := range rep.Dropped {
		row(l, action)
	}
	for _, l := range rep.Kept {
		row(l, "kept")
	}
	w.Flush()
	if len(rep.Dropped)+len(rep.Kept) == 0 {
		fmt.Fprintln(out, "(no rebuild schemas)")
	}
}

// progressBar draws rebuild progress on stderr while stdout is a terminal
// (one line, redrawn), and nothing otherwise: not when stdout is a pipe or
// a file, nor with --format json.
type progressBar struct {
	w    io.Writer
	on   bool
	tty  bool
	name string
}

func newProgressBar(stdout, stderr *os.File, format, name string) *progressBar {
	return &progressBar{w: stderr, on: format == FormatText && isTerminal(stdout), tty: isTerminal(stderr), name: name}
}

// isTerminal: a character device other than /dev/null (which is one too,
// and where cron and systemd send output).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(st, null)
}

func (b *progressBar) report(p rebuild.Progress) {
	if b.on {
		unit := "events"
		if b.name == rebuild.Placement {
			unit = "decisions"
		}
		fmt.Fprint(b.w, renderProgress(b.name, unit, p.Fraction(), p.Records, p.Done, p.Total, p.Elapsed, p.Final, b.tty))
	}
}

// renderProgress renders one progress line: bar, share, records, rate,
// offsets done of the total and time left.
func renderProgress(name, unit string, f float64, records, done, total int64, elapsed time.Duration, final, tty bool) string {
	const width = 30
	n := int(f * width)
	bar := strings.Repeat("=", n)
	if n < width {
		bar += ">" + strings.Repeat(" ", width-n-1)
	}
	eta := "-"
	if final {
		eta = "done in " + elapsed.Round(time.Millisecond).String()
	} else if f > 0 {
		eta = time.Duration(float64(elapsed) * (1 - f) / f).Round(time.Second).String()
	}
	rate := 0.0
	if elapsed > 0 {
		rate = float64(records) / elapsed.Seconds()
	}
	line := fmt.Sprintf("rebuild %s [%s] %5.1f%%  %d %s  %.0f/s  offset %d/%d  %s",
		name, bar, 100*f, records, unit, rate, done, total, eta)
	switch {
	case tty && final:
		return "\r" + line + "\x1b[K\n"
	case tty:
		return "\r" + line + "\x1b[K"
	}
	return line + "\n"
}
