package console

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"time"

	"github.com/mailplane/mailplane/internal/query"
)

var funcs = template.FuncMap{
	"ts":    formatTime,
	"tsp":   formatTimePtr,
	"ago":   ago,
	"milli": func(v int64) string { return strconv.FormatFloat(float64(v)/1000, 'f', 2, 64) },
	// pct is load (in thousandths) against capacity (in mailboxes of
	// weight 1), as a percentage for the load bars.
	"pct": func(loadMilli, capacity int64) int {
		if capacity <= 0 {
			return 0
		}
		return int(math.Min(100, math.Round(float64(loadMilli)/10/float64(capacity))))
	},
	// rate is a rate (0..1) as a percentage, to a tenth.
	"rate": func(r float64) string { return strconv.FormatFloat(r*100, 'f', 1, 64) + " %" },
	// span is a length in seconds, in days when whole days.
	"span": func(s int64) string {
		if d := time.Duration(s) * time.Second; d%(24*time.Hour) != 0 || d == 0 {
			return d.String()
		}
		return strconv.FormatInt(s/86400, 10) + " days"
	},
	"secs": func(s float64) string {
		return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
	},
	"secp": func(s *float64) string {
		if s == nil {
			return "-"
		}
		return (time.Duration(*s * float64(time.Second))).Round(time.Second).String()
	},
	"i64p": func(v *int64) string {
		if v == nil {
			return "?"
		}
		return strconv.FormatInt(*v, 10)
	},
	"orDash": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func formatTimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return formatTime(*t)
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

// chart is the warmup evidence as an SVG bar chart, drawn here so the
// page needs no script: one slot per hour of the scoring window ending
// now, inbox (bottom) and junk (stacked) per hour.
type chart struct {
	Width, Height int
	Bars          []bar
	Max           int64
	First, Last   string
	Inbox, Junk   int64
}

type bar struct {
	X, W           float64
	InboxY, InboxH float64
	JunkY, JunkH   float64
	Title          string
}

const (
	chartW = 720
	chartH = 140
)

func evidenceChart(ev []query.EvidenceHour, now time.Time, window time.Duration) chart {
	c := chart{Width: chartW, Height: chartH}
	hours := max(1, int(window/time.Hour))
	last := now.UTC().Truncate(time.Hour)
	first := last.Add(-time.Duration(hours-1) * time.Hour)
	c.First, c.Last = first.Format("2006-01-02 15:00Z"), last.Format("2006-01-02 15:00Z")
	for _, e := range ev {
		c.Max = max(c.Max, e.Inbox+e.Junk)
		c.Inbox += e.Inbox
		c.Junk += e.Junk
	}
	if c.Max == 0 {
		return c
	}
	bw := float64(chartW) / float64(hours)
	scale := float64(chartH-4) / float64(c.Max)
	for _, e := range ev {
		slot := int(e.Hour.Sub(first) / time.Hour)
		if slot < 0 || slot >= hours {
			continue // outside the window as of now: the scorer drops it at its next evaluation
		}
		ih, jh := float64(e.Inbox)*scale, float64(e.Junk)*scale
		c.Bars = append(c.Bars, bar{
			X: float64(slot) * bw, W: math.Max(1, bw-0.5),
			InboxY: chartH - ih, InboxH: ih,
			JunkY: chartH - ih - jh, JunkH: jh,
			Title: fmt.Sprintf("%s: %d inbox, %d junk", e.Hour.UTC().Format("2006-01-02 15:00Z"), e.Inbox, e.Junk),
		})
	}
	return c
}

// consumerRow is one consumer of the consumers page: its standing summed
// over partitions, and the partitions themselves for the details.
type consumerRow struct {
	query.Consumer
	// From Postgres positions.
	Partitions  int
	Behind      int64
	MaxBehind   int64
	OverBacklog bool
	Unknown     int // partitions whose end the broker did not give
	// From this process's meters.
	LocalParts   int
	LocalRecords int64
	LocalSeconds float64
	OverBehind   bool
	Rows         []partRow
}

// partRow is one partition of a consumer, from either source.
type partRow struct {
	Topic     string
	Partition int32
	Pos       *query.ConsumerPosition
	Local     *query.LocalLagPart
}

func consumerRows(cs []query.Consumer) []consumerRow {
	out := make([]consumerRow, 0, len(cs))
	for _, c := range cs {
		r := consumerRow{Consumer: c, Partitions: len(c.Positions)}
		byPart := map[string]int{}
		key := func(topic string, p int32) string { return topic + "/" + strconv.Itoa(int(p)) }
		for i := range c.Positions {
			p := &c.Positions[i]
			if p.Behind == nil {
				r.Unknown++
			} else {
				r.Behind += *p.Behind
				r.MaxBehind = max(r.MaxBehind, *p.Behind)
			}
			r.OverBacklog = r.OverBacklog || p.OverBacklog
			byPart[key(p.Topic, p.Partition)] = len(r.Rows)
			r.Rows = append(r.Rows, partRow{Topic: p.Topic, Partition: p.Partition, Pos: p})
		}
		if c.Local != nil {
			r.LocalParts = len(c.Local.Partitions)
			for i := range c.Local.Partitions {
				l := &c.Local.Partitions[i]
				r.LocalRecords += l.Records
				r.LocalSeconds = math.Max(r.LocalSeconds, l.Seconds)
				r.OverBehind = r.OverBehind || l.OverBehind
				r.OverBacklog = r.OverBacklog || l.OverBacklog
				if j, ok := byPart[key(l.Topic, l.Partition)]; ok {
					r.Rows[j].Local = l
				} else {
					r.Rows = append(r.Rows, partRow{Topic: l.Topic, Partition: l.Partition, Local: l})
				}
			}
		}
		out = append(out, r)
	}
	return out
}
