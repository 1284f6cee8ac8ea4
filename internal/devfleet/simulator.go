package devfleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// WarmupHeader is the default name of the header every warmup message
// carries: "mailbox=<sender mailbox id>; id=<token>".
const WarmupHeader = "X-Mailplane-Warmup"

// Defaults of the simulator's cadence. The placement engine's default
// heartbeat interval is 10 s with a liveness window of 3 × that, so a
// heartbeat every 5 s keeps the workers live with room to spare.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultWarmupInterval    = 2 * time.Second
	DefaultWarmupPerTick     = 3
	DefaultSeed              = 1
)

// junkDeck is the size of a sender's deck of placements; see Simulator.
const junkDeck = 20

// Source is the ce_source of the simulator's events.
const Source = "mailplane/devfleet"

// Option configures a Simulator.
type Option func(*simConfig)

type simConfig struct {
	seed      uint64
	heartbeat time.Duration
	warmup    time.Duration
	perTick   int
	log       *slog.Logger
	now       func() time.Time
	runID     string
	header    string
	key       []byte
	workerAPI string // base URL; "" heartbeats straight to the log
	fleet     []byte
}

// WithSeed seeds the simulator's choices (default DefaultSeed): the same
// seed gives the same sequence of senders, recipients and folders.
func WithSeed(seed uint64) Option { return func(c *simConfig) { c.seed = seed } }

// WithHeartbeatInterval sets how often every simulated worker heartbeats
// (default DefaultHeartbeatInterval).
func WithHeartbeatInterval(d time.Duration) Option { return func(c *simConfig) { c.heartbeat = d } }

// WithWarmupInterval sets how often a round of warmup mail is delivered
// (default DefaultWarmupInterval).
func WithWarmupInterval(d time.Duration) Option { return func(c *simConfig) { c.warmup = d } }

// WithWarmupPerTick sets how many warmup messages a round delivers
// (default DefaultWarmupPerTick).
func WithWarmupPerTick(n int) Option { return func(c *simConfig) { c.perTick = n } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *simConfig) { c.log = l } }

// WithClock sets the clock of event times and message dates (default
// time.Now).
func WithClock(now func() time.Time) Option { return func(c *simConfig) { c.now = now } }

// WithRunID sets the prefix of this run's warmup tokens (default: the start
// time in milliseconds, base 36), 1-64 of [A-Za-z0-9_-]. Tokens are
// "<run id>.<sequence number>", unique across runs as long as run ids are.
func WithRunID(id string) Option { return func(c *simConfig) { c.runID = id } }

// WithWarmupHeader sets the name of the warmup header (default
// WarmupHeader); it must match what the sync runners recognise.
func WithWarmupHeader(name string) Option { return func(c *simConfig) { c.header = name } }

// WithWarmupKey signs the warmup headers with key (what the sync runners
// verify when they hold it too).
func WithWarmupKey(key []byte) Option { return func(c *simConfig) { c.key = key } }

// WithWorkerAPI makes the simulated workers heartbeat as real ones do:
// POST /v1/workers/heartbeat on the API at base (http://host:port), each
// with its own credential derived from the fleet secret
// (access.WorkerToken). Without it, heartbeats are produced straight to
// the log (tests of the simulator alone).
func WithWorkerAPI(base string, fleetSecret []byte) Option {
	return func(c *simConfig) { c.workerAPI, c.fleet = strings.TrimRight(base, "/"), fleetSecret }
}

var (
	runIDRE      = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	headerNameRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
)

