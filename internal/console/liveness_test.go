package console_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/console"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/internal/placement/postgres"
	"github.com/mailplane/mailplane/internal/query"
	"github.com/mailplane/mailplane/topics"
)

// projectDecisions folds ds into the placement projection of pool at
// offsets from off, as the placement projector does.
func projectDecisions(t *testing.T, pool *pgxpool.Pool, off int64, ds ...domain.PlacementDecision) {
	t.Helper()
	var recs []postgres.Record
	for i, d := range ds {
		recs = append(recs, postgres.Record{Offset: off + int64(i), Decision: topics.Decision{ID: domain.NewEventID(), Data: d}})
	}
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return postgres.New("").ApplyDecisions(t.Context(), tx, recs, off+int64(len(ds)))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// unitDB is a fresh migrated schema.
func unitDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db := pgtest.New(t)
	if err := migrations.Apply(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	return db.Pool
}

// TestConsoleFleetShowsLivenessHold: while the placement projection says
// the engine holds liveness, the fleet page says so (since when, how many
// workers of how many are silent) and the read model the query API's
// /v1/workers serves carries it; once the hold ends, the banner is gone.
func TestConsoleFleetShowsLivenessHold(t *testing.T) {
	t.Parallel()
	pool := unitDB(t)
	reader := query.NewReader(pool, 4)
	ts, _, _ := unitConfig(t, func(c *console.Config) { c.Facts = reader })
	cl := browserish(t)
	if resp, _ := login(t, ts, cl, unitOps); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	if _, page := fetch(t, cl, "GET", ts.URL+"/console/", nil, nil); strings.Contains(page, "liveness-hold") {
		t.Fatalf("a banner before any hold:\n%s", page)
	}
	held := time.Date(2026, 12, 1, 11, 58, 0, 0, time.UTC)
	projectDecisions(t, pool, 0, &domain.PlacementLivenessHeld{
		PlacementMeta: domain.PlacementMeta{At: held, Reason: domain.ReasonFleetSilent}, Scope: domain.LivenessScopeFleet,
		Silent: 5, Live: 6, SharePermille: 833, ThresholdPermille: 550, MinWorkers: 3,
	})
	_, page := fetch(t, cl, "GET", ts.URL+"/console/", nil, nil)
	if !strings.Contains(page, `id="liveness-hold"`) || !strings.Contains(page, "holding liveness since 2026-12-01 11:58:00") ||
		!strings.Contains(page, "5 of 6 workers silent") {
		t.Fatalf("no hold banner on the fleet page:\n%s", page)
	}
	o, err := reader.Workers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(o)
	var got struct {
		Liveness struct {
			Holding bool      `json:"holding"`
			Since   time.Time `json:"held_since"`
			Silent  int       `json:"silent_workers"`
		} `json:"liveness"`
	}
	if err := json.Unmarshal(b, &got); err != nil || !got.Liveness.Holding || !got.Liveness.Since.Equal(held) || got.Liveness.Silent != 5 {
		t.Fatalf("/v1/workers' overview: %v %s", err, b)
	}
	projectDecisions(t, pool, 1, &domain.PlacementLivenessResumed{
		PlacementMeta: domain.PlacementMeta{At: held.Add(time.Minute), Reason: domain.ReasonHeartbeatsResumed}, Scope: domain.LivenessScopeFleet,
		Silent: 0, Live: 6, SharePermille: 0, ThresholdPermille: 550, HeldSince: held,
	})
	if _, page := fetch(t, cl, "GET", ts.URL+"/console/", nil, nil); strings.Contains(page, "liveness-hold") {
		t.Fatalf("the banner outlives the hold:\n%s", page)
	}
}
