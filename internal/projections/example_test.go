package projections_test

import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/projections"
)

// A projector in a tiny main: migrate, then run the registry projection
// until interrupted. Run leaves the group cleanly on the way out.
func Example_projector() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("MAILPLANE_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.Apply(ctx, pool); err != nil {
		log.Fatal(err)
	}

	kcfg := kafka.Config{Brokers: kafka.ParseBrokers(os.Getenv("MAILPLANE_BROKERS"))}
	p, err := projections.New(kcfg, pool, projections.NewRegistry(),
		projections.WithLogger(slog.Default()),
		projections.WithRegisterer(prometheus.DefaultRegisterer),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
