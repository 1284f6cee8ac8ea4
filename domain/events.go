package domain

import (
	"encoding/json"
	"math"
	"strconv"
	"time"
)

// Event types, as carried in ce_type. The version suffix is part of the
// contract: a breaking change to a type's data is a new type.
const (
	TypeMailboxAdded        = "mailplane.mailbox.added.v1"
	TypeMailboxRemoved      = "mailplane.mailbox.removed.v1"
	TypeMailboxHealthScored = "mailplane.mailbox.health_scored.v1"
	TypeMailboxDisabled     = "mailplane.mailbox.disabled.v1"
	// TypeCredentialsRotated is internal: only mailplane writes it (a
	// re-seal under the active key, a provider's rotated refresh token).
	TypeCredentialsRotated  = "mailplane.mailbox.credentials_rotated.v1"
	TypeWarmupObserved      = "mailplane.mailbox.warmup_observed.v1"
	TypeOrgPlanChanged      = "mailplane.org.plan_changed.v1"
	TypeUserActive          = "mailplane.user.active.v1"
	TypeWorkerHeartbeat     = "mailplane.worker.heartbeat.v1"
	TypeWorkerHealthSampled = "mailplane.worker.health_sampled.v1"
)

// Aggregate names the entity an event belongs to; each has its own topic.
type Aggregate string

// Aggregates.
const (
	AggregateMailbox Aggregate = "mailbox"
	AggregateOrg     Aggregate = "org"
	AggregateUser    Aggregate = "user"
	AggregateWorker  Aggregate = "worker"
)

// Data is the payload of a domain event.
type Data interface {
	// EventType is the ce_type of events carrying this data.
	EventType() string
	// AggregateID is the event's subject and record key.
	AggregateID() string
	// Validate returns every problem with the data, field paths relative to
	// the data object.
	Validate() Problems
}

type typeInfo struct {
	aggregate Aggregate
	new       func() Data
}

var registry = map[string]typeInfo{
	TypeMailboxAdded:        {AggregateMailbox, func() Data { return new(MailboxAdded) }},
	TypeMailboxRemoved:      {AggregateMailbox, func() Data { return new(MailboxRemoved) }},
	TypeMailboxHealthScored: {AggregateMailbox, func() Data { return new(MailboxHealthScored) }},
	TypeMailboxDisabled:     {AggregateMailbox, func() Data { return new(MailboxDisabled) }},
	TypeCredentialsRotated:  {AggregateMailbox, func() Data { return new(CredentialsRotated) }},
	TypeWarmupObserved:      {AggregateMailbox, func() Data { return new(WarmupObserved) }},
	TypeOrgPlanChanged:      {AggregateOrg, func() Data { return new(OrgPlanChanged) }},
	// Ownership transfers (ownership.go).
	TypeMailboxOwnerTransferred: {AggregateMailbox, func() Data { return new(MailboxOwnerTransferred) }},
	TypeOrgOwnerTransferred:     {AggregateOrg, func() Data { return new(OrgOwnerTransferred) }},
	TypeUserActive:              {AggregateUser, func() Data { return new(UserActive) }},
	TypeWorkerHeartbeat:         {AggregateWorker, func() Data { return new(WorkerHeartbeat) }},
	TypeWorkerHealthSampled:     {AggregateWorker, func() Data { return new(WorkerHealthSampled) }},
}

// EventTypes returns every domain event type, sorted.
func EventTypes() []string {
	return []string{
		TypeMailboxAdded, TypeCredentialsRotated, TypeMailboxDisabled, TypeMailboxHealthScored, TypeMailboxOwnerTransferred,
		TypeMailboxRemoved, TypeWarmupObserved, TypeOrgOwnerTransferred, TypeOrgPlanChanged, TypeUserActive,
		TypeWorkerHealthSampled, TypeWorkerHeartbeat,
	}
}

// NewData returns an empty Data value for an event type.
func NewData(eventType string) (Data, bool) {
	ti, ok := registry[eventType]
	if !ok {
		return nil, false
	}
	return ti.new(), true
}

// AggregateOf returns the aggregate an event type belongs to.
func AggregateOf(eventType string) (Aggregate, bool) {
	ti, ok := registry[eventType]
	return ti.aggregate, ok
}

