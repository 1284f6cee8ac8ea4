package cli

import (
	"context"
	"flag"
	"os"
	"time"

	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/dlq"
)

// DLQ is `mailplane dlq list`: the newest dead letters.
func DLQ(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "list" {
		return usageError("usage: mailplane dlq list [--limit N] [--format text|json]")
	}
	fs := flag.NewFlagSet("dlq list", flag.ExitOnError)
	brokers := config.RegisterBrokerFlags(fs)
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
	if *format == FormatJSON {
		return writeJSON(os.Stdout, dlqEntriesJSON(entries))
	}
	return dlq.Format(os.Stdout, entries)
}

// dlqEntryJSON is one dead letter of `dlq list --format json`. The value
// is base64 (JSON's encoding of bytes), absent when withheld.
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
}

func dlqEntriesJSON(entries []dlq.Entry) []dlqEntryJSON {
	out := make([]dlqEntryJSON, len(entries))
	for i, e := range entries {
		hs := make(map[string]string, len(e.Headers))
		for _, h := range e.Headers {
			if _, dup := hs[h.Key]; !dup {
				hs[h.Key] = string(h.Value)
			}
		}
		out[i] = dlqEntryJSON{e.Partition, e.Offset, e.Time, e.SourceTopic, e.SourcePartition, e.SourceOffset, e.Consumer,
			string(e.ErrorCode), e.Error, e.Attempts, e.ValueWithheld, string(e.Key), e.Value, hs}
	}
	return out
}
