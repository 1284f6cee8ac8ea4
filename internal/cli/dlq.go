package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/opsaudit"
)

const dlqUsage = `usage: mailplane dlq list [--limit N] [--format text|json]
       mailplane dlq redrive --consumer NAME [--code CODE] [--from-offset N] [--to-offset N]
                             [--again] [--out-of-order] [--dry-run] [--yes] [--format text|json]

  list     the newest dead letters; with a database (MAILPLANE_DATABASE_URL), whether
           each was redriven
  redrive  hand a consumer's dead letters back to it after a fix: each is
           appended again to its source partition, for that consumer only,
           and recorded; one redriven before is skipped unless --again, one
           whose key has later records in its partition refused unless
           --out-of-order.
           Without --yes it lists what it would redrive and asks (or, with
           no terminal, stops). Exit 0: all selected redriven or skipped;
           5: some refused (a withheld value: re-publish the event; later
           records of its key: check them) or left pending (run it again).`

// DLQ is `mailplane dlq list|redrive`.
func DLQ(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "redrive") {
		return usageError(dlqUsage)
	}
	if args[0] == "redrive" {
		return dlqRedrive(ctx, args[1:], os.Stdin, os.Stdout)
	}
	fs := flag.NewFlagSet("dlq list", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), dlqUsage); fs.PrintDefaults() }
	brokers, dbURL := config.RegisterBrokerFlags(fs), config.DatabaseURL.String(fs)
	limit := fs.Int("limit", 100, "show at most the newest N dead letters (0: all)")
	format := fs.String("format", FormatText, "output: text or json (for scripts)")
	fs.Parse(args[1:])
	if err := checkFormat(*format); err != nil {
		return err
	}
	entries, err := dlq.List(ctx, brokers.Config("mailplane-dlq"), *limit)
	if err != nil {
		return err
	}
	// Whether each was redriven lives in Postgres; without a database
	// the list still shows (redriven unknown).
	var redrives map[dlq.Location]dlq.Redriven
	if *dbURL != "" {
		pool, err := migrations.Open(ctx, *dbURL, config.NewLogger("warn", "text"))
		if err != nil {
			return err
		}
		defer pool.Close()
		if redrives, err = dlq.Redrives(ctx, pool, entries); err != nil {
			return err
		}
	}
	if *format == FormatJSON {
		return writeJSON(os.Stdout, dlqEntriesJSON(entries, redrives))
	}
	return dlq.Format(os.Stdout, entries, redrives)
}

// dlqEntryJSON is one dead letter of `dlq list --format json`. The value
// is base64 (JSON's encoding of bytes), absent when withheld. Redriven is
// absent when the list had no database to ask.
type dlqEntryJSON struct {
	Partition       int32             `json:"partition"`
	Offset          int64             `json:"offset"`
	Time            time.Time         `json:"time"`
	SourceTopic     string            `json:"source_topic"`
	SourcePartition int32             `json:"source_partition"`
	SourceOffset    int64             `json:"source_offset"`
	Consumer        string            `json:"consumer"`
	ErrorCode       string            `json:"error_code"`
	Error           string            `json:"error"`
	Attempts        int               `json:"attempts"`
	ValueWithheld   string            `json:"value_withheld,omitempty"`
	Key             string            `json:"key"`
	Value           []byte            `json:"value,omitempty"`
	Headers         map[string]string `json:"headers"`
	Redriven        *redrivenJSON     `json:"redriven,omitempty"`
}

// redrivenJSON is the latest redrive of a dead letter; a dead letter never
// redriven has "redriven": {"redriven": false}.
type redrivenJSON struct {
	Redriven    bool       `json:"redriven"`
	RedriveID   string     `json:"redrive_id,omitempty"`
	Actor       string     `json:"actor,omitempty"`
	State       string     `json:"state,omitempty"` // done or pending
	Offset      *int64     `json:"offset,omitempty"`
	RequestedAt *time.Time `json:"requested_at,omitempty"`
}

func dlqEntriesJSON(entries []dlq.Entry, redrives map[dlq.Location]dlq.Redriven) []dlqEntryJSON {
	out := make([]dlqEntryJSON, len(entries))
	for i, e := range entries {
		out[i] = dlqEntryToJSON(e)
		if redrives != nil {
			rj := &redrivenJSON{}
			if r, ok := redrives[dlq.Location{Partition: e.Partition, Offset: e.Offset}]; ok {
				rj = &redrivenJSON{Redriven: true, RedriveID: r.RedriveID, Actor: r.Actor, State: "pending", RequestedAt: &r.RequestedAt}
				if r.Done {
					off := r.Offset
					rj.State, rj.Offset = "done", &off
				}
			}
			out[i].Redriven = rj
		}
	}
	return out
}