// ShortType strips the "mailplane." prefix and version: "mailbox.added".
func ShortType(eventType string) string {
	s := eventType
	if len(s) > len("mailplane.") && s[:len("mailplane.")] == "mailplane." {
		s = s[len("mailplane."):]
	}
	for i := len(s) - 1; i > 0; i-- {
		if s[i] == '.' {
			if len(s) > i+1 && s[i+1] == 'v' {
				return s[:i]
			}
			break
		}
	}
	return s
}

// ResolveType accepts a full type or a short one ("mailbox.added") and
// returns the full type.
func ResolveType(s string) (string, bool) {
	if _, ok := registry[s]; ok {
		return s, true
	}
	for _, t := range EventTypes() {
		if ShortType(t) == s {
			return t, true
		}
	}
	return "", false
}

// Provider is a mailbox's mail provider.
type Provider string

// Providers.
const (
	ProviderSMTPIMAP Provider = "smtp_imap"
	ProviderGmail    Provider = "gmail"
	ProviderOutlook  Provider = "outlook"
)

// IsOAuth reports whether the provider is reached through an OAuth API.
func (p Provider) IsOAuth() bool { return p == ProviderGmail || p == ProviderOutlook }

// TLSMode is how an IMAP connection is secured.
type TLSMode string

// TLS modes. None must be asked for explicitly.
const (
	TLSImplicit TLSMode = "implicit"
	TLSStartTLS TLSMode = "starttls"
	TLSNone     TLSMode = "none"
)

// IMAPEndpoint is where and as whom a mailbox is synced.
type IMAPEndpoint struct {
	Host     string  `json:"host"`
	Port     int     `json:"port"`
	TLS      TLSMode `json:"tls"`
	Username string  `json:"username"`
}

// Validate checks the endpoint.
func (e IMAPEndpoint) Validate() Problems {
	var ps Problems
	if checkText(&ps, "host", e.Host, true, 253) && !isHost(e.Host) {
		ps.Add("host", CodeInvalid, "must be a host name or IP address")
	}
	checkRange(&ps, "port", int64(e.Port), 1, 65535)
	checkEnum(&ps, "tls", e.TLS, true, TLSImplicit, TLSStartTLS, TLSNone)
	checkText(&ps, "username", e.Username, true, 320)
	return ps
}

// Credentials are a mailbox's secrets in plain text. They exist only between
// a producer and the sealing step, and in a sync runner's memory: a record on
// the log carrying them is rejected.
type Credentials struct {
	Password          string `json:"password,omitempty"`
	OAuthRefreshToken string `json:"oauth_refresh_token,omitempty"`
}

// SealedSecret is an AES-GCM sealed secret; KeyID names the key that sealed it.
type SealedSecret struct {
	KeyID      string `json:"key_id"`
	Alg        string `json:"alg"`
	Nonce      string `json:"nonce"`
	Ciphertext string `json:"ciphertext"`
}

// SealAlg is the only sealing algorithm.
const SealAlg = "A256GCM"

// Validate checks the sealed form's shape (not that it opens).
func (s SealedSecret) Validate() Problems {
	var ps Problems
	if s.KeyID == "" {
		ps.Add("key_id", CodeRequired, "is required")
	} else if !isKeyID(s.KeyID) {
		ps.Add("key_id", CodeInvalid, "must be 1-64 of [A-Za-z0-9._-]")
	}
	checkEnum(&ps, "alg", s.Alg, true, SealAlg)
	if checkText(&ps, "nonce", s.Nonce, true, 64) && !isBase64(s.Nonce) {
		ps.Add("nonce", CodeInvalid, "must be standard base64")
	}
	if checkText(&ps, "ciphertext", s.Ciphertext, true, 8192) && !isBase64(s.Ciphertext) {
		ps.Add("ciphertext", CodeInvalid, "must be standard base64")
	}
	return ps
}

// CredentialsAADPrefix starts the additional data of sealed credentials.
// v1 bound the mailbox id only, so a copied blob opened for any endpoint:
// v1 blobs do not open under v2.
const CredentialsAADPrefix = "mailplane.mailbox.credentials.v2"

