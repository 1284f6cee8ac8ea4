package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// Topics is `mailplane topics apply|list`: create missing topics and
// report drift (an error on drift), or show the catalog.
func Topics(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "apply" && args[0] != "list") {
		return usageError("usage: mailplane topics apply|list [--format text|json] [flags]")
	}
	fs := flag.NewFlagSet("topics "+args[0], flag.ExitOnError)
	brokers := config.RegisterBrokerFlags(fs)
	parts := config.StatePartitions.Int(fs)
	format := fs.String("format", FormatText, "output: text or json (for scripts)")
	fs.Parse(args[1:])
	if err := checkFormat(*format); err != nil {
		return err
	}
	kcfg := brokers.Config("mailplane-topics")
	specs := topics.Catalog(topics.Config{StatePartitions: int32(*parts), Namespace: kcfg.Namespace})
	if args[0] == "list" {
		if *format == FormatJSON {
			return writeJSON(os.Stdout, topicSpecsJSON(specs))
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tCLEANUP\tRETENTION.MS\tPURPOSE")
		for _, s := range specs {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\n", s.Name, s.Partitions, s.Cleanup, s.RetentionMs, s.Purpose)
		}
		return tw.Flush()
	}
	kc, err := kafka.NewClient(kcfg, kafka.KindAdmin)
	if err != nil {
		return err
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	rep, err := topics.Apply(ctx, kc, specs)
	if err != nil {
		return err
	}
	if *format == FormatJSON {
		if err := writeJSON(os.Stdout, topicReportOf(rep)); err != nil {
			return err
		}
	} else {
		printTopicReport(rep)
	}
	if err := rep.Err(); err != nil {
		return &ExitCodeError{Code: ExitDrift, Err: err}
	}
	return nil
}

// topicSpecJSON is one topic of `topics list --format json`.
type topicSpecJSON struct {
	Name        string `json:"name"`
	Partitions  int32  `json:"partitions"`
	Cleanup     string `json:"cleanup"`
	RetentionMs int64  `json:"retention_ms"`
	Purpose     string `json:"purpose"`
}

func topicSpecsJSON(specs []topics.Spec) []topicSpecJSON {
	out := make([]topicSpecJSON, len(specs))
	for i, s := range specs {
		out[i] = topicSpecJSON{s.Name, s.Partitions, s.Cleanup, s.RetentionMs, s.Purpose}
	}
	return out
}

// topicReportJSON is `topics apply --format json`.
type topicReportJSON struct {
	Created []string    `json:"created"`
	OK      []string    `json:"ok"`
	Drift   []driftJSON `json:"drift"`
}

type driftJSON struct {
	Topic   string `json:"topic"`
	Field   string `json:"field"`
	Want    string `json:"want"`
	Actual  string `json:"actual"`
	Message string `json:"message"`
}

func topicReportOf(rep topics.Report) topicReportJSON {
	out := topicReportJSON{Created: rep.Created, OK: rep.OK, Drift: []driftJSON{}}
	for _, d := range rep.Drift {
		out.Drift = append(out.Drift, driftJSON{d.Topic, d.Field, d.Want, d.Actual, d.String()})
	}
	return out
}

func printTopicReport(rep topics.Report) {
	for _, n := range rep.Created {
		fmt.Printf("created  %s\n", n)
	}
	for _, n := range rep.OK {
		fmt.Printf("ok       %s\n", n)
	}
	for _, d := range rep.Drift {
		fmt.Printf("DRIFT    %s\n", d)
	}
}
