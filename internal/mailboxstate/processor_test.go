package mailboxstate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/dlq"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/topics"
)

const statePartitions = 12

func broker(t testing.TB) kafka.Config {
	t.Helper()
	emb, err := kafka.StartEmbedded(kafka.WithPort(0), kafka.WithKfakeOptions(kfake.GroupMinSessionTimeout(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	cfg := kafka.Config{Brokers: emb.Addrs(), ClientID: "mailboxstate-test"}
	cl, err := kafka.NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := topics.Apply(ctx, cl, topics.Catalog(topics.Config{StatePartitions: statePartitions})); err != nil {
		t.Fatal(err)
	}
	return cfg
}

var testGroup = kafka.GroupConfig{SessionTimeout: time.Second, HeartbeatInterval: 100 * time.Millisecond}

func start(t testing.TB, kcfg kafka.Config, opts ...mailboxstate.Option) (stop func()) {
	t.Helper()
	p, err := mailboxstate.New(kcfg, append([]mailboxstate.Option{mailboxstate.WithGroup(testGroup)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return 30s after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

type gen struct {
	rng *rand.Rand
	t0  time.Time
	n   int
}

func newGen(seed uint64) *gen {
	return &gen{rng: rand.New(rand.NewPCG(seed, seed*7+1)), t0: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func (g *gen) uuid() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(g.rng.UintN(256))
	}
	u, _ := uuid.FromBytes(b[:])
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u.String()
}

func (g *gen) event(d domain.Data) domain.Event {
	g.n++
	return domain.Event{ID: uuid.Must(uuid.NewV7()).String(), Type: d.EventType(), Source: "mailplane/test",
		Time: g.t0.Add(time.Duration(g.n) * time.Millisecond), Subject: d.AggregateID(), Data: d}
}

func (g *gen) added(id string) domain.Event {
	return g.event(&domain.MailboxAdded{
		MailboxID: id, OrgID: g.uuid(), UserID: g.uuid(),
		Address:  fmt.Sprintf("box%d@example.com", g.rng.IntN(1e6)),
		Provider: domain.ProviderSMTPIMAP,
		IMAP: domain.IMAPEndpoint{Host: fmt.Sprintf("imap%d.example.com", g.rng.IntN(3)), Port: 993,
			TLS: domain.TLSImplicit, Username: "u"},
		SealedCredentials: &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk"},
	})
}

func produce(t testing.TB, kcfg kafka.Config, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func encode(t testing.TB, evs ...domain.Event) []*kgo.Record {
	t.Helper()
	out := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		r, err := topics.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = r
	}
	return out
}

// readCommitted returns every committed data record of topic, reading up
// to the last stable offsets as of the call.
func readCommitted(t testing.TB, kcfg kafka.Config, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ends, err := kadm.NewClient(adm).ListCommittedOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil
	}
	cl, err := kafka.NewClient(kafka.Config{Brokers: kcfg.Brokers}, kafka.KindReader, kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s: %v (left %v)", topic, err, want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
		})
	}
	return out
}

// waitCommitted waits until topic holds n committed data records.
func waitCommitted(t testing.TB, kcfg kafka.Config, topic string, n int) []*kgo.Record {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		recs := readCommitted(t, kcfg, topic)
		if len(recs) >= n {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d committed records, want %d", topic, len(recs), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// murmur2 is Kafka's partitioner hash (the Java client's Utils.murmur2).
func murmur2(b []byte) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		b = b[4:]
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

func kafkaPartition(key []byte, n int32) int32 { return (murmur2(key) & 0x7fffffff) % n }

// TestFold folds adds, removals, re-adds, other mailbox events and a poison
// record, and checks mailbox.state: the last record of each mailbox is its
// state (or a tombstone), every record sits on the murmur2 partition of its
// key, and the poison record is in the DLQ.
func TestFold(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(1)
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = g.uuid()
	}
	var evs []domain.Event
	added := map[string]domain.Event{}
	for _, id := range ids {
		e := g.added(id)
		evs = append(evs, e)
		added[id] = e
	}
	removed := map[string]bool{}
	for _, id := range ids[:10] {
		evs = append(evs, g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "gone"}))
		removed[id] = true
	}
	// Re-added after removal: live again, with the new details.
	for _, id := range ids[:3] {
		e := g.added(id)
		evs = append(evs, e)
		added[id] = e
		delete(removed, id)
	}
	evs = append(evs, g.event(&domain.MailboxHealthScored{MailboxID: ids[20], State: domain.HealthWatch, Score: 50, Reason: "bounces"}))
	recs := encode(t, evs...)
	poison := &kgo.Record{Topic: topics.MailboxEvents, Key: []byte(ids[30]), Value: []byte(`{not json`),
		Headers: recs[0].Headers}
	produce(t, kcfg, append(recs, poison)...)

	start(t, kcfg)
	// One output per add and removal; the health score produces none.
	wantRecords := len(ids) + 10 + 3
	out := waitCommitted(t, kcfg, topics.MailboxState, wantRecords)
	if len(out) != wantRecords {
		t.Fatalf("mailbox.state holds %d records, want %d", len(out), wantRecords)
	}
	last := map[string]*kgo.Record{}
	for _, r := range out {
		if want := kafkaPartition(r.Key, statePartitions); r.Partition != want {
			t.Errorf("key %s on partition %d, murmur2 says %d", r.Key, r.Partition, want)
		}
		last[string(r.Key)] = r
	}
	for _, id := range ids {
		r := last[id]
		m, live, err := mailboxstate.Decode(r)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if live == removed[id] {
			t.Errorf("%s: live=%v, removed=%v", id, live, removed[id])
		}
		if !live {
			continue
		}
		e := added[id]
		d := e.Data.(*domain.MailboxAdded)
		want := mailboxstate.FromAdded(e, d)
		if !m.SameSync(want) || !m.AddedAt.Equal(e.Time) || m.SourceEventID != e.ID || !m.Enabled {
			t.Errorf("%s: state %+v, want %+v", id, m, want)
		}
		if id, _ := topics.Header(r, topics.HeaderID); id != e.ID {
			t.Errorf("ce_id %s, want the source event's %s", id, e.ID)
		}
	}
	dead := waitCommitted(t, kcfg, topics.DLQ, 1)
	if got := dlq.Parse(dead[0]); got.Consumer != mailboxstate.ConsumerName || string(dead[0].Key) != ids[30] {
		t.Errorf("dead letter %+v", got)
	}
}

// TestExactlyOnceAcrossRestarts stops and restarts the processor at random
// points while mailbox events are produced. Every event's output must be in
// mailbox.state exactly once: an interrupted transaction is aborted and its
// batch folded again by the next session.
func TestExactlyOnceAcrossRestarts(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	g := newGen(2)
	ids := make([]string, 200)
	for i := range ids {
		ids[i] = g.uuid()
	}
	n := 3000
	if testing.Short() {
		n = 600
	}
	var evs []domain.Event
	for range n {
		id := ids[g.rng.IntN(len(ids))]
		if g.rng.IntN(4) == 0 {
			evs = append(evs, g.event(&domain.MailboxRemoved{MailboxID: id, Reason: "r"}))
		} else {
			evs = append(evs, g.added(id))
		}
	}
	recs := encode(t, evs...)
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(3, 4))
		for i := 0; i < len(recs); i += 100 {
			produce(t, kcfg, recs[i:min(i+100, len(recs))]...)
			time.Sleep(time.Duration(20+rng.IntN(30)) * time.Millisecond)
		}
	})
	rng := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		// Small transactions, so that a stop likely lands inside one.
		stop := start(t, kcfg, mailboxstate.WithMaxBatch(50))
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		stop()
	}
	wg.Wait()
	start(t, kcfg)
	out := waitCommitted(t, kcfg, topics.MailboxState, n)
	seen := map[string]int{}
	for _, r := range out {
		id, _ := topics.Header(r, topics.HeaderID)
		seen[id]++
	}
	dups := 0
	for _, e := range evs {
		switch seen[e.ID] {
		case 1:
		case 0:
			t.Errorf("event %s has no output", e.ID)
		default:
			dups++
		}
	}
	if dups > 0 || len(out) != n {
		t.Fatalf("%d outputs for %d events, %d events with duplicates", len(out), n, dups)
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	g := newGen(9)
	e := g.added(g.uuid())
	good, err := mailboxstate.Record(topics.MailboxState, mailboxstate.FromAdded(e, e.Data.(*domain.MailboxAdded)), e.Time)
	if err != nil {
		t.Fatal(err)
	}
	if _, live, err := mailboxstate.Decode(good); err != nil || !live {
		t.Fatalf("good record: live=%v err=%v", live, err)
	}
	if m, live, err := mailboxstate.Decode(mailboxstate.Tombstone(topics.MailboxState, "x", e.ID, e.Time)); err != nil || live || m.MailboxID != "x" {
		t.Fatalf("tombstone: %+v live=%v err=%v", m, live, err)
	}
	for name, mut := range map[string]func(r *kgo.Record){
		"bad json":     func(r *kgo.Record) { r.Value = []byte("{") },
		"key mismatch": func(r *kgo.Record) { r.Key = []byte(g.uuid()) },
		"no key":       func(r *kgo.Record) { r.Key = nil },
		"invalid":      func(r *kgo.Record) { r.Value = []byte(strings.Replace(string(r.Value), `"port":993`, `"port":0`, 1)) },
		"no credentials": func(r *kgo.Record) {
			r.Value = []byte(strings.Replace(string(r.Value), `"sealed_credentials"`, `"x"`, 1))
		},
	} {
		r := *good
		r.Value = append([]byte(nil), good.Value...)
		mut(&r)
		if _, _, err := mailboxstate.Decode(&r); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// A mailbox.added claiming a time after its record timestamp (written
// straight to the topic) is registered at the record timestamp: a claim
// dated forward cannot keep a mailbox out of the cold sync tier. One dated
// back keeps its claim.
func TestAddedAtNeverAfterReceived(t *testing.T) {
	t.Parallel()
	kcfg := broker(t)
	start(t, kcfg)
	g := newGen(7)
	received := g.t0.Add(time.Hour)
	ahead, behind := g.uuid(), g.uuid()
	ea, eb := g.added(ahead), g.added(behind)
	ea.Time = received.Add(48 * time.Hour)
	eb.Time = received.Add(-48 * time.Hour)
	recs := encode(t, ea, eb)
	for _, r := range recs {
		r.Timestamp = received
	}
	produceDated(t, kcfg, recs...)
	got := map[string]time.Time{}
	for _, r := range waitCommitted(t, kcfg, topics.MailboxState, 2) {
		var m domain.MailboxStateRecord
		if err := json.Unmarshal(r.Value, &m); err != nil {
			t.Fatal(err)
		}
		got[m.MailboxID] = m.AddedAt
	}
	if !got[ahead].Equal(received) {
		t.Errorf("a claim 48 h after its record: added_at %s, want the record's %s", got[ahead], received)
	}
	if !got[behind].Equal(eb.Time) {
		t.Errorf("a claim 48 h before its record: added_at %s, want the claim %s", got[behind], eb.Time)
	}
}