// CredentialsAAD binds sealed credentials to their mailbox and to where
// they may be presented: provider, IMAP host, port, TLS mode and username.
// A sealed blob copied onto another mailbox or another endpoint does not
// open. Each field is length-prefixed, so no two field lists share bytes.
func CredentialsAAD(mailboxID string, provider Provider, ep IMAPEndpoint) []byte {
	b := make([]byte, 0, len(CredentialsAADPrefix)+len(mailboxID)+len(provider)+len(ep.Host)+len(ep.TLS)+len(ep.Username)+40)
	b = append(b, CredentialsAADPrefix...)
	for _, f := range []string{mailboxID, string(provider), ep.Host, strconv.Itoa(ep.Port), string(ep.TLS), ep.Username} {
		b = append(b, ';')
		b = strconv.AppendInt(b, int64(len(f)), 10)
		b = append(b, ':')
		b = append(b, f...)
	}
	return b
}

// AAD returns the additional data binding this mailbox's credentials.
func (m *MailboxAdded) AAD() []byte { return CredentialsAAD(m.MailboxID, m.Provider, m.IMAP) }

// MailboxAdded registers a mailbox.
type MailboxAdded struct {
	MailboxID     string       `json:"mailbox_id"`
	OrgID         string       `json:"org_id"`
	UserID        string       `json:"user_id"`
	Address       string       `json:"address"`
	Provider      Provider     `json:"provider"`
	WarmupEnabled bool         `json:"warmup_enabled"`
	IMAP          IMAPEndpoint `json:"imap"`
	// Credentials is accepted from producers only, and replaced by
	// SealedCredentials before the event is produced.
	Credentials       *Credentials  `json:"credentials,omitempty"`
	SealedCredentials *SealedSecret `json:"sealed_credentials,omitempty"`
}

func (*MailboxAdded) EventType() string     { return TypeMailboxAdded }
func (m *MailboxAdded) AggregateID() string { return m.MailboxID }

// Validate checks the log form: sealed credentials, never plain ones.
func (m *MailboxAdded) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "mailbox_id", m.MailboxID)
	checkUUID(&ps, "org_id", m.OrgID)
	checkUUID(&ps, "user_id", m.UserID)
	if checkText(&ps, "address", m.Address, true, 254) && !isAddress(m.Address) {
		ps.Add("address", CodeInvalid, "must be an email address")
	}
	checkEnum(&ps, "provider", m.Provider, true, ProviderSMTPIMAP, ProviderGmail, ProviderOutlook)
	ps = append(ps, m.IMAP.Validate().Prefixed("imap")...)
	if m.Credentials != nil {
		ps.Add("credentials", CodePlaintextSecret, "plain-text credentials must be sealed before they reach the log")
	}
	if m.SealedCredentials == nil {
		if m.Credentials == nil {
			ps.Add("sealed_credentials", CodeRequired, "is required")
		}
	} else {
		ps = append(ps, m.SealedCredentials.Validate().Prefixed("sealed_credentials")...)
	}
	return ps
}

// SealWith replaces plain-text credentials with their sealed form. seal gets
// the credentials' JSON and the additional data binding it to the mailbox
// and its endpoint (AAD).
func (m *MailboxAdded) SealWith(seal func(plain, aad []byte) (SealedSecret, error)) error {
	if m.Credentials == nil {
		return nil
	}
	plain, err := json.Marshal(m.Credentials)
	if err != nil {
		return err
	}
	s, err := seal(plain, m.AAD())
	clear(plain)
	if err != nil {
		return err
	}
	m.Credentials = nil
	m.SealedCredentials = &s
	return nil
}

// Validate checks plain credentials supplied by a producer.
func (c Credentials) Validate() Problems {
	var ps Problems
	if c.Password == "" && c.OAuthRefreshToken == "" {
		ps.Add("", CodeRequired, "needs password or oauth_refresh_token")
	}
	checkText(&ps, "password", c.Password, false, 1024)
	checkText(&ps, "oauth_refresh_token", c.OAuthRefreshToken, false, 4096)
	return ps
}

// MailboxRemoved unregisters a mailbox.
type MailboxRemoved struct {
	MailboxID string `json:"mailbox_id"`
	Reason    string `json:"reason"`
}

func (*MailboxRemoved) EventType() string     { return TypeMailboxRemoved }
func (m *MailboxRemoved) AggregateID() string { return m.MailboxID }

// Validate checks the event.
func (m *MailboxRemoved) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "mailbox_id", m.MailboxID)
	checkText(&ps, "reason", m.Reason, true, 500)
	return ps
}

// DisableCause says why a mailbox was disabled.
type DisableCause string