func dlqEntryToJSON(e dlq.Entry) dlqEntryJSON {
	hs := make(map[string]string, len(e.Headers))
	for _, h := range e.Headers {
		if _, dup := hs[h.Key]; !dup {
			hs[h.Key] = string(h.Value)
		}
	}
	return dlqEntryJSON{Partition: e.Partition, Offset: e.Offset, Time: e.Time, SourceTopic: e.SourceTopic,
		SourcePartition: e.SourcePartition, SourceOffset: e.SourceOffset, Consumer: e.Consumer,
		ErrorCode: string(e.ErrorCode), Error: e.Error, Attempts: e.Attempts, ValueWithheld: e.ValueWithheld,
		Key: string(e.Key), Value: e.Value, Headers: hs}
}

// errNothingConfirmed: redrive without --yes, and no one said yes.
var errNothingConfirmed = errors.New("nothing redriven: run again with --yes to hand these back (or --dry-run to only list them)")

// dlqRedrive is `mailplane dlq redrive`.
func dlqRedrive(ctx context.Context, args []string, in *os.File, out io.Writer) error {
	var act cliAction
	return act.finish(ctx, runDLQRedrive(ctx, args, in, out, &act))
}

// runDLQRedrive is dlqRedrive; act records it in the operator audit.
func runDLQRedrive(ctx context.Context, args []string, in *os.File, out io.Writer, act *cliAction) error {
	fs := flag.NewFlagSet("dlq redrive", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), dlqUsage); fs.PrintDefaults() }
	brokers, dbURL := config.RegisterBrokerFlags(fs), config.DatabaseURL.String(fs)
	source := config.Source.String(fs)
	consumer := fs.String("consumer", "", "the consumer whose dead letters to hand back: "+strings.Join(dlq.RedrivableConsumers(), ", "))
	code := fs.String("code", "", "only dead letters of this error code")
	from := fs.Int64("from-offset", unset, "only dead letters at this DLQ offset or later")
	to := fs.Int64("to-offset", unset, "only dead letters at this DLQ offset or earlier")
	again := fs.Bool("again", false, "redrive dead letters redriven before, too")
	outOfOrder := fs.Bool("out-of-order", false, "redrive dead letters whose key has later records in the source partition, too (they are applied after those)")
	dryRun := fs.Bool("dry-run", false, "list what would be redriven; change nothing")
	yes := fs.Bool("yes", false, "redrive without asking")
	format := fs.String("format", FormatText, "output: text or json (for scripts)")
	fs.Parse(args)
	if err := checkFormat(*format); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("dlq redrive takes no arguments, only flags: " + strings.Join(fs.Args(), " "))
	}
	sel := dlq.Selection{Consumer: *consumer, Code: domain.Code(*code), FromOffset: offsetFlag(*from), ToOffset: offsetFlag(*to),
		Again: *again, OutOfOrder: *outOfOrder, DryRun: *dryRun}
	act.begin(brokers.Config("mailplane-dlq-redrive"), domain.OpsDLQRedrive, opsaudit.RedriveParams(sel, nil))
	if err := sel.Check(); err != nil {
		return &ExitCodeError{Code: ExitUsage, Err: err}
	}
	if *dbURL == "" {
		return fmt.Errorf("%w; redrives are recorded there", config.ErrNoDatabase)
	}
	caller, err := cliCaller(*source)
	if err != nil {
		return err
	}
	pool, err := migrations.Open(ctx, *dbURL, config.NewLogger("warn", "text"))
	if err != nil {
		return err
	}
	defer pool.Close()
	kcfg := brokers.Config("mailplane-dlq-redrive")
	if !*yes && !*dryRun {
		plan := sel
		plan.DryRun = true
		rep, err := dlq.Redrive(ctx, kcfg, pool, caller, plan)
		if err != nil {
			return err
		}
		if rep.Count(dlq.OutcomeWouldRedrive) == 0 {
			return printRedrive(out, *format, rep)
		}
		if !isTerminal(in) {
			if err := printRedrive(out, *format, rep); err != nil {
				return err
			}
			return &ExitCodeError{Code: ExitUsage, Err: errNothingConfirmed}
		}
		if err := printRedrive(out, FormatText, rep); err != nil {
			return err
		}
		fmt.Fprintf(out, "redrive %d dead letters to %s? [y/N] ", rep.Count(dlq.OutcomeWouldRedrive), sel.Consumer)
		answer, _ := bufio.NewReader(in).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return errNothingConfirmed
		}
	}
	act.started = !sel.DryRun
	rep, rerr := dlq.Redrive(ctx, kcfg, pool, caller, sel)
	act.params = opsaudit.RedriveParams(sel, &rep)
	if rerr != nil && len(rep.Items) == 0 {
		return rerr // it did not get as far as any dead letter
	}
	if err := printRedrive(out, *format, rep); err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	if n := rep.Count(dlq.OutcomeRefused) + rep.Count(dlq.OutcomePending); n > 0 {
		return &ExitCodeError{Code: ExitPartial, Err: fmt.Errorf("%d selected dead letters were not redriven (refused or pending; see above)", n)}
	}
	return nil
}

