package cli

import (
	"context"
	"errors"
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
		return errors.New("usage: mailplane topics apply|list [flags]")
	}
	fs := flag.NewFlagSet("topics "+args[0], flag.ExitOnError)
	brokers := config.RegisterBrokerFlags(fs)
	parts := config.StatePartitions.Int(fs)
	fs.Parse(args[1:])
	specs := topics.Catalog(topics.Config{StatePartitions: int32(*parts)})
	if args[0] == "list" {
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tCLEANUP\tRETENTION.MS\tPURPOSE")
		for _, s := range specs {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\n", s.Name, s.Partitions, s.Cleanup, s.RetentionMs, s.Purpose)
		}
		return tw.Flush()
	}
	kc, err := kafka.NewClient(brokers.Config("mailplane-topics"), kafka.KindAdmin)
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
	printTopicReport(rep)
	return rep.Err()
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