// Disable causes.
const (
	// DisableAuthFailing: the IMAP server refused the mailbox's credentials
	// for longer than the configured period.
	DisableAuthFailing DisableCause = "auth_failing"
	// DisableOperator: an operator disabled it.
	DisableOperator DisableCause = "operator"
)

// MailboxDisabled stops a mailbox's sync until it is added again (a new
// mailbox.added, e.g. with new credentials, enables it). Placement is not
// affected.
type MailboxDisabled struct {
	MailboxID string       `json:"mailbox_id"`
	Cause     DisableCause `json:"cause"`
	// Reason is for humans: the server's last refusal, never a secret.
	Reason string `json:"reason"`
	// FailingSince is when authentication started failing (auth_failing).
	FailingSince *time.Time `json:"failing_since,omitempty"`
}

func (*MailboxDisabled) EventType() string     { return TypeMailboxDisabled }
func (m *MailboxDisabled) AggregateID() string { return m.MailboxID }

// Validate checks the event.
func (m *MailboxDisabled) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "mailbox_id", m.MailboxID)
	checkEnum(&ps, "cause", m.Cause, true, DisableAuthFailing, DisableOperator)
	checkText(&ps, "reason", m.Reason, true, 500)
	return ps
}

// RotationCause says why a mailbox's credentials were sealed anew.
type RotationCause string

// Rotation causes.
const (
	// RotationReseal: an operator re-sealed every live mailbox's
	// credentials under the active key (`mailplane credentials reseal`),
	// so an old key can be retired.
	RotationReseal RotationCause = "reseal"
	// RotationOAuth: the OAuth provider returned a new refresh token
	// (Microsoft rotates them on use); the old one stops working.
	RotationOAuth RotationCause = "oauth_rotation"
)

// CredentialsRotated replaces a live mailbox's sealed credentials, bound
// to the same mailbox and endpoint as those of its mailbox.added (see
// CredentialsAAD). It is internal: mailplane writes it, producers cannot.
// A mailbox.added later replaces it as a whole; for a mailbox that is not
// registered it changes nothing.
type CredentialsRotated struct {
	MailboxID         string        `json:"mailbox_id"`
	SealedCredentials *SealedSecret `json:"sealed_credentials"`
	Cause             RotationCause `json:"cause"`
	// AddedAt is the added_at of the mailbox.state record whose credentials
	// these replace: a rotation computed before a later mailbox.added (new
	// endpoint, new credentials) does not overwrite that add's.
	AddedAt time.Time `json:"added_at"`
}

func (*CredentialsRotated) EventType() string     { return TypeCredentialsRotated }
func (c *CredentialsRotated) AggregateID() string { return c.MailboxID }

// Validate checks the event.
func (c *CredentialsRotated) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "mailbox_id", c.MailboxID)
	if c.SealedCredentials == nil {
		ps.Add("sealed_credentials", CodeRequired, "is required")
	} else {
		ps = append(ps, c.SealedCredentials.Validate().Prefixed("sealed_credentials")...)
	}
	checkEnum(&ps, "cause", c.Cause, true, RotationReseal, RotationOAuth)
	if c.AddedAt.IsZero() {
		ps.Add("added_at", CodeRequired, "is required")
	}
	return ps
}

// WarmupPlacement is where a warmup message landed at its recipient.
type WarmupPlacement string

// Warmup placements.
const (
	PlacedInbox WarmupPlacement = "inbox"
	PlacedJunk  WarmupPlacement = "junk"
)

// ObservationSource is who observed a warmup placement.
type ObservationSource string

// Observation sources.
const (
	// ObservedBySync: a sync runner found the message in a recipient
	// mailbox's INBOX or Junk folder.
	ObservedBySync ObservationSource = "imap_sync"
	// ObservedByReport: a producer reported it (a delivery or seed-list
	// report).
	ObservedByReport ObservationSource = "delivery_report"
)

// MaxWarmupIDLen bounds a warmup message's id.
const MaxWarmupIDLen = 128

