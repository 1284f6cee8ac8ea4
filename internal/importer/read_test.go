package importer

import (
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
)

func readAll(t *testing.T, in string, f Format) []row {
	t.Helper()
	rd, err := newReader(strings.NewReader(in), f, "/crm/import", "")
	if err != nil {
		t.Fatal(err)
	}
	var out []row
	for {
		r, ok, err := rd.read()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, r)
	}
}

// TestEventIDsLeaveCredentialsOut: a plain row's id is the same on every
// read, whatever its credentials, member order or spacing, and differs
// with any other field, with the source and with the seed.
func TestEventIDsLeaveCredentialsOut(t *testing.T) {
	t.Parallel()
	rows := readAll(t, strings.Join([]string{
		`{"mailbox_id":"m1","imap":{"port":993},"credentials":{"password":"one"}}`,
		`{"credentials":{"password":"two"}, "imap": {"port": 993}, "mailbox_id":"m1"}`,
		`{"mailbox_id":"m1","imap":{"port":994},"credentials":{"password":"one"}}`,
	}, "\n"), JSONL)
	if len(rows) != 3 || rows[0].id == "" || rows[0].id != rows[1].id || rows[0].id == rows[2].id {
		t.Fatalf("ids %q %q %q", rows[0].id, rows[1].id, rows[2].id)
	}
	if strings.Contains(rows[0].id, "one") || !strings.HasPrefix(rows[0].id, "imp-") {
		t.Errorf("id %q", rows[0].id)
	}
	line := `{"mailbox_id":"m1"}`
	a, _ := newReader(strings.NewReader(line), JSONL, "/crm/import", "")
	b, _ := newReader(strings.NewReader(line), JSONL, "/crm/import", "again")
	c, _ := newReader(strings.NewReader(line), JSONL, "/crm/other", "")
	ra, _, _ := a.read()
	rb, _, _ := b.read()
	rc, _, _ := c.read()
	if ra.id == rb.id || ra.id == rc.id {
		t.Errorf("seed or source left out of the id: %q %q %q", ra.id, rb.id, rc.id)
	}
	// The data is sent as read: a repeated member reaches the API, which
	// refuses it.
	dup := readAll(t, `{"mailbox_id":"a","mailbox_id":"b"}`, JSONL)
	if !strings.Contains(string(dup[0].event), `"data":{"mailbox_id":"a","mailbox_id":"b"}`) {
		t.Errorf("the row was rewritten: %s", dup[0].event)
	}
}

// TestCSVHeader: a header with an unknown or repeated column, or without
// mailbox_id, stops the import before any row is sent.
func TestCSVHeader(t *testing.T) {
	t.Parallel()
	for _, h := range []string{"mailbox_id,pin\n", "mailbox_id,address,address\n", "address\n", ""} {
		if _, err := newReader(strings.NewReader(h), CSV, "/s", ""); err == nil {
			t.Errorf("header %q taken", h)
		}
	}
	rows := readAll(t, "\ufeffMailbox_ID, address ,password\nm1,a@example.com,pw\n\"m2,a@example.com\n", CSV)
	if len(rows) != 2 || rows[0].refusal != nil || rows[1].refusal == nil || rows[1].refusal.Code != domain.CodeInvalid || rows[1].line != 3 {
		t.Fatalf("%+v", rows)
	}
	if !strings.Contains(string(rows[0].event), `"credentials":{"password":"pw"}`) || rows[0].line != 2 {
		t.Errorf("%s", rows[0].event)
	}
}
