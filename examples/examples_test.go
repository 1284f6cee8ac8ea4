package examples_test

import (
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/examples"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/sealing"
)

var now = time.Date(2024, 7, 12, 7, 0, 0, 0, time.UTC)

func testSealer(t *testing.T) domain.SealFunc {
	t.Helper()
	k, err := sealing.ParseKeys("test:"+base64.StdEncoding.EncodeToString(make([]byte, sealing.KeySize)), "")
	if err != nil {
		t.Fatal(err)
	}
	return k.Seal
}

// parseAll parses every example file, keyed by file name.
func parseAll(t *testing.T) map[string]domain.Event {
	t.Helper()
	seal := testSealer(t)
	names, err := fs.Glob(examples.EventFiles(), "*")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]domain.Event{}
	for _, name := range names {
		raw, err := fs.ReadFile(examples.EventFiles(), name)
		if err != nil {
			t.Fatal(err)
		}
		// A type only mailplane's roles write is shown in its log form,
		// sealed credentials and all, which ingest refuses.
		s := seal
		if typ, ok := domain.ResolveType(strings.TrimSuffix(name, ".json")); ok && domain.FromRolesOnly(typ) {
			s = nil
		}
		ev, ps := domain.ParseStructured(raw, now, s)
		if len(ps) > 0 {
			t.Errorf("%s: %s", name, ps)
			continue
		}
		out[name] = ev
	}
	return out
}

func TestExamplesParse(t *testing.T) {
	t.Parallel()
	evs := parseAll(t)
	byType := map[string][]string{}
	for name, ev := range evs {
		byType[ev.Type] = append(byType[ev.Type], name)
		if want := examples.EventFileName(ev.Type); name != want {
			t.Errorf("%s holds a %s event; name it %s", name, ev.Type, want)
		}
		if !domain.IsUUIDv7(ev.ID) {
			t.Errorf("%s: id %q is not a UUIDv7", name, ev.ID)
		}
		if ev.Subject != ev.Data.AggregateID() {
			t.Errorf("%s: subject %q is not the aggregate id %q", name, ev.Subject, ev.Data.AggregateID())
		}
	}
	for _, typ := range domain.EventTypes() {
		if n := len(byType[typ]); n != 1 {
			t.Errorf("%s has %d examples (%v), want exactly 1", typ, n, byType[typ])
		}
		if _, err := examples.Event(typ); err != nil {
			t.Errorf("examples.Event(%s): %v", typ, err)
		}
	}
	if len(evs) != len(domain.EventTypes()) {
		t.Errorf("%d example files for %d event types", len(evs), len(domain.EventTypes()))
	}
}

func TestExamplesStructure(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(examples.EventFiles(), "*")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		raw, _ := fs.ReadFile(examples.EventFiles(), name)
		var attrs map[string]json.RawMessage
		if err := json.Unmarshal(raw, &attrs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// Ready to publish: every attribute set explicitly, none defaulted.
		for _, a := range []string{"specversion", "id", "type", "source", "time", "subject", "datacontenttype", "data"} {
			if _, ok := attrs[a]; !ok {
				t.Errorf("%s: attribute %q is missing", name, a)
			}
		}
		var ct string
		_ = json.Unmarshal(attrs["datacontenttype"], &ct)
		if ct != "application/json" {
			t.Errorf("%s: datacontenttype %q", name, ct)
		}
		if !strings.HasSuffix(name, ".json") {
			t.Errorf("%s: not a .json file", name)
		}
	}
}