// WarmupObserved records where one warmup message sent by a mailbox landed.
// Its aggregate is the sending mailbox, whose health it is evidence of; it
// travels on its own topic (topics.MailboxObservations), not with the
// mailbox's lifecycle events.
type WarmupObserved struct {
	// MailboxID is the sender of the warmup message.
	MailboxID string `json:"mailbox_id"`
	// WarmupID identifies the message (from its warmup header): 1-128 of
	// [A-Za-z0-9._-]. One message is counted once.
	WarmupID  string          `json:"warmup_id"`
	Placement WarmupPlacement `json:"placement"`
	// LandedAt is when the message arrived (the recipient's INTERNALDATE).
	LandedAt time.Time         `json:"landed_at"`
	Source   ObservationSource `json:"source"`
	// RecipientMailboxID is the mailbox it was found in, when known.
	RecipientMailboxID string `json:"recipient_mailbox_id,omitempty"`
}

func (*WarmupObserved) EventType() string     { return TypeWarmupObserved }
func (w *WarmupObserved) AggregateID() string { return w.MailboxID }

// Validate checks the event.
func (w *WarmupObserved) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "mailbox_id", w.MailboxID)
	if checkText(&ps, "warmup_id", w.WarmupID, true, MaxWarmupIDLen) && !isToken(w.WarmupID, MaxWarmupIDLen) {
		ps.Add("warmup_id", CodeInvalid, "must be 1-128 of [A-Za-z0-9._-]")
	}
	checkEnum(&ps, "placement", w.Placement, true, PlacedInbox, PlacedJunk)
	if w.LandedAt.IsZero() {
		ps.Add("landed_at", CodeRequired, "is required")
	}
	checkEnum(&ps, "source", w.Source, true, ObservedBySync, ObservedByReport)
	if w.RecipientMailboxID != "" {
		checkUUID(&ps, "recipient_mailbox_id", w.RecipientMailboxID)
	}
	return ps
}

// HealthState is a mailbox's or worker's sending health.
type HealthState string

// Health states, from best to worst.
const (
	HealthHealthy     HealthState = "healthy"
	HealthWatch       HealthState = "watch"
	HealthThrottled   HealthState = "throttled"
	HealthQuarantined HealthState = "quarantined"
	HealthBlocked     HealthState = "blocked"
)

// MailboxHealthScored carries a mailbox's new health state.
type MailboxHealthScored struct {
	MailboxID string      `json:"mailbox_id"`
	State     HealthState `json:"state"`
	Score     float64     `json:"score"`
	Reason    string      `json:"reason"`
	Until     *time.Time  `json:"until,omitempty"`
	// Evidence is what the state was decided from (absent in events
	// written before it, and from producers that do not say).
	Evidence *HealthEvidence `json:"evidence,omitempty"`
}

func (*MailboxHealthScored) EventType() string     { return TypeMailboxHealthScored }
func (m *MailboxHealthScored) AggregateID() string { return m.MailboxID }

// Validate checks the event.
func (m *MailboxHealthScored) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "mailbox_id", m.MailboxID)
	checkEnum(&ps, "state", m.State, true, HealthHealthy, HealthWatch, HealthThrottled, HealthQuarantined, HealthBlocked)
	if math.IsNaN(m.Score) || m.Score < 0 || m.Score > 100 {
		ps.Add("score", CodeOutOfRange, "must be between 0 and 100")
	}
	checkText(&ps, "reason", m.Reason, true, 500)
	if m.Evidence != nil {
		ps = append(ps, m.Evidence.Validate().Prefixed("evidence")...)
	}
	return ps
}

// Plan is an org's subscription plan.
type Plan string

// Plans.
const (
	PlanFree      Plan = "free"
	PlanPremium   Plan = "premium"
	PlanDedicated Plan = "dedicated"
)

// MaxDedicatedWorkers bounds one org's dedicated workers.
const MaxDedicatedWorkers = 1000

// OrgPlanChanged records an org's plan.
type OrgPlanChanged struct {
	OrgID            string `json:"org_id"`
	Plan             Plan   `json:"plan"`
	DedicatedWorkers int    `json:"dedicated_workers"`
	Paid             bool   `json:"paid"`
	Source           string `json:"source"`
}

func (*OrgPlanChanged) EventType() string     { return TypeOrgPlanChanged }
func (o *OrgPlanChanged) AggregateID() string { return o.OrgID }

// Validate checks the event.
func (o *OrgPlanChanged) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "org_id", o.OrgID)
	checkEnum(&ps, "plan", o.Plan, true, PlanFree, PlanPremium, PlanDedicated)
	checkRange(&ps, "dedicated_workers", int64(o.DedicatedWorkers), 0, MaxDedicatedWorkers)
	checkText(&ps, "source", o.Source, true, 200)
	return ps
}

