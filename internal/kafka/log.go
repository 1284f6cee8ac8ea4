package kafka

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// clientLogger passes a client's warnings and errors to l through
// franz-go's own slog plugin, each tagged with the client id.
func clientLogger(l *slog.Logger, clientID string) kgo.Logger {
	return kslog.New(slog.New(warnFloor{l.Handler()}).With("kafka_client", clientID))
}

// warnFloor keeps franz-go's info and debug chatter (every fetch, every
// heartbeat) out of the log whatever the handler's level: kslog asks the
// handler which levels are enabled.
type warnFloor struct{ slog.Handler }

func (h warnFloor) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnFloor) WithAttrs(as []slog.Attr) slog.Handler { return warnFloor{h.Handler.WithAttrs(as)} }

func (h warnFloor) WithGroup(name string) slog.Handler { return warnFloor{h.Handler.WithGroup(name)} }