// unset is the default of --from-offset and --to-offset: no bound. Any
// other negative value is refused by the selection's check.
const unset = -1

func offsetFlag(v int64) *int64 {
	if v == unset {
		return nil
	}
	return &v
}

var userRE = regexp.MustCompile(`[^a-z0-9._-]`)

// cliCaller is who the CLI acts as: it holds the brokers' and the
// database's credentials, so it runs as ops; its name carries the OS user
// (for the record), its source the ce source the CLI speaks as.
func cliCaller(source string) (*domain.Caller, error) {
	if !domain.IsCleanText(source) || source == "" || len(source) > 256 {
		return nil, domain.Errorf(domain.CodeInvalid, "--source must be clean text of 1-256 bytes")
	}
	name := "cli"
	if u, err := user.Current(); err == nil && u.Username != "" {
		if n := userRE.ReplaceAllString(strings.ToLower(u.Username), "_"); n != "" {
			name += ":" + n[:min(len(n), 59)]
		}
	}
	return &domain.Caller{Name: name, Scopes: []string{domain.ScopeOps}, Source: source}, nil
}

// redriveJSON is the output of `dlq redrive --format json`.
type redriveJSON struct {
	RedriveID string            `json:"redrive_id,omitempty"`
	DryRun    bool              `json:"dry_run"`
	Summary   map[string]int    `json:"summary"`
	Items     []redriveItemJSON `json:"items"`
}

type redriveItemJSON struct {
	Partition       int32  `json:"dlq_partition"`
	Offset          int64  `json:"dlq_offset"`
	Consumer        string `json:"consumer"`
	ErrorCode       string `json:"error_code"`
	SourceTopic     string `json:"source_topic"`
	SourcePartition int32  `json:"source_partition"`
	SourceOffset    int64  `json:"source_offset"`
	Key             string `json:"key"`
	Outcome         string `json:"outcome"`
	Code            string `json:"code,omitempty"`
	Reason          string `json:"reason,omitempty"`
	RedriveID       string `json:"redrive_id,omitempty"`
	RedrivenOffset  *int64 `json:"redriven_offset,omitempty"`
}

var outcomes = []dlq.Outcome{dlq.OutcomeRedriven, dlq.OutcomeWouldRedrive, dlq.OutcomeCompleted, dlq.OutcomeSkipped, dlq.OutcomeRefused, dlq.OutcomePending}

func printRedrive(out io.Writer, format string, rep dlq.Report) error {
	if format == FormatJSON {
		j := redriveJSON{RedriveID: rep.RedriveID, DryRun: rep.DryRun, Summary: map[string]int{}, Items: []redriveItemJSON{}}
		for _, o := range outcomes {
			j.Summary[string(o)] = rep.Count(o)
		}
		for _, it := range rep.Items {
			e := it.Entry
			ij := redriveItemJSON{Partition: e.Partition, Offset: e.Offset, Consumer: e.Consumer, ErrorCode: string(e.ErrorCode),
				SourceTopic: e.SourceTopic, SourcePartition: e.SourcePartition, SourceOffset: e.SourceOffset, Key: string(e.Key),
				Outcome: string(it.Outcome), Code: string(it.Code), Reason: it.Reason, RedriveID: it.RedriveID}
			if it.Offset >= 0 {
				off := it.Offset
				ij.RedrivenOffset = &off
			}
			j.Items = append(j.Items, ij)
		}
		return writeJSON(out, j)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DLQ OFFSET\tSOURCE\tKEY\tCONSUMER\tCODE\tOUTCOME\tWHY")
	for _, it := range rep.Items {
		e := it.Entry
		why := it.Reason
		if it.Offset >= 0 {
			why = fmt.Sprintf("at %s[%d]@%d", e.SourceTopic, e.SourcePartition, it.Offset)
			if it.Outcome == dlq.OutcomeSkipped {
				why = it.Reason
			}
		}
		if it.Code != "" {
			why = string(it.Code) + ": " + why
		}
		fmt.Fprintf(tw, "%d/%d\t%s[%d]@%d\t%s\t%s\t%s\t%s\t%s\n", e.Partition, e.Offset, e.SourceTopic, e.SourcePartition, e.SourceOffset,
			dlq.Printable(string(e.Key), 40), e.Consumer, e.ErrorCode, it.Outcome, dlq.Printable(why, 160))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var parts []string
	for _, o := range outcomes {
		if n := rep.Count(o); n > 0 || o == dlq.OutcomeRedriven && !rep.DryRun || o == dlq.OutcomeWouldRedrive && rep.DryRun {
			parts = append(parts, fmt.Sprintf("%s %d", o, n))
		}
	}
	id := ""
	if rep.RedriveID != "" {
		id = " (redrive " + rep.RedriveID + ")"
	}
	_, err := fmt.Fprintf(out, "%s%s\n", strings.Join(parts, ", "), id)
	return err
}
