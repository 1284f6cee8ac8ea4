package domain_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

func validOpsAction() domain.OpsAction {
	return domain.OpsAction{At: time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC), Actor: "ada", ActorKind: domain.OpsActorCaller,
		Action: domain.OpsDLQRedrive, Outcome: domain.OpsRefused, Code: "not_redrivable", Detail: "no",
		Params: &domain.OpsParams{Target: "health", Filter: "from_offset=8", Count: 1}}
}

// TestOpsActionValidate: every text field refuses the characters the text
// rule refuses (control, line-separator, bidi), and the record refuses
// unknown kinds, actions and outcomes, codes that are not stable codes,
// and counts out of range.
func TestOpsActionValidate(t *testing.T) {
	t.Parallel()
	valid := validOpsAction()
	if ps := valid.Validate(); len(ps) > 0 {
		t.Fatalf("valid record refused: %s", ps)
	}
	type edit struct {
		field string
		code  domain.Code
		set   func(a *domain.OpsAction)
	}
	var edits []edit
	for _, bad := range []string{"a\u0000b", "a\nb", "a\u001b[2J", "a\u0085", "a\u2028", "a\u202eb", "a\u2066b", "a\xffb"} {
		edits = append(edits,
			edit{"actor", domain.CodeForbiddenCharacter, func(a *domain.OpsAction) { a.Actor = bad }},
			edit{"detail", domain.CodeForbiddenCharacter, func(a *domain.OpsAction) { a.Detail = bad }},
			edit{"params.target", domain.CodeForbiddenCharacter, func(a *domain.OpsAction) { a.Params.Target = bad }},
			edit{"params.to", domain.CodeForbiddenCharacter, func(a *domain.OpsAction) { a.Params.To = bad }},
			edit{"params.filter", domain.CodeForbiddenCharacter, func(a *domain.OpsAction) { a.Params.Filter = bad }},
			edit{"params.added", domain.CodeForbiddenCharacter, func(a *domain.OpsAction) { a.Params.Added = bad }},
			edit{"params.removed", domain.CodeForbiddenCharacter, func(a *domain.OpsAction) { a.Params.Removed = bad }},
			edit{"params.changed", domain.CodeForbiddenCharacter, func(a *domain.OpsAction) { a.Params.Changed = bad }},
			edit{"code", domain.CodeInvalid, func(a *domain.OpsAction) { a.Code = bad }},
		)
	}
	edits = append(edits,
		edit{"at", domain.CodeRequired, func(a *domain.OpsAction) { a.At = time.Time{} }},
		edit{"actor", domain.CodeRequired, func(a *domain.OpsAction) { a.Actor = "" }},
		edit{"actor", domain.CodeTooLong, func(a *domain.OpsAction) { a.Actor = strings.Repeat("é", domain.OpsActorMax+1) }},
		edit{"detail", domain.CodeTooLong, func(a *domain.OpsAction) { a.Detail = strings.Repeat("d", domain.OpsDetailMax+1) }},
		edit{"params.target", domain.CodeTooLong, func(a *domain.OpsAction) { a.Params.Target = strings.Repeat("t", domain.OpsParamMax+1) }},
		edit{"actor_kind", domain.CodeInvalid, func(a *domain.OpsAction) { a.ActorKind = "root" }},
		edit{"actor_kind", domain.CodeRequired, func(a *domain.OpsAction) { a.ActorKind = "" }},
		edit{"action", domain.CodeInvalid, func(a *domain.OpsAction) { a.Action = "reboot" }},
		edit{"outcome", domain.CodeInvalid, func(a *domain.OpsAction) { a.Outcome = "maybe" }},
		edit{"code", domain.CodeInvalid, func(a *domain.OpsAction) { a.Code = "Not Redrivable" }},
		edit{"code", domain.CodeInvalid, func(a *domain.OpsAction) { a.Code = strings.Repeat("c", 65) }},
		edit{"params.count", domain.CodeOutOfRange, func(a *domain.OpsAction) { a.Params.Count = -1 }},
		edit{"params.count", domain.CodeOutOfRange, func(a *domain.OpsAction) { a.Params.Count = 1 << 31 }},
	)
	for _, e := range edits {
		a := validOpsAction()
		e.set(&a)
		ps := a.Validate()
		if len(ps) != 1 || ps[0].Field != e.field || ps[0].Code != e.code {
			t.Errorf("%s: got %s, want one %s problem", e.field, ps, e.code)
		}
	}
	if a := (domain.OpsAction{}); a.AggregateID() != "" || a.EventType() != domain.TypeOpsAction {
		t.Error("identity")
	}
}

// FuzzOpsActionValidate: Validate never panics, and what it accepts
// holds only clean, bounded text.
func FuzzOpsActionValidate(f *testing.F) {
	f.Add("ada", "not_redrivable", "health", "boom")
	f.Add("a\u202eb", "X", "\u0000", "\xff")
	f.Fuzz(func(t *testing.T, actor, code, target, detail string) {
		a := validOpsAction()
		a.Actor, a.Code, a.Params.Target, a.Detail = actor, code, target, detail
		if len(a.Validate()) > 0 {
			return
		}
		for _, s := range []string{a.Actor, a.Code, a.Params.Target, a.Detail} {
			if !domain.IsCleanText(s) || len([]rune(s)) > domain.OpsDetailMax {
				t.Fatalf("accepted %q", s)
			}
		}
		if c := domain.CutOpsText(detail, 10); !domain.IsCleanText(c) || len([]rune(c)) > 10 {
			t.Fatalf("CutOpsText(%q) = %q", detail, c)
		}
	})
}
