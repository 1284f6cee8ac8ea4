package cli

import (
	"context"
	"errors"
	"flag"
	"os"

	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/dlq"
)

// DLQ is `mailplane dlq list`: the newest dead letters.
func DLQ(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "list" {
		return errors.New("usage: mailplane dlq list [--limit N]")
	}
	fs := flag.NewFlagSet("dlq list", flag.ExitOnError)
	brokers := config.RegisterBrokerFlags(fs)
	limit := fs.Int("limit", 100, "show at most the newest N dead letters (0: all)")
	fs.Parse(args[1:])
	entries, err := dlq.List(ctx, brokers.Config("mailplane-dlq"), *limit)
	if err != nil {
		return err
	}
	return dlq.Format(os.Stdout, entries)
}