// TestExamplesMatchSchemas checks the log form of every example (after
// sealing) against its JSON Schema, and that the raw mailbox.added data,
// with plain credentials, is refused by it.
func TestExamplesMatchSchemas(t *testing.T) {
	t.Parallel()
	v := eventschema.Default()
	for name, ev := range parseAll(t) {
		data, err := json.Marshal(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		if ps := v.Validate(ev.Type, data); len(ps) > 0 {
			t.Errorf("%s: log form does not match its schema: %s", name, ps)
		}
	}
	raw, _ := examples.Event(domain.TypeMailboxAdded)
	var s struct{ Data json.RawMessage }
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	ps := v.Validate(domain.TypeMailboxAdded, s.Data)
	if !has(ps, "data.credentials") || !has(ps, "data.sealed_credentials") {
		t.Errorf("plain credentials must fail the schema at data.credentials and data.sealed_credentials, got %s", ps)
	}
}

func has(ps domain.Problems, field string) bool {
	for _, p := range ps {
		if p.Field == field {
			return true
		}
	}
	return false
}

// TestExamplesConsistent checks that the examples describe one small world.
func TestExamplesConsistent(t *testing.T) {
	t.Parallel()
	evs := map[string]domain.Event{}
	for _, ev := range parseAll(t) {
		evs[ev.Type] = ev
	}
	added, ok1 := evs[domain.TypeMailboxAdded].Data.(*domain.MailboxAdded)
	org, ok2 := evs[domain.TypeOrgPlanChanged].Data.(*domain.OrgPlanChanged)
	user, ok3 := evs[domain.TypeUserActive].Data.(*domain.UserActive)
	hb, ok4 := evs[domain.TypeWorkerHeartbeat].Data.(*domain.WorkerHeartbeat)
	hs, ok5 := evs[domain.TypeWorkerHealthSampled].Data.(*domain.WorkerHealthSampled)
	removed, ok6 := evs[domain.TypeMailboxRemoved].Data.(*domain.MailboxRemoved)
	scored, ok7 := evs[domain.TypeMailboxHealthScored].Data.(*domain.MailboxHealthScored)
	disabled, ok8 := evs[domain.TypeMailboxDisabled].Data.(*domain.MailboxDisabled)
	observed, ok9 := evs[domain.TypeWarmupObserved].Data.(*domain.WarmupObserved)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 || !ok8 || !ok9 {
		t.Fatal("an example is missing or has the wrong data type")
	}
	if added.OrgID != org.OrgID {
		t.Errorf("mailbox org_id %s, org example %s", added.OrgID, org.OrgID)
	}
	if added.UserID != user.UserID {
		t.Errorf("mailbox user_id %s, user example %s", added.UserID, user.UserID)
	}
	if removed.MailboxID != added.MailboxID || scored.MailboxID != added.MailboxID ||
		disabled.MailboxID != added.MailboxID || observed.MailboxID != added.MailboxID {
		t.Errorf("mailbox examples name different mailboxes: %s %s %s %s %s",
			added.MailboxID, removed.MailboxID, scored.MailboxID, disabled.MailboxID, observed.MailboxID)
	}
	// The example mailbox sent the warmup message; another mailbox got it.
	if observed.RecipientMailboxID == "" || observed.RecipientMailboxID == added.MailboxID {
		t.Errorf("warmup_observed recipient %q: want another mailbox than the sender %s", observed.RecipientMailboxID, added.MailboxID)
	}
	if disabled.Cause != domain.DisableAuthFailing || disabled.FailingSince == nil || !disabled.FailingSince.Before(evs[domain.TypeMailboxDisabled].Time) {
		t.Errorf("mailbox.disabled: want an auth_failing example failing since before it was disabled: %+v", disabled)
	}
	if hb.WorkerID != hs.WorkerID {
		t.Errorf("worker examples name different workers: %s %s", hb.WorkerID, hs.WorkerID)
	}
	if added.IMAP.Host != "127.0.0.1" || added.IMAP.Port != 1143 || added.IMAP.TLS != domain.TLSNone || added.IMAP.Username != added.Address {
		t.Errorf("mailbox.added must point at the dev IMAP server as its own address: %+v", added.IMAP)
	}
	if added.Credentials != nil || added.SealedCredentials == nil {
		t.Error("mailbox.added credentials were not sealed by ParseStructured")
	}
	ids := map[string]string{}
	for typ, ev := range evs {
		if other, dup := ids[ev.ID]; dup {
			t.Errorf("%s and %s share event id %s", typ, other, ev.ID)
		}
		ids[ev.ID] = typ
	}
}
