package workerapi

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
)

// CodeExpired is the stable code of a 410 from the assignments route: the
// change token is older than the changes still retained (or ahead of the
// projection), so the worker must drop what it holds and fetch the full
// list (no since parameter). It is not in package domain because only this
// route has it.
const CodeExpired domain.Code = "expired"

// ErrTokenExpired is returned by an AssignmentStore when changes since a
// token can no longer be told (see CodeExpired).
var ErrTokenExpired = errors.New("workerapi: change token expired; full resync needed")

// Token is a position in the placement decision log: the next decision
// offset the holder has not seen. It is opaque to workers: on the wire it
// is base64url (no padding) of a version byte (1) and the offset as eight
// big-endian bytes. The zero Token means "no token" (ask for everything).
// Replaying the decision log reproduces the same offsets, so tokens stay
// valid across a rebuild of the projection.
type Token struct {
	offset int64
	set    bool
}

const (
	tokenVersion = 1
	tokenLen     = 1 + 8
	// maxTokenText bounds what is decoded from a query parameter.
	maxTokenText = 64
)

var tokenEncoding = base64.RawURLEncoding.Strict()

// TokenAt returns the token for a decision-log offset (the next offset not
// yet reflected). Negative offsets give the zero Token.
func TokenAt(offset int64) Token {
	if offset < 0 {
		return Token{}
	}
	return Token{offset: offset, set: true}
}

// IsZero reports whether t is "no token".
func (t Token) IsZero() bool { return !t.set }

// Offset returns the decision-log offset t stands for (0 for no token).
func (t Token) Offset() int64 { return t.offset }

// String returns the wire form ("" for no token).
func (t Token) String() string {
	if !t.set {
		return ""
	}
	var b [tokenLen]byte
	b[0] = tokenVersion
	binary.BigEndian.PutUint64(b[1:], uint64(t.offset))
	return tokenEncoding.EncodeToString(b[:])
}

// MarshalText implements encoding.TextMarshaler.
func (t Token) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// ParseToken parses a token's wire form. The empty string is no token.
// Anything else that is not a token this server issued (wrong length,
// alphabet, padding, version, or a negative offset) is an error with code
// invalid.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return Token{}, nil
	}
	if len(s) > maxTokenText {
		return Token{}, domain.Errorf(domain.CodeInvalid, "since is not a change token")
	}
	b, err := tokenEncoding.DecodeString(s)
	if err != nil || len(b) != tokenLen {
		return Token{}, domain.Errorf(domain.CodeInvalid, "since is not a change token")
	}
	if b[0] != tokenVersion {
		return Token{}, domain.Errorf(domain.CodeInvalid, "since is a change token of an unsupported version")
	}
	off := binary.BigEndian.Uint64(b[1:])
	if off > 1<<63-1 {
		return Token{}, domain.Errorf(domain.CodeInvalid, "since is not a change token")
	}
	return TokenAt(int64(off)), nil
}

// Assignment is one mailbox placed on a worker.
type Assignment struct {
	MailboxID string          `json:"mailbox_id"`
	OrgID     string          `json:"org_id"`
	Band      domain.RiskPool `json:"band"`
	// WeightMilli is the mailbox's weight in thousandths (1000 = 1.0).
	WeightMilli int64     `json:"weight_milli"`
	AssignedAt  time.Time `json:"assigned_at"`
}

// Result is what an AssignmentStore returns for one worker.
type Result struct {
	// Full is set when Mailboxes is the complete list (no token given).
	Full      bool
	Mailboxes []Assignment
	// Added lists mailboxes placed on the worker since the token, with
	// their current details, and mailboxes whose details changed (a
	// mailbox moved away and back is listed here). Workers upsert them.
	Added []Assignment
	// Removed lists mailbox ids no longer on the worker that were on it at
	// the token's position.
	Removed []string
	// Token is the position the result reflects; pass it as since next.
	Token Token
}

// AssignmentStore reads the placement projection.
type AssignmentStore interface {
	// Assignments returns the worker's mailboxes: all of them when since is
	// zero, else what changed after since. An unknown worker has none,
	// and so has one the engine forgot (dead beyond its retention: its row
	// is gone, it held nothing): 200 with an empty list, not 404, so a
	// worker polling before its first heartbeat is projected and one
	// coming back after a long outage both simply start empty. It
	// returns ErrTokenExpired when the changes since the token are no
	// longer retained.
	Assignments(ctx context.Context, workerID string, since Token) (Result, error)
}

