package opshttp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves GET /metrics (what g gathers) and the detailed GET
// /healthz of h. With reg, the metrics handler counts its own scrapes
// there (promhttp_metric_handler_*). Serve it on a listener only operators
// reach: its health answer carries error text.
func Handler(h *Health, g prometheus.Gatherer, reg prometheus.Registerer, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", h)
	if g != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
			ErrorLog:      errLogger{log},
			ErrorHandling: promhttp.ContinueOnError,
			Registry:      reg,
		}))
	}
	return mux
}

type errLogger struct{ log *slog.Logger }

func (e errLogger) Println(v ...any) {
	if e.log != nil {
		e.log.Warn("metrics: " + fmt.Sprint(v...))
	}
}

// Serve serves h on addr until ctx is done, then shuts down gracefully
// (five seconds at most).
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("ops listener: %w", err)
	}
	log.Info("ops listening (metrics, detailed health)", "addr", ln.Addr().String())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}