// Simulator is the simulated fleet around the sample mailboxes:
//
//   - Setup registers the sample orgs (org.plan_changed) and mailboxes
//     (mailbox.added, provider smtp_imap, warmup enabled, the Server's
//     endpoint with TLS none, credentials sealed by the producer client).
//     Each event has a fixed id (FixedEventID), and only events whose id is
//     not on the log yet are published, so a restart publishes nothing
//     again: re-publishing would be harmless to the projections (they
//     dedupe by id) but the placement engine would take a repeated plan
//     change as a new one. The mailbox.added id covers the IMAP endpoint
//     and the version of the credentials' seal binding
//     (domain.CredentialsAADPrefix), so moving the server to another port,
//     or a data dir sealed under an older binding, registers again.
//   - Heartbeat publishes one worker.heartbeat per simulated worker.
//   - Warmup delivers a round of warmup messages. Senders take turns; each
//     message goes to a random other sample mailbox, into INBOX or Junk
//     according to the sender's JunkRate. Placements are dealt from a
//     shuffled deck of 20 per sender holding round(20 × JunkRate) Junk
//     cards, so every full deck is exactly on profile (the health scorer
//     needs 20 observations) and a healthy sender's share of Junk stays
//     below the first health threshold at any count past 20.
//
// Run does all three on its cadence until its context is done. Choices
// come from math/rand/v2 seeded with the seed: the same seed yields the
// same deliveries.
type Simulator struct {
	cfg  simConfig
	kcfg kafka.Config
	kc   *kgo.Client
	pc   *producer.Client
	srv  *Server
	imap domain.IMAPEndpoint

	mu    sync.Mutex
	rnd   *rand.Rand
	boxes []Mailbox
	decks [][]bool // per sender, remaining placements (true: Junk)
	turn  int      // next sender
	seq   uint64
}

// New returns a simulator that publishes through a producer client on
// kcfg's brokers, sealing credentials with sealer, and delivers mail on
// srv. Close releases its Kafka client.
func New(kcfg kafka.Config, sealer producer.Sealer, srv *Server, opts ...Option) (*Simulator, error) {
	cfg := simConfig{seed: DefaultSeed, heartbeat: DefaultHeartbeatInterval, warmup: DefaultWarmupInterval,
		perTick: DefaultWarmupPerTick, log: slog.Default(), now: time.Now, header: WarmupHeader}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.heartbeat <= 0 || cfg.warmup <= 0 || cfg.perTick <= 0 {
		return nil, errors.New("devfleet: intervals and messages per tick must be positive")
	}
	if cfg.runID == "" {
		cfg.runID = strconv.FormatInt(cfg.now().UnixMilli(), 36)
	}
	if !runIDRE.MatchString(cfg.runID) {
		return nil, fmt.Errorf("devfleet: run id %q: want 1-64 of [A-Za-z0-9_-]", cfg.runID)
	}
	if !headerNameRE.MatchString(cfg.header) {
		return nil, fmt.Errorf("devfleet: warmup header %q is not a header name", cfg.header)
	}
	if sealer == nil || srv == nil {
		return nil, errors.New("devfleet: a sealer and a server are required")
	}
	host, port, err := net.SplitHostPort(srv.Addr())
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, err
	}
	if kcfg.ClientID == "" {
		kcfg.ClientID = "mailplane-devfleet"
	}
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		return nil, err
	}
	boxes := Mailboxes()
	return &Simulator{
		cfg: cfg, kcfg: kcfg, kc: kc, srv: srv,
		pc: producer.New(kc, producer.WithSealer(sealer), producer.WithSchema(eventschema.Default()),
			producer.WithSource(Source), producer.WithClock(cfg.now), producer.WithNamespace(kcfg.Namespace)),
		imap:  domain.IMAPEndpoint{Host: host, Port: p, TLS: domain.TLSNone},
		rnd:   rand.New(rand.NewPCG(cfg.seed, 0x6d61696c706c616e)), // "mailplan"
		boxes: boxes, decks: make([][]bool, len(boxes)),
	}, nil
}

// Close releases the Kafka client. Call it after Run has returned.
func (s *Simulator) Close() { s.kc.Close() }

