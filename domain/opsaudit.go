package domain

import (
	"regexp"
	"time"
)

// The operator audit (issue 25, point 5): one record per operator action
// (a redrive, a rebuild swap, a projector seek, an ACL apply, a credentials
// reseal, a console login or logout, a tokens-file reload), on the ops
// audit topic, keyed by the actor so one actor's actions stay in order. Its
// schema is in schemas/derived; package opsaudit writes it.

// TypeOpsAction is the ce_type of an operator audit record.
const TypeOpsAction = "mailplane.ops.action.v1"

// OpsActorKind says what an audit record's actor is.
type OpsActorKind string

// Actor kinds.
const (
	// OpsActorCaller: a caller's name from the tokens file (the API or the
	// console, authenticated by its token).
	OpsActorCaller OpsActorKind = "caller"
	// OpsActorKafkaPrincipal: a CLI command's Kafka SASL user, the
	// credential it acted with.
	OpsActorKafkaPrincipal OpsActorKind = "kafka_principal"
	// OpsActorOSUser: a CLI command run without a SASL user: the OS user
	// and host ("user@host"), as the operating system said; nothing
	// authenticated it to mailplane.
	OpsActorOSUser OpsActorKind = "os_user"
	// OpsActorClientAddress: an unauthenticated console client (a refused
	// login), by its address.
	OpsActorClientAddress OpsActorKind = "client_address"
	// OpsActorProcess: the process itself (a tokens-file reload it noticed
	// on its own), named by its role and host.
	OpsActorProcess OpsActorKind = "process"
)

// OpsActionName names an operator action.
type OpsActionName string

// Operator actions. Adding one is a compatible change (a new enum value).
const (
	OpsRebuildSwap       OpsActionName = "rebuild_swap"
	OpsRebuildCleanup    OpsActionName = "rebuild_cleanup"
	OpsProjectorSeek     OpsActionName = "projector_seek"
	OpsDLQRedrive        OpsActionName = "dlq_redrive"
	OpsACLApply          OpsActionName = "acls_apply"
	OpsCredentialsReseal OpsActionName = "credentials_reseal"
	OpsConsoleLogin      OpsActionName = "console_login"
	OpsConsoleLogout     OpsActionName = "console_logout"
	OpsTokensReload      OpsActionName = "tokens_reload"
)

// OpsActions lists every operator action, in a fixed order.
func OpsActions() []OpsActionName {
	return []OpsActionName{OpsRebuildSwap, OpsRebuildCleanup, OpsProjectorSeek, OpsDLQRedrive, OpsACLApply,
		OpsCredentialsReseal, OpsConsoleLogin, OpsConsoleLogout, OpsTokensReload}
}

// OpsOutcome is how an operator action ended.
type OpsOutcome string

// Outcomes.
const (
	OpsOK      OpsOutcome = "ok"
	OpsRefused OpsOutcome = "refused" // refused before it changed anything; Code says why
	OpsFailed  OpsOutcome = "failed"  // it started and failed; Code says how
)

// Bounds of the audit record's text.
const (
	OpsActorMax  = 256
	OpsDetailMax = 500
	OpsParamMax  = 500
)

// OpsParams are an action's parameters: what it acted on, bounded, never a
// secret (no token, password or credential: the recorder's callers pass
// names and positions only).
type OpsParams struct {
	// Target is what the action acted on: a projection, a consumer, a
	// topic, a key id.
	Target string `json:"target,omitempty"`
	// To is where it moved something: a projector seek's position, a
	// swap's generation.
	To string `json:"to,omitempty"`
	// Filter is the selection it acted on (a redrive's filters).
	Filter string `json:"filter,omitempty"`
	// Count is how many things it acted on (dead letters redriven,
	// credentials resealed, bindings applied).
	Count int64 `json:"count,omitempty"`
	// DryRun is set when the action only said what it would do.
	DryRun bool `json:"dry_run,omitempty"`
	// Added, Removed and Changed list names (callers of a tokens file,
	// comma-separated), never secrets.
	Added   string `json:"added,omitempty"`
	Removed string `json:"removed,omitempty"`
	Changed string `json:"changed,omitempty"`
}

// OpsAction is an operator audit record: who did what, with which
// parameters, and how it ended, at the server's time.
type OpsAction struct {
	// At is when the action ended, on the clock of the process that did it
	// (never a client's).
	At        time.Time     `json:"at"`
	Actor     string        `json:"actor"`
	ActorKind OpsActorKind  `json:"actor_kind"`
	Action    OpsActionName `json:"action"`
	Outcome   OpsOutcome    `json:"outcome"`
	// Code is the stable error code (domain.Code*, or an exit code's name)
	// of a refused or failed action; absent when it went well.
	Code   string     `json:"code,omitempty"`
	Detail string     `json:"detail,omitempty"`
	Params *OpsParams `json:"params,omitempty"`
}

// EventType is TypeOpsAction.
func (*OpsAction) EventType() string { return TypeOpsAction }

// AggregateID is the actor, the record key: one actor's actions stay in
// one partition, in order.
func (a *OpsAction) AggregateID() string { return a.Actor }

var opsCodePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// Validate checks what an analyst relies on: a time, a clean actor, known
// kinds, a clean bounded detail and parameters.
func (a *OpsAction) Validate() Problems {
	var ps Problems
	if a.At.IsZero() {
		ps.Add("at", CodeRequired, "is required")
	}
	checkText(&ps, "actor", a.Actor, true, OpsActorMax)
	checkEnum(&ps, "actor_kind", a.ActorKind, true, OpsActorCaller, OpsActorKafkaPrincipal, OpsActorOSUser, OpsActorClientAddress, OpsActorProcess)
	checkEnum(&ps, "action", a.Action, true, OpsActions()...)
	checkEnum(&ps, "outcome", a.Outcome, true, OpsOK, OpsRefused, OpsFailed)
	if a.Code != "" && !opsCodePattern.MatchString(a.Code) {
		ps.Add("code", CodeInvalid, "must be a stable code: lower-case letters, digits and _, at most 64")
	}
	checkText(&ps, "detail", a.Detail, false, OpsDetailMax)
	if p := a.Params; p != nil {
		for _, f := range []struct{ name, v string }{
			{"target", p.Target}, {"to", p.To}, {"filter", p.Filter}, {"added", p.Added}, {"removed", p.Removed}, {"changed", p.Changed},
		} {
			checkText(&ps, "params."+f.name, f.v, false, OpsParamMax)
		}
		checkRange(&ps, "params.count", p.Count, 0, 1<<31-1)
	}
	return ps
}

// CutOpsText cuts s to at most max characters (on a character boundary)
// and replaces the characters the text rule refuses, so a parameter or
// detail built from an error message or a file always passes Validate.
func CutOpsText(s string, max int) string {
	s = CleanText(s)
	n := 0
	for i := range s {
		if n == max {
			return s[:i]
		}
		n++
	}
	return s
}