// FullResponse is the 200 body of GET /v1/workers/{id}/assignments
// without since.
type FullResponse struct {
	WorkerID  string       `json:"worker_id"`
	Full      bool         `json:"full"` // true
	Mailboxes []Assignment `json:"mailboxes"`
	Token     string       `json:"token"`
}

// Removed names a mailbox no longer on the worker.
type Removed struct {
	MailboxID string `json:"mailbox_id"`
}

// ChangesResponse is the 200 body of GET /v1/workers/{id}/assignments
// with since.
type ChangesResponse struct {
	WorkerID string       `json:"worker_id"`
	Full     bool         `json:"full"` // false
	Added    []Assignment `json:"added"`
	Removed  []Removed    `json:"removed"`
	Token    string       `json:"token"`
}

// assignments is GET /v1/workers/{id}/assignments.
func (h *handlers) assignments(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !domain.IsUUID(id) {
		api.WriteProblems(w, http.StatusBadRequest, "invalid worker id", domain.Problems{{Field: "id", Code: domain.CodeInvalid,
			Message: "the worker id in the path must be a lower-case UUID"}})
		return
	}
	if !api.CallerFrom(r.Context()).MayReadAssignmentsOf(id) {
		api.WriteForbidden(w, "reading another worker's assignments needs the scope "+domain.ScopeWorkersRead)
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		api.WriteProblems(w, http.StatusBadRequest, "invalid query",
			domain.Problems{{Code: domain.CodeInvalid, Message: "the query string is malformed"}})
		return
	}
	var ps domain.Problems
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if k != "since" {
			ps.Add(k, domain.CodeUnknownField, "unknown query parameter; only since is accepted")
		}
	}
	var since Token
	if vs := q["since"]; len(vs) > 1 {
		ps.Add("since", domain.CodeInvalid, "since must be given at most once")
	} else if len(vs) == 1 {
		tok, err := ParseToken(vs[0])
		if err != nil {
			var de *domain.Error
			_ = errors.As(err, &de)
			ps.Add("since", domain.ErrorCode(err), "%s", de.Message)
		}
		since = tok
	}
	if len(ps) > 0 {
		api.WriteProblems(w, http.StatusBadRequest, "invalid query", ps)
		return
	}

	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.queryTimeout)
	defer cancel()
	res, err := h.cfg.store.Assignments(ctx, id, since)
	switch {
	case errors.Is(err, ErrTokenExpired):
		api.WriteError(w, http.StatusGone, CodeExpired,
			"the change token has expired; drop the assignments held and fetch the full list (without since)")
		return
	case err != nil:
		if domain.ErrorCode(err) != domain.CodeInternal {
			api.WriteDomainError(w, err)
			return
		}
		h.log.Warn("workerapi: reading assignments failed", "worker_id", id, "err", err)
		w.Header().Set("Retry-After", "1")
		api.WriteError(w, http.StatusServiceUnavailable, domain.CodeUnavailable,
			"assignments are unavailable right now; retry")
		return
	}
	if since.IsZero() != res.Full {
		h.log.Error("workerapi: assignment store answered the wrong kind of result",
			"worker_id", id, "since", since.String(), "full", res.Full)
		api.WriteError(w, http.StatusInternalServerError, domain.CodeInternal, "internal error")
		return
	}
	if res.Full {
		api.WriteJSON(w, http.StatusOK, FullResponse{
			WorkerID: id, Full: true, Mailboxes: nonNil(res.Mailboxes), Token: res.Token.String(),
		})
		return
	}
	removed := make([]Removed, len(res.Removed))
	for i, m := range res.Removed {
		removed[i] = Removed{MailboxID: m}
	}
	api.WriteJSON(w, http.StatusOK, ChangesResponse{
		WorkerID: id, Full: false, Added: nonNil(res.Added), Removed: removed, Token: res.Token.String(),
	})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// String renders a result for logs and test failures.
func (r Result) String() string {
	if r.Full {
		return fmt.Sprintf("full(%d mailboxes, token %d)", len(r.Mailboxes), r.Token.Offset())
	}
	return fmt.Sprintf("changes(+%d -%d, token %d)", len(r.Added), len(r.Removed), r.Token.Offset())
}