// Run publishes the setup events (retrying until they are on the log),
// then heartbeats and delivers warmup mail on its cadence until ctx is
// done, when it returns nil. It returns an error only for events the
// producer client refuses, which is a bug.
func (s *Simulator) Run(ctx context.Context) error {
	log := s.cfg.log
	if err := s.Heartbeat(ctx); err != nil && ctx.Err() == nil {
		log.Warn("simulated workers: heartbeat failed", "err", err)
	}
	// One simulator against a stack still starting: no peers to spread
	// out, so no jitter.
	b := backoff.New(backoff.Policy{Floor: 500 * time.Millisecond, Cap: 15 * time.Second}, nil)
	for {
		n, err := s.Setup(ctx)
		if err == nil {
			log.Info("dev fleet registered", "published", n, "orgs", len(Orgs()), "mailboxes", len(s.boxes),
				"workers", len(Workers()), "imap", net.JoinHostPort(s.imap.Host, strconv.Itoa(s.imap.Port)))
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if be := (*producer.BatchError)(nil); errors.As(err, &be) {
			return err
		}
		wait := b.Next()
		log.Warn("dev fleet registration failed; retrying", "err", err, "in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return nil
		}
	}
	hb := time.NewTicker(s.cfg.heartbeat)
	defer hb.Stop()
	warm := time.NewTicker(s.cfg.warmup)
	defer warm.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hb.C:
			if err := s.Heartbeat(ctx); err != nil && ctx.Err() == nil {
				log.Warn("simulated workers: heartbeat failed", "err", err)
			}
		case <-warm.C:
			ds, err := s.Warmup(ctx)
			if err != nil && ctx.Err() == nil {
				log.Warn("warmup delivery failed", "err", err)
			}
			for _, d := range ds {
				log.Debug("warmup delivered", "from", d.From, "to", d.To, "folder", d.Folder, "token", d.Token)
			}
		}
	}
}

// SetupEvents returns the events Setup publishes, orgs first, with their
// fixed ids and plain-text credentials (the producer client seals them).
func (s *Simulator) SetupEvents() []domain.Event {
	now := s.cfg.now().UTC()
	var out []domain.Event
	for _, o := range Orgs() {
		d := &domain.OrgPlanChanged{OrgID: o.ID, Plan: o.Plan, Paid: o.Plan != domain.PlanFree, Source: "devfleet"}
		out = append(out, domain.Event{ID: FixedEventID("org.plan_changed/" + o.ID + "/" + string(o.Plan)),
			Type: d.EventType(), Source: Source, Time: now, Subject: o.ID, Data: d})
	}
	ep := net.JoinHostPort(s.imap.Host, strconv.Itoa(s.imap.Port))
	for _, m := range s.boxes {
		imapEP := s.imap
		imapEP.Username = m.Address
		d := &domain.MailboxAdded{MailboxID: m.ID, OrgID: m.OrgID, UserID: m.UserID, Address: m.Address,
			Provider: domain.ProviderSMTPIMAP, WarmupEnabled: true, IMAP: imapEP,
			Credentials: &domain.Credentials{Password: DevPassword}}
		// The seal binding's version is in the id: a data dir from before
		// the endpoint binding holds credentials that no longer open, and
		// gets the mailboxes registered again, sealed the new way.
		out = append(out, domain.Event{ID: FixedEventID("mailbox.added/" + m.ID + "/" + ep + "/tls=none/" + domain.CredentialsAADPrefix),
			Type: d.EventType(), Source: Source, Time: now, Subject: m.ID, Data: d})
	}
	return out
}

// Setup publishes the setup events that are not on the log yet, the orgs
// before the mailboxes, and returns how many it published.
func (s *Simulator) Setup(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	have, err := s.publishedIDs(ctx, s.kcfg.Topic(topics.OrgEvents), s.kcfg.Topic(topics.MailboxEvents))
	if err != nil {
		return 0, err
	}
	var orgs, boxes []domain.Event
	for _, e := range s.SetupEvents() {
		if have[e.ID] {
			continue
		}
		if e.Type == domain.TypeOrgPlanChanged {
			orgs = append(orgs, e)
		} else {
			boxes = append(boxes, e)
		}
	}
	n := 0
	for _, batch := range [][]domain.Event{orgs, boxes} {
		if len(batch) == 0 {
			continue
		}
		if _, err := s.pc.Publish(ctx, batch...); err != nil {
			return n, err
		}
		n += len(batch)
	}
	return n, nil
}