// ActivitySource is what showed a user to be active.
type ActivitySource string

// Activity sources.
const (
	ActivityLogin     ActivitySource = "login"
	ActivityWSConnect ActivitySource = "ws_connect"
	ActivityWSPing    ActivitySource = "ws_ping"
)

// UserActive says a user is using the product now.
type UserActive struct {
	UserID string         `json:"user_id"`
	Source ActivitySource `json:"source"`
}

func (*UserActive) EventType() string     { return TypeUserActive }
func (u *UserActive) AggregateID() string { return u.UserID }

// Validate checks the event.
func (u *UserActive) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "user_id", u.UserID)
	checkEnum(&ps, "source", u.Source, true, ActivityLogin, ActivityWSConnect, ActivityWSPing)
	return ps
}

// Tier is a sending worker's capacity class.
type Tier string

// Tiers. Dedicated is assigned by the placement engine only.
const (
	TierSharedFree    Tier = "shared_free"
	TierSharedPremium Tier = "shared_premium"
	TierDedicated     Tier = "dedicated"
)

// ClientRequestableTier reports whether a client may ask for tier. It is the
// single authority for the rule that dedicated is never client-chosen.
func ClientRequestableTier(t Tier) bool {
	return t == TierSharedFree || t == TierSharedPremium
}

// Egress is how a worker sends mail; it sets the worker's base capacity.
type Egress string

// Egress kinds.
const (
	EgressColdSMTP   Egress = "cold_smtp"
	EgressOAuthAPI   Egress = "oauth_api"
	EgressWarmupOnly Egress = "warmup_only"
)

// WorkerHeartbeat says a sending worker is alive.
type WorkerHeartbeat struct {
	WorkerID string `json:"worker_id"`
	Tier     Tier   `json:"tier"`
	Egress   Egress `json:"egress"`
	Address  string `json:"address"`
	Stopping bool   `json:"stopping"`
}

func (*WorkerHeartbeat) EventType() string     { return TypeWorkerHeartbeat }
func (w *WorkerHeartbeat) AggregateID() string { return w.WorkerID }

// Validate checks the event. An empty tier means shared premium, so workers
// that never set one keep registering.
func (w *WorkerHeartbeat) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "worker_id", w.WorkerID)
	switch {
	case w.Tier == "" || ClientRequestableTier(w.Tier):
	case w.Tier == TierDedicated:
		ps.Add("tier", CodeTierNotAllowed, "dedicated capacity is allocated by the control plane, never requested")
	default:
		ps.Add("tier", CodeInvalid, "must be one of [shared_free shared_premium]")
	}
	checkEnum(&ps, "egress", w.Egress, true, EgressColdSMTP, EgressOAuthAPI, EgressWarmupOnly)
	checkText(&ps, "address", w.Address, true, 255)
	return ps
}

// EffectiveTier returns the tier with the blank default applied.
func (w *WorkerHeartbeat) EffectiveTier() Tier {
	if w.Tier == "" {
		return TierSharedPremium
	}
	return w.Tier
}

// WorkerHealthSampled reports a worker's sending outcomes over a window.
type WorkerHealthSampled struct {
	WorkerID      string `json:"worker_id"`
	WindowSeconds int64  `json:"window_seconds"`
	Sends         int64  `json:"sends"`
	HardBounces   int64  `json:"hard_bounces"`
	Complaints    int64  `json:"complaints"`
}

func (*WorkerHealthSampled) EventType() string     { return TypeWorkerHealthSampled }
func (w *WorkerHealthSampled) AggregateID() string { return w.WorkerID }

// MaxCount bounds counters so sums stay exact in float64 and bigint.
const MaxCount = 1 << 40

// Validate checks the event.
func (w *WorkerHealthSampled) Validate() Problems {
	var ps Problems
	checkUUID(&ps, "worker_id", w.WorkerID)
	checkRange(&ps, "window_seconds", w.WindowSeconds, 1, 30*24*3600)
	checkRange(&ps, "sends", w.Sends, 0, MaxCount)
	checkRange(&ps, "hard_bounces", w.HardBounces, 0, MaxCount)
	checkRange(&ps, "complaints", w.Complaints, 0, MaxCount)
	return ps
}
