package domain_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// TestDecodeMailboxStateRecord: a live record, a tombstone, and every way a
// record is refused, each with its stable code.
func TestDecodeMailboxStateRecord(t *testing.T) {
	t.Parallel()
	const id = "0190a5b2-4c5e-7b1a-9c3d-00000000c001"
	m := domain.MailboxStateRecord{
		MailboxID: id, OrgID: "0190a5b2-4c5e-7b1a-9c3d-00000000a001", UserID: "0190a5b2-4c5e-7b1a-9c3d-00000000b001",
		Address: "ada@example.com", Provider: domain.ProviderSMTPIMAP,
		IMAP:              domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: "ada"},
		SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "AAAA"},
		Enabled:           true, AddedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), SourceEventID: "0190a5b2-4c5e-7b1a-9c3d-00000000e001",
	}
	v, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	got, live, err := domain.DecodeMailboxStateRecord(domain.TypeMailboxStateRecord, []byte(id), v)
	if err != nil || !live || !got.SameSync(m) || got.SourceEventID != m.SourceEventID || !got.AddedAt.Equal(m.AddedAt) {
		t.Fatalf("live record: %+v live=%v err=%v", got, live, err)
	}
	if got, live, err := domain.DecodeMailboxStateRecord(domain.TypeMailboxStateRecord, []byte(id), nil); err != nil || live || got.MailboxID != id {
		t.Fatalf("tombstone: %+v live=%v err=%v", got, live, err)
	}
	for name, c := range map[string]struct {
		typ        string
		key, value []byte
		code       domain.Code
	}{
		"no key":       {domain.TypeMailboxStateRecord, nil, v, domain.CodeRequired},
		"other type":   {domain.TypeMailboxAdded, []byte(id), v, domain.CodeUnknownType},
		"empty type":   {"", []byte(id), v, domain.CodeUnknownType},
		"bad json":     {domain.TypeMailboxStateRecord, []byte(id), []byte("{"), domain.CodeMalformedJSON},
		"key mismatch": {domain.TypeMailboxStateRecord, []byte("0190a5b2-4c5e-7b1a-9c3d-00000000c002"), v, domain.CodeKeyMismatch},
		"invalid":      {domain.TypeMailboxStateRecord, []byte(id), []byte(`{"mailbox_id":"` + id + `"}`), domain.CodeInvalid},
	} {
		if _, _, err := domain.DecodeMailboxStateRecord(c.typ, c.key, c.value); domain.ErrorCode(err) != c.code {
			t.Errorf("%s: err %v, want code %s", name, err, c.code)
		}
	}
	if s := got.String(); s != "mailbox "+id+" (smtp_imap, imap.example.com:993)" {
		t.Errorf("String() = %q", s)
	}
}

// TestDecodeSyncTierRecord: a record, a tombstone, and the refusals.
func TestDecodeSyncTierRecord(t *testing.T) {
	t.Parallel()
	r := domain.SyncTierRecord{MailboxID: "m1", Tier: domain.SyncTierHot, Reason: domain.SyncReasonSession,
		Partition: 3, Epoch: 7, Owner: "sync-1", ChangedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	v, err := json.Marshal(&r)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := domain.DecodeSyncTierRecord(domain.TypeSyncTierRecord, []byte("m1"), v)
	if err != nil || !ok || got != r {
		t.Fatalf("record: %+v ok=%v err=%v", got, ok, err)
	}
	if got, ok, err := domain.DecodeSyncTierRecord("", []byte("m1"), nil); err != nil || ok || got.MailboxID != "m1" {
		t.Fatalf("tombstone: %+v ok=%v err=%v", got, ok, err)
	}
	for name, c := range map[string]struct {
		typ        string
		key, value []byte
	}{
		"other type":   {domain.TypeSyncTierChanged, []byte("m1"), v},
		"bad json":     {domain.TypeSyncTierRecord, []byte("m1"), []byte("{")},
		"key mismatch": {domain.TypeSyncTierRecord, []byte("m2"), v},
		"bad tier":     {domain.TypeSyncTierRecord, []byte("m1"), []byte(`{"mailbox_id":"m1","tier":"lukewarm"}`)},
		"no mailbox":   {domain.TypeSyncTierRecord, []byte(""), []byte(`{"tier":"hot"}`)},
	} {
		if _, _, err := domain.DecodeSyncTierRecord(c.typ, c.key, c.value); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// TestSyncAuditKeys: audit records about a partition are keyed by it, the
// others by their mailbox.
func TestSyncAuditKeys(t *testing.T) {
	t.Parallel()
	for d, want := range map[domain.Data]string{
		&domain.SyncOwnershipAcquired{Partition: 12}:   "partition-12",
		&domain.SyncOwnershipLost{Partition: 0}:        "partition-0",
		&domain.SyncOwnershipSuspended{Partition: 255}: "partition-255",
		&domain.SyncTierChanged{MailboxID: "m1"}:       "m1",
		&domain.SyncFailed{MailboxID: "m2"}:            "m2",
		&domain.SyncTierRecord{MailboxID: "m3"}:        "m3",
		domain.MailboxStateRecord{MailboxID: "m4"}:     "m4",
	} {
		if got := d.AggregateID(); got != want {
			t.Errorf("%T: AggregateID %q, want %q", d, got, want)
		}
		if n, ok := domain.NewRecord(d.EventType()); !ok || n.EventType() != d.EventType() {
			t.Errorf("%T: NewRecord(%s) = %T, %v", d, d.EventType(), n, ok)
		}
	}
}