// publishedIDs returns the ce_id of every record on the named topics, read
// from their start to their end at the time of the call.
func (s *Simulator) publishedIDs(ctx context.Context, names ...string) (map[string]bool, error) {
	ids := map[string]bool{}
	spec := kafka.ReadSpec{Topics: names, HighWatermark: true, ClientID: "scan"}
	if _, err := kafka.ReadToEnd(ctx, s.kcfg, spec, func(r *kgo.Record) error {
		if id, ok := topics.Header(r, topics.HeaderID); ok {
			ids[id] = true
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading %v: %w", names, err)
	}
	return ids, nil
}

// Heartbeat publishes one worker.heartbeat for every simulated worker:
// through the worker API with each worker's credential (WithWorkerAPI),
// else straight to the log.
func (s *Simulator) Heartbeat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if s.cfg.workerAPI != "" {
		var errs []error
		for _, w := range Workers() {
			hb := &domain.WorkerHeartbeat{WorkerID: w.ID, Tier: w.Tier, Egress: w.Egress, Address: w.Address}
			if err := s.heartbeatHTTP(ctx, hb); err != nil {
				errs = append(errs, fmt.Errorf("worker %s: %w", w.ID, err))
			}
		}
		return errors.Join(errs...)
	}
	var evs []domain.Event
	for _, w := range Workers() {
		evs = append(evs, s.pc.NewEvent(&domain.WorkerHeartbeat{WorkerID: w.ID, Tier: w.Tier, Egress: w.Egress, Address: w.Address}))
	}
	_, err := s.pc.Publish(ctx, evs...)
	return err
}

// Delivery is one warmup message delivered.
type Delivery struct {
	SenderID string // the sender's mailbox id, as in the warmup header
	From     string // sender address
	To       string // recipient address
	Folder   string // FolderInbox or FolderJunk
	Token    string // the header's id
}

// Warmup delivers one round of warmup messages and returns them. It stops
// at the first failed delivery.
func (s *Simulator) Warmup(ctx context.Context) ([]Delivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Delivery, 0, s.cfg.perTick)
	for range s.cfg.perTick {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		d, msg := s.nextLocked()
		if err := s.srv.Deliver(d.To, d.Folder, msg); err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

var warmupSubjects = []string{
	"Quick question about Thursday",
	"Following up on our call",
	"Notes from today's meeting",
	"Can we move our sync?",
	"Draft for your review",
	"Thanks for the introduction",
	"Re: project timeline",
	"Coffee next week?",
}

// nextLocked decides the next warmup message and builds it.
func (s *Simulator) nextLocked() (Delivery, []byte) {
	from := s.boxes[s.turn]
	si := s.turn
	s.turn = (s.turn + 1) % len(s.boxes)
	ri := s.rnd.IntN(len(s.boxes) - 1)
	if ri >= si {
		ri++
	}
	to := s.boxes[ri]
	if len(s.decks[si]) == 0 {
		s.decks[si] = deck(from.JunkRate, s.rnd)
	}
	junk := s.decks[si][0]
	s.decks[si] = s.decks[si][1:]
	folder := FolderInbox
	if junk {
		folder = FolderJunk
	}
	s.seq++
	token := s.cfg.runID + "." + strconv.FormatUint(s.seq, 10)
	subject := warmupSubjects[s.rnd.IntN(len(warmupSubjects))]
	msg := message(fmt.Sprintf("%s <%s>", from.Name, from.Address), fmt.Sprintf("%s <%s>", to.Name, to.Address),
		subject, "<"+token+"@devfleet.mailplane.invalid>", s.cfg.now(),
		s.cfg.header+": "+domain.FormatWarmupHeader(from.ID, token, s.cfg.key)+"\r\n",
		"Hi "+to.Name+",\r\n\r\nThis is warmup mail from the mailplane dev fleet.\r\n")
	return Delivery{SenderID: from.ID, From: from.Address, To: to.Address, Folder: folder, Token: token}, msg
}

// deck returns a shuffled deck of junkDeck placements, round(junkDeck ×
// rate) of them Junk.
func deck(rate float64, rnd *rand.Rand) []bool {
	d := make([]bool, junkDeck)
	n := int(math.Round(rate * junkDeck))
	for i := 0; i < n && i < junkDeck; i++ {
		d[i] = true
	}
	rnd.Shuffle(len(d), func(i, j int) { d[i], d[j] = d[j], d[i] })
	return d
}

// heartbeatHTTP posts one heartbeat to the worker API under the worker's
// own credential.
func (s *Simulator) heartbeatHTTP(ctx context.Context, hb *domain.WorkerHeartbeat) error {
	body, err := json.Marshal(hb)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.workerAPI+"/v1/workers/heartbeat", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+access.WorkerToken(s.cfg.fleet, hb.WorkerID))
	resp, err := heartbeatClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("worker API answered %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	return nil
}

// heartbeatClient bounds each heartbeat request.
var heartbeatClient = &http.Client{Timeout: 10 * time.Second}
