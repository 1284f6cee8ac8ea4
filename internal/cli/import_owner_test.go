package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/importer"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/ownership"
	"github.com/mailplane/mailplane/internal/pgtest"
)

// TestImportRefusesForeignMailboxesByLine: a row registering a mailbox
// another tenant owns is refused not_owner on its own line; the rows
// around it, in the same batch, land.
func TestImportRefusesForeignMailboxesByLine(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ownership_claims (kind, id, owner, claimed_at) VALUES ('mailbox', $1, '/other', now())`, uuid7(42)); err != nil {
		t.Fatal(err)
	}
	a := startImportAPI(t, api.WithAdmission(api.OwnershipAdmission(ownership.NewGuard(ownership.NewStore(db.Pool)))))
	var lines []string
	for _, n := range []int{41, 42, 43, 44} {
		lines = append(lines, jsonLine(t, plainRow(n)))
	}
	file := filepath.Join(t.TempDir(), "fleet.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runImport(t, file, "--api", a.base, "--api-token", importToken, "--source", "/crm/import", "--batch", "4", "--format", "json")
	if code != ExitPartial {
		t.Fatalf("exit %d, want %d\n%s\n%s", code, ExitPartial, out, errOut)
	}
	var s importer.Summary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	checkSummary(t, s, 4, 3, []wantRow{{2, domain.CodeNotOwner, "data.mailbox_id"}})
	if ids := a.loggedIDs(t); len(ids) != 3 {
		t.Fatalf("the log holds %d events, want the 3 rows of /crm's own mailboxes", len(ids))
	}
}
