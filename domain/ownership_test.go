package domain

import (
	"testing"
)

// TestMayActOn: a caller acts on what its tenant (its configured source)
// owns and on what no one owns; ops on anything; a caller without a
// source, or none, on nothing owned.
func TestMayActOn(t *testing.T) {
	t.Parallel()
	alpha := &Caller{Source: "/alpha", Scopes: []string{ScopePublishPublic}}
	ops := &Caller{Source: "/ops", Scopes: []string{ScopeOps}}
	worker := &Caller{WorkerID: "w"}
	var nobody *Caller
	for _, tc := range []struct {
		c     *Caller
		owner string
		ok    bool
	}{
		{alpha, "/alpha", true}, {alpha, "", true}, {alpha, "/beta", false},
		{alpha, "/alpha/sessions", false}, // a tenant is the configured source, not a path below it
		{alpha, "/alph", false},
		{ops, "/beta", true}, {ops, "", true},
		{worker, "", true}, {worker, "/alpha", false},
		{nobody, "", false}, {nobody, "/alpha", false},
	} {
		if got := tc.c.MayActOn(tc.owner); got != tc.ok {
			t.Errorf("%+v on %q: %v", tc.c, tc.owner, got)
		}
	}
	if alpha.Tenant() != "/alpha" || nobody.Tenant() != "" {
		t.Error("tenant")
	}
}

// TestOwnershipEffects: adds claim their mailbox and org, removals
// release, transfers move; the internal mailbox types and the other
// aggregates have no effect.
func TestOwnershipEffects(t *testing.T) {
	t.Parallel()
	add := OwnershipEffects(&MailboxAdded{MailboxID: "m", OrgID: "o"})
	if len(add) != 2 || add[0] != (OwnershipEffect{Kind: OwnedMailbox, ID: "m", Claims: true}) || add[1] != (OwnershipEffect{Kind: OwnedOrg, ID: "o", Claims: true}) {
		t.Errorf("added: %+v", add)
	}
	if rm := OwnershipEffects(&MailboxRemoved{MailboxID: "m"}); len(rm) != 1 || !rm[0].Releases || rm[0].ID != "m" {
		t.Errorf("removed: %+v", rm)
	}
	if tr := OwnershipEffects(&OrgOwnerTransferred{OrgID: "o", Owner: "/b"}); len(tr) != 1 || tr[0] != (OwnershipEffect{Kind: OwnedOrg, ID: "o", TransferTo: "/b"}) {
		t.Errorf("org transfer: %+v", tr)
	}
	if tr := OwnershipEffects(&MailboxOwnerTransferred{MailboxID: "m", Owner: "/b"}); len(tr) != 1 || tr[0].TransferTo != "/b" || tr[0].Kind != OwnedMailbox {
		t.Errorf("mailbox transfer: %+v", tr)
	}
	for _, d := range []Data{&MailboxHealthScored{}, &MailboxDisabled{}, &WarmupObserved{}, &CredentialsRotated{}, &OrgPlanChanged{}, &UserActive{}, &WorkerHeartbeat{}, &WorkerHealthSampled{}, nil} {
		if e := OwnershipEffects(d); e != nil {
			t.Errorf("%T: %+v", d, e)
		}
	}
}

// TestTenantOf: a source belongs to the longest tenant that may speak as
// it; one that none may is unmapped.
func TestTenantOf(t *testing.T) {
	t.Parallel()
	tenants := []string{"/", "/product-api", "/product-api/billing", "urn:acme:"}
	for src, want := range map[string]string{
		"/product-api":                "/product-api",
		"/product-api/sessions":       "/product-api",
		"/product-api/billing/stripe": "/product-api/billing",
		"/importer":                   "/",
		"urn:acme:crm":                "urn:acme:",
		"mailplane/cli":               "",
	} {
		got, ok := TenantOf(src, tenants)
		if got != want || ok != (want != "") {
			t.Errorf("%q: %q %v, want %q", src, got, ok, want)
		}
	}
}
