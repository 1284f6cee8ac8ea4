package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/migrations"
)

// Migrate is `mailplane migrate`: apply the database migrations.
func Migrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ExitOnError)
	dbURL := config.DatabaseURL.String(fs)
	logLevel, logFormat := config.LogLevel.String(fs), config.LogFormat.String(fs)
	fs.Parse(args)
	if *dbURL == "" {
		return config.ErrNoDatabase
	}
	pool, err := migrations.Open(ctx, *dbURL, config.NewLogger(*logLevel, *logFormat))
	if err != nil {
		return err
	}
	pool.Close()
	fmt.Println("migrations applied")
	return nil
}
