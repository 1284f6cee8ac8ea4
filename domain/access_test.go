package domain

import (
	"slices"
	"testing"
)

// TestPublishScopes: publish:public covers the public producer types and
// nothing else; every other type needs its explicit scope, and
// org.plan_changed needs ops besides.
func TestPublishScopes(t *testing.T) {
	t.Parallel()
	public := &Caller{Scopes: []string{ScopePublishPublic}}
	everything := &Caller{Scopes: AllScopes()}
	for _, typ := range EventTypes() {
		miss := public.PublishScopeMissing(typ)
		if IsPublicEventType(typ) != (miss == "") {
			t.Errorf("publish:public and %s: missing %q", typ, miss)
		}
		if !IsPublicEventType(typ) && miss != PublishScope(typ) {
			t.Errorf("%s: the refusal names %q, want %q", typ, miss, PublishScope(typ))
		}
		if m := everything.PublishScopeMissing(typ); m != "" {
			t.Errorf("every scope and %s: missing %q", typ, m)
		}
		own := &Caller{Scopes: []string{PublishScope(typ)}}
		if m := own.PublishScopeMissing(typ); !IsOpsOnlyType(typ) && m != "" {
			t.Errorf("%s with its own scope: missing %q", typ, m)
		}
	}
	for _, typ := range []string{TypeOrgPlanChanged, TypeMailboxOwnerTransferred, TypeOrgOwnerTransferred} {
		c := &Caller{Scopes: []string{PublishScope(typ), ScopePublishPublic}}
		if m := c.PublishScopeMissing(typ); m != ScopeOps {
			t.Errorf("%s without ops: missing %q", typ, m)
		}
	}
	// Read or ops scopes publish nothing.
	ops := &Caller{Scopes: []string{ScopeOps, ScopeWorkersRead, ScopeAuditRead, ScopeFleetRead}}
	for _, typ := range EventTypes() {
		if ops.PublishScopeMissing(typ) == "" {
			t.Errorf("ops scopes publish %s", typ)
		}
	}
	var nobody *Caller
	if nobody.PublishScopeMissing(TypeUserActive) == "" || nobody.MaySpeakAs("/x") || nobody.MayReadAssignmentsOf("w") {
		t.Error("a nil caller may act")
	}
}

func TestMaySpeakAs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		own, src string
		ok       bool
	}{
		{"/product-api", "/product-api", true},
		{"/product-api", "/product-api/sessions", true},
		{"/product-api", "/product-api2", false},
		{"/product-api", "/product", false},
		{"/product-api", "/billing", false},
		{"/", "/anything/below", true},
		{"urn:acme:", "urn:acme:product", true},
		{"urn:acme:", "urn:acmeco:product", false},
		{"mailplane/cli", "mailplane/cli", true},
		{"mailplane/cli", "mailplane/health", false},
		{"", "", false},
		// Below means plain segments after "<source>/": dot segments, raw or
		// percent-encoded in any case, empty segments, backslashes and
		// escapes of "/", "\\" or "%" are refused, not normalised.
		{"/product-api", "/product-api-evil", false},
		{"/product-api", "/product-api-evil/x", false},
		{"/product-api", "/product-api/../../billing", false},
		{"/product-api", "/product-api/..", false},
		{"/product-api", "/product-api/.", false},
		{"/product-api", "/product-api/./x", false},
		{"/product-api", "/product-api/x/../../billing", false},
		{"/product-api", "/product-api/%2e%2e/billing", false},
		{"/product-api", "/product-api/%2E%2E/billing", false},
		{"/product-api", "/product-api/.%2e/billing", false},
		{"/product-api", "/product-api/%2e/x", false},
		{"/product-api", "/product-api/%252e%252e/billing", false},
		{"/product-api", "/product-api/x%2f..%2f..%2fbilling", false},
		{"/product-api", "/product-api/..%5c..%5cbilling", false},
		{"/product-api", "/product-api/..\\billing", false},
		{"/product-api", "/product-api/%zz", false},
		{"/product-api", "/product-api/x%2", false},
		{"/product-api", "/product-api/", false},
		{"/product-api", "/product-api//billing", false},
		{"/product-api", "/product-api/x//y", false},
		{"/product-api", "/product-api/x/", false},
		{"/product-api", "/product-api/..?x=1", false},
		{"/product-api", "/product-api/..#frag", false},
		{"/product-api", "/product-api/?x", false},
		{"/", "//evil.example/billing", false},
		{"/", "/../billing", false},
		{"urn:acme:", "urn:acme:../billing", false},
		{"urn:acme:", "urn:acme:", true},
		// Plain segments, escapes of other bytes, dots inside a segment, a
		// query after a segment stay below.
		{"/product-api", "/product-api/sessions/v2", true},
		{"/product-api", "/product-api/a..b/.hidden/x.", true},
		{"/product-api", "/product-api/caf%C3%A9", true},
		{"/product-api", "/product-api/sessions?shard=2", true},
		{"/product-api", "/product-api/sessions#x", true},
	} {
		if got := (&Caller{Source: tc.own}).MaySpeakAs(tc.src); got != tc.ok {
			t.Errorf("%q as %q: %v", tc.own, tc.src, got)
		}
	}
}

func TestWorkerBinding(t *testing.T) {
	t.Parallel()
	w := &Caller{Name: "worker", WorkerID: "a"}
	reader := &Caller{Scopes: []string{ScopeWorkersRead}}
	if !w.MayHeartbeatAs("a") || w.MayHeartbeatAs("b") || w.MayHeartbeatAs("") {
		t.Error("worker heartbeat binding")
	}
	if !w.MayReadAssignmentsOf("a") || w.MayReadAssignmentsOf("b") {
		t.Error("worker assignments binding")
	}
	if reader.MayHeartbeatAs("a") || !reader.MayReadAssignmentsOf("b") {
		t.Error("workers:read")
	}
	if (&Caller{}).MayHeartbeatAs("") {
		t.Error("a file caller heartbeats as the empty id")
	}
}

func TestCheckScopes(t *testing.T) {
	t.Parallel()
	if msg := CheckScopes(AllScopes()); msg != "" {
		t.Fatal(msg)
	}
	if !slices.IsSorted(AllScopes()) {
		t.Error("AllScopes not sorted")
	}
	for _, bad := range [][]string{nil, {"*"}, {"publish:*"}, {"publish:mailbox"}, {"publish:mailplane.user.active.v1"},
		{"Publish:public"}, {"publish:org.plan_changed"}, {"publish:mailbox.owner_transferred"}, {"publish:org.owner_transferred", "publish:public"},
		{"ops", ""}, {"fleet:*"}, {"fleet:write"}, {"Fleet:read"}} {
		if CheckScopes(bad) == "" {
			t.Errorf("%q accepted", bad)
		}
	}
	// The query API's read scope stands alone: it needs no other.
	if msg := CheckScopes([]string{ScopeFleetRead}); msg != "" || !slices.Contains(AllScopes(), ScopeFleetRead) {
		t.Errorf("fleet:read: %q", msg)
	}
}
