package domain

import (
	"fmt"
	"slices"
	"strings"
)

// Scopes a caller may hold (docs/architecture.md §11, callers;
// SECURITY.md). A scope grants one kind of request; a caller holds a set
// of them.
const (
	// ScopePublishPrefix + a short event type ("publish:mailbox.added")
	// grants publishing that one type through POST /v1/events.
	ScopePublishPrefix = "publish:"
	// ScopePublishPublic grants publishing the public producer types
	// (PublicEventTypes) and nothing else, whatever types are added later.
	ScopePublishPublic = "publish:public"
	// ScopeWorkersRead grants reading any worker's assignments.
	ScopeWorkersRead = "workers:read"
	// ScopeOps grants operator commands; publish:org.plan_changed is only
	// honoured together with it.
	ScopeOps = "ops"
	// ScopeAuditRead grants reading audit data.
	ScopeAuditRead = "audit:read"
	// ScopeFleetRead grants the query API: GET /v1/mailboxes/{id},
	// /v1/orgs/{id} and /v1/workers, for scripts and product teams that
	// must not hold ops. ops grants them too.
	ScopeFleetRead = "fleet:read"
)

// PublicEventTypes are the types product systems produce: the only ones
// publish:public covers. Every other type, including any added later, is
// internal and needs its explicit publish:<type> scope.
var PublicEventTypes = []string{TypeMailboxAdded, TypeMailboxRemoved, TypeUserActive}

// IsPublicEventType reports whether publish:public covers t.
func IsPublicEventType(t string) bool { return slices.Contains(PublicEventTypes, t) }

// PublishScope is the explicit scope granting eventType.
func PublishScope(eventType string) string { return ScopePublishPrefix + ShortType(eventType) }

// AllScopes is every scope there is: each type's publish scope and the
// others. Dev mode's caller holds them all, listed, so that no wildcard
// ever grants an internal type.
func AllScopes() []string {
	out := []string{ScopePublishPublic, ScopeWorkersRead, ScopeOps, ScopeAuditRead, ScopeFleetRead}
	for _, t := range EventTypes() {
		out = append(out, PublishScope(t))
	}
	slices.Sort(out)
	return out
}

// CheckScope reports what is wrong with one scope of a caller ("" if
// nothing): unknown scopes are refused, so a typo never silently grants
// less (or, with a later type of the same name, more) than meant.
func CheckScope(s string) string {
	switch s {
	case ScopePublishPublic, ScopeWorkersRead, ScopeOps, ScopeAuditRead, ScopeFleetRead:
		return ""
	}
	if short, ok := strings.CutPrefix(s, ScopePublishPrefix); ok {
		if _, known := ResolveType(short); known && !strings.HasPrefix(short, "mailplane.") {
			return ""
		}
		return fmt.Sprintf("scope %q names no event type (want publish:<type> such as publish:mailbox.added)", s)
	}
	return fmt.Sprintf("unknown scope %q", s)
}

// CheckScopes checks a caller's scope set: every scope known, and the
// publish scope of an ops-only type (IsOpsOnlyType: org.plan_changed,
// the owner transfers) only with ops (plans are billing's, owners the
// operator's; only an operator may set one by hand).
func CheckScopes(scopes []string) string {
	if len(scopes) == 0 {
		return "no scopes"
	}
	for _, s := range scopes {
		if msg := CheckScope(s); msg != "" {
			return msg
		}
	}
	if !slices.Contains(scopes, ScopeOps) {
		for _, t := range opsOnlyTypes {
			if slices.Contains(scopes, PublishScope(t)) {
				return PublishScope(t) + " is only granted together with ops"
			}
		}
	}
	return ""
}

// Caller is an authenticated identity: who it is, what it may do and what
// ce source it speaks as. A worker credential (bound to one worker id)
// has WorkerID set and no scopes.
type Caller struct {
	Name     string   // from the tokens file; bounded, so usable as a metric label
	Scopes   []string // sorted
	Source   string   // the ce source its events carry (or a URI path below it)
	WorkerID string   // set for worker credentials only
}

// Has reports whether the caller holds scope.
func (c *Caller) Has(scope string) bool {
	return c != nil && slices.Contains(c.Scopes, scope)
}

// PublishScopeMissing returns "" when the caller may publish eventType,
// else the scope it lacks. Internal types need their explicit scope;
// publish:public covers the public producer types only.
func (c *Caller) PublishScopeMissing(eventType string) string {
	need := PublishScope(eventType)
	if c.Has(need) || (IsPublicEventType(eventType) && c.Has(ScopePublishPublic)) {
		if IsOpsOnlyType(eventType) && !c.Has(ScopeOps) {
			return ScopeOps
		}
		return ""
	}
	return need
}

// MaySpeakAs reports whether the caller may publish an event with ce
// source src: its own source, or a URI path below it ("/product-api"
// covers "/product-api/sessions", not "/product-api2" nor
// "/product-api-evil"). A source ending in "/" or ":" ("urn:acme:") is a
// prefix as it stands.
//
// What follows the caller's source is refused rather than normalised
// unless it is plain segments (belowSegments): a reader that resolves dot
// segments must not find "/product-api/../../billing" to be "/billing".
func (c *Caller) MaySpeakAs(src string) bool {
	if c == nil || c.Source == "" {
		return false
	}
	if src == c.Source {
		return true
	}
	prefix := c.Source
	if !strings.HasSuffix(prefix, "/") && !strings.HasSuffix(prefix, ":") {
		prefix += "/"
	}
	rest, ok := strings.CutPrefix(src, prefix)
	return ok && belowSegments(rest)
}

// belowSegments reports whether rest, the part of a source after its
// caller's prefix, is one or more path segments that no URI resolver would
// move out of the prefix: none empty (a leading "//" would even start an
// authority), none "." or "..", no backslash, and no percent escape of
// ".", "/", backslash or "%" (so "%2e%2e", "%2f" and a double-encoded
// "%252e" are refused, as is a malformed escape). A query or fragment
// ends the path, so segments are checked up to there.
func belowSegments(rest string) bool {
	path := rest
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	for seg := range strings.SplitSeq(path, "/") {
		if seg == "" || seg == "." || seg == ".." || strings.ContainsRune(seg, '\\') {
			return false
		}
		for i := 0; i < len(seg); i++ {
			if seg[i] != '%' {
				continue
			}
			if i+2 >= len(seg) || !isHex(seg[i+1]) || !isHex(seg[i+2]) {
				return false
			}
			switch strings.ToLower(seg[i+1 : i+3]) {
			case "2e", "2f", "5c", "25":
				return false
			}
		}
	}
	return true
}

// MayHeartbeatAs reports whether the caller may heartbeat as workerID:
// only that worker's own credential may.
func (c *Caller) MayHeartbeatAs(workerID string) bool {
	return c != nil && c.WorkerID != "" && c.WorkerID == workerID
}

// MayReadAssignmentsOf reports whether the caller may read workerID's
// assignments: the worker itself, or a workers:read caller.
func (c *Caller) MayReadAssignmentsOf(workerID string) bool {
	return c.MayHeartbeatAs(workerID) || c.Has(ScopeWorkersRead)
}
