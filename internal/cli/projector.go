package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/applyonce"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/projections"
)

const projectorUsage = `usage: mailplane projector positions [--projector NAME]
       mailplane projector seek --projector NAME --topic TOPIC --partition N (--offset N | --start | --end)

A projector's position in each partition lives in Postgres (projector_offsets),
written in the transaction that applies the records; the offsets it commits to
its Kafka group only mirror it for lag tools. Resetting the group's offsets
in Console or rpk therefore moves nothing: seek does.
  positions  each partition's position in Postgres, the end of the partition,
             and the records between them
  seek       move one partition's position; a running projector reads on from
             there at its next transaction. Forward skips records for good.
             Back reads them again, but an event applied once stays applied
             once (by its id within the 7-day dedupe window; seek refuses to
             go below the records whose ids were pruned): to apply history
             again, rebuild instead. The placement
             projection is never moved: mailplane rebuild placement.`

// Projector is `mailplane projector positions|seek`.
func Projector(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || (args[0] != "positions" && args[0] != "seek") {
		return usageError(strings.TrimSpace(projectorUsage))
	}
	var act cliAction
	return act.finish(ctx, runProjector(ctx, args, out, &act))
}

// runProjector is Projector; act records a seek in the operator audit.
func runProjector(ctx context.Context, args []string, out io.Writer, act *cliAction) error {
	fs := flag.NewFlagSet("projector "+args[0], flag.ExitOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), projectorUsage); fs.PrintDefaults() }
	brokers, dbURL := config.RegisterBrokerFlags(fs), config.DatabaseURL.String(fs)
	name := fs.String("projector", "", "projector name (registry, health, placement)")
	topic := fs.String("topic", "", "seek: the topic")
	partition := fs.Int("partition", -1, "seek: the partition")
	offset := fs.Int64("offset", -1, "seek: the offset of the first record to apply next")
	toStart := fs.Bool("start", false, "seek: to the partition's start offset")
	toEnd := fs.Bool("end", false, "seek: to the partition's end (skip everything there now)")
	format := fs.String("format", FormatText, "positions: output text or json (for scripts)")
	fs.Parse(args[1:])
	if args[0] == "seek" {
		act.begin(brokers.Config("mailplane-projector-cli"), domain.OpsProjectorSeek,
			domain.OpsParams{Target: *name, Filter: fmt.Sprintf("%s/%d", *topic, *partition), To: seekTarget(*offset, *toStart, *toEnd)})
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	if *dbURL == "" {
		return config.ErrNoDatabase
	}
	pool, err := migrations.Open(ctx, *dbURL, config.NewLogger("warn", "text"))
	if err != nil {
		return err
	}
	defer pool.Close()
	kcfg := brokers.Config("mailplane-projector-cli")
	adm, err := kafka.NewAdmin(kcfg)
	if err != nil {
		return err
	}
	defer adm.Close()
	if args[0] == "positions" {
		return printPositions(ctx, out, adm, pool, *name, *format)
	}
	if *name == "" || *topic == "" || *partition < 0 {
		return usageError("seek needs --projector, --topic and --partition")
	}
	if n := btoi(*toStart) + btoi(*toEnd) + btoi(*offset >= 0); n != 1 {
		return usageError("seek needs exactly one of --offset, --start, --end")
	}
	if err := projections.CheckSeekable(kcfg.Namespace, *name, *topic); err != nil {
		return refused("not_seekable", err)
	}
	// The partition must be one of the projector's, on the broker, and
	// the position within what the broker holds: a position past the end
	// would skip records not written yet.
	start, err := boundary(ctx, adm, *topic, int32(*partition), false)
	if err != nil {
		return err
	}
	end, err := boundary(ctx, adm, *topic, int32(*partition), true)
	if err != nil {
		return err
	}
	to := *offset
	switch {
	case *toStart:
		to = start
	case *toEnd:
		to = end
	case to < start || to > end:
		return domain.Errorf(domain.CodeOutOfRange, "offset %d is outside %s/%d, which holds %d to %d", to, *topic, *partition, start, end)
	}
	// Seek is one transaction: an error changed nothing.
	act.params.To = strconv.FormatInt(to, 10)
	prev, err := projections.Seek(ctx, pool, kcfg.Namespace, *name, *topic, int32(*partition), to, time.Now())
	if err != nil {
		return seekRefusal(err)
	}
	fmt.Fprintf(out, "%s %s/%d: %d -> %d\n", *name, *topic, *partition, prev, to)
	return nil
}

// seekRefusal marks Seek's own refusals (no such projector position,
// below the dedupe floor) for the audit; a database's failure stays one.
func seekRefusal(err error) error {
	var (
		pe *pgconn.PgError
		ce *pgconn.ConnectError
		ne net.Error
	)
	switch {
	case errors.As(err, &pe), errors.As(err, &ce), errors.As(err, &ne), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, applyonce.ErrBelowFloor):
		return refused("below_floor", err)
	}
	return refused("not_seekable", err)
}

// seekTarget says, for the audit, where a seek was asked to go.
func seekTarget(offset int64, start, end bool) string {
	switch {
	case start:
		return "start"
	case end:
		return "end"
	case offset >= 0:
		return strconv.FormatInt(offset, 10)
	}
	return ""
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// boundary lists a partition's start or end offset.
func boundary(ctx context.Context, adm *kadm.Client, topic string, partition int32, end bool) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	list := adm.ListStartOffsets
	if end {
		list = adm.ListEndOffsets
	}
	offs, err := list(lctx, topic)
	if err != nil {
		return 0, fmt.Errorf("listing offsets of %s: %w", topic, err)
	}
	o, ok := offs.Lookup(topic, partition)
	if !ok || o.Err != nil {
		return 0, refused(domain.CodeNotFound, fmt.Errorf("no partition %s/%d on the broker (%v)", topic, partition, o.Err))
	}
	return o.Offset, nil
}

// printPositions prints each partition's position in Postgres next to
// the partition's end on the broker.
func printPositions(ctx context.Context, out io.Writer, adm *kadm.Client, pool *pgxpool.Pool, name, format string) error {
	pos, err := projections.Positions(ctx, pool, name)
	if err != nil {
		return err
	}
	tps := projections.PositionTopics(pos)
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(lctx, tps...)
	if err != nil {
		return fmt.Errorf("listing end offsets: %w", err)
	}
	if format == FormatJSON {
		rows := make([]positionJSON, len(pos))
		for i, p := range pos {
			rows[i] = positionJSON{Projector: p.Projector, Topic: p.Topic, Partition: p.Partition, Position: p.Next, UpdatedAt: p.UpdatedAt}
			if o, ok := ends.Lookup(p.Topic, p.Partition); ok && o.Err == nil {
				end, behind := o.Offset, max(0, o.Offset-p.Next)
				rows[i].End, rows[i].Behind = &end, &behind
			}
		}
		return writeJSON(out, rows)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTOR\tTOPIC\tPARTITION\tPOSITION\tEND\tBEHIND\tUPDATED")
	for _, p := range pos {
		end, behind := "?", "?"
		if o, ok := ends.Lookup(p.Topic, p.Partition); ok && o.Err == nil {
			end, behind = fmt.Sprint(o.Offset), fmt.Sprint(max(0, o.Offset-p.Next))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", p.Projector, p.Topic, p.Partition, p.Next, end, behind, p.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// positionJSON is one row of `projector positions --format json`; end and
// behind are absent when the broker did not answer for the partition.
type positionJSON struct {
	Projector string    `json:"projector"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Position  int64     `json:"position"`
	End       *int64    `json:"end,omitempty"`
	Behind    *int64    `json:"behind,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}
