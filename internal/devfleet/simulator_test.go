package devfleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/mail"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/devfleet"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/topics"
)

func keyring(t *testing.T) *sealing.Keyring {
	t.Helper()
	k, err := sealing.NewKeyring("devtest", map[string][]byte{"devtest": bytes.Repeat([]byte{7}, sealing.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newSim(t *testing.T, kcfg kafka.Config, srv *devfleet.Server, opts ...devfleet.Option) *devfleet.Simulator {
	t.Helper()
	opts = append([]devfleet.Option{devfleet.WithLogger(quietLog())}, opts...)
	sim, err := devfleet.New(kcfg.WithClientID("devfleet-test"), keyring(t), srv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	return sim
}

// readAll returns the events on topic (a catalog name, in the test's
// namespace), from its start to its end now.
func readAll(t *testing.T, kcfg kafka.Config, topic string) []domain.Event {
	t.Helper()
	topic = kcfg.Topic(topic)
	kc, err := kafka.NewClient(kcfg, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(kc).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	parts := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		want += int(o.Offset)
		parts[o.Partition] = kgo.NewOffset().AtStart()
	})
	cl, err := kafka.NewClient(kcfg, kafka.KindReader, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []domain.Event
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: %d of %d records", topic, len(out), want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			e, err := topics.Decode(r)
			if err != nil {
				t.Fatalf("decode %s/%d@%d: %v", topic, r.Partition, r.Offset, err)
			}
			out = append(out, e)
		})
	}
	return out
}

func TestSimulatorPublishesSetupOnceAndHeartbeats(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	srv := startServer(t)
	kr := keyring(t)
	sim := newSim(t, kcfg, srv)
	ctx := context.Background()

	n, err := sim.Setup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(devfleet.Orgs())+len(devfleet.Mailboxes()) {
		t.Fatalf("setup published %d events", n)
	}
	// Again, and from a new simulator (a restart): nothing is republished.
	if n, err := sim.Setup(ctx); err != nil || n != 0 {
		t.Fatalf("second setup published %d (%v)", n, err)
	}
	if n, err := newSim(t, kcfg, srv).Setup(ctx); err != nil || n != 0 {
		t.Fatalf("restarted setup published %d (%v)", n, err)
	}

	orgs := readAll(t, kcfg, topics.OrgEvents)
	if len(orgs) != 2 {
		t.Fatalf("%d org events", len(orgs))
	}
	plans := map[string]domain.Plan{}
	for _, e := range orgs {
		d := e.Data.(*domain.OrgPlanChanged)
		plans[d.OrgID] = d.Plan
		if e.Source != devfleet.Source || e.ID != devfleet.FixedEventID("org.plan_changed/"+d.OrgID+"/"+string(d.Plan)) {
			t.Errorf("org event %s from %s", e.ID, e.Source)
		}
	}
	if plans[devfleet.PremiumOrgID] != domain.PlanPremium || plans[devfleet.FreeOrgID] != domain.PlanFree {
		t.Fatalf("plans %v", plans)
	}

	boxes := readAll(t, kcfg, topics.MailboxEvents)
	if len(boxes) != 6 {
		t.Fatalf("%d mailbox events", len(boxes))
	}
	_, ps, _ := net.SplitHostPort(srv.Addr())
	port, _ := strconv.Atoi(ps)
	seen := map[string]bool{}
	for _, e := range boxes {
		d := e.Data.(*domain.MailboxAdded)
		seen[d.Address] = true
		if !domain.IsUUIDv7(e.ID) || d.Provider != domain.ProviderSMTPIMAP || !d.WarmupEnabled ||
			d.IMAP != (domain.IMAPEndpoint{Host: "127.0.0.1", Port: port, TLS: domain.TLSNone, Username: d.Address}) ||
			d.Credentials != nil || d.SealedCredentials == nil {
			t.Errorf("mailbox.added %s: %+v", e.ID, d)
			continue
		}
		plain, err := kr.Open(*d.SealedCredentials, d.AAD())
		if err != nil {
			t.Fatalf("open %s's credentials: %v", d.Address, err)
		}
		var cr domain.Credentials
		if err := json.Unmarshal(plain, &cr); err != nil || cr.Password != devfleet.DevPassword {
			t.Errorf("%s credentials %q (%v)", d.Address, plain, err)
		}
	}
	for _, m := range devfleet.Mailboxes() {
		if !seen[m.Address] {
			t.Errorf("no mailbox.added for %s", m.Address)
		}
	}

	for range 2 {
		if err := sim.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	beats := readAll(t, kcfg, topics.WorkerEvents)
	if len(beats) != 2*len(devfleet.Workers()) {
		t.Fatalf("%d heartbeats", len(beats))
	}
	tiers := map[domain.Tier]int{}
	for _, e := range beats {
		d := e.Data.(*domain.WorkerHeartbeat)
		tiers[d.Tier]++
		if d.Stopping {
			t.Errorf("stopping heartbeat %+v", d)
		}
	}
	if tiers[domain.TierSharedFree] != 2*2 || tiers[domain.TierSharedPremium] != 2*3 {
		t.Fatalf("heartbeats by tier %v", tiers)
	}
	// A listed port different from the one registered re-registers the
	// endpoint: a server on another port makes the setup publish again.
	srv2 := startServer(t)
	if n, err := newSim(t, kcfg, srv2).Setup(ctx); err != nil || n != len(devfleet.Mailboxes()) {
		t.Fatalf("setup for a server on another port published %d (%v), want the %d mailboxes", n, err, len(devfleet.Mailboxes()))
	}
}

var warmupHeaderRE = regexp.MustCompile(`^mailbox=([0-9a-f-]{36}); id=([A-Za-z0-9._-]{1,128})$`)

func TestSimulatorWarmupDeterministic(t *testing.T) {
	t.Parallel()
	clock := func() time.Time { return time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC) }
	run := func(seed uint64, rounds int) ([]devfleet.Delivery, *devfleet.Server) {
		srv := startServer(t)
		// No broker needed to deliver mail: the client connects lazily.
		sim := newSim(t, kafka.Config{Brokers: []string{"127.0.0.1:1"}}, srv, devfleet.WithSeed(seed), devfleet.WithRunID("test"),
			devfleet.WithClock(clock), devfleet.WithWarmupPerTick(6))
		var all []devfleet.Delivery
		for range rounds {
			ds, err := sim.Warmup(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, ds...)
		}
		return all, srv
	}
	a, srv := run(42, 40)
	b, _ := run(42, 40)
	c, _ := run(43, 40)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed delivered differently")
	}
	if slices.Equal(a, c) {
		t.Fatal("another seed delivered the same")
	}

	// Each sender sent 40; its Junk share is its profile exactly (two full
	// decks of 20); nobody mails itself; tokens are unique.
	byID := map[string]devfleet.Mailbox{}
	for _, m := range devfleet.Mailboxes() {
		byID[m.ID] = m
	}
	sent, junk := map[string]int{}, map[string]int{}
	tokens := map[string]bool{}
	perFolder := map[string]map[string]int{}
	for _, d := range a {
		m := byID[d.SenderID]
		if m.Address != d.From || d.From == d.To || tokens[d.Token] {
			t.Fatalf("delivery %+v", d)
		}
		tokens[d.Token] = true
		sent[d.From]++
		if d.Folder == devfleet.FolderJunk {
			junk[d.From]++
		}
		if perFolder[d.To] == nil {
			perFolder[d.To] = map[string]int{}
		}
		perFolder[d.To][d.Folder]++
	}
	for _, m := range devfleet.Mailboxes() {
		if sent[m.Address] != 40 || junk[m.Address] != int(m.JunkRate*40+0.5) {
			t.Errorf("%s sent %d, %d to Junk (rate %.2f)", m.Address, sent[m.Address], junk[m.Address], m.JunkRate)
		}
	}
	if junk["spammy@example.com"] != 24 {
		t.Errorf("spammy: %d of 40 in Junk, want 24", junk["spammy@example.com"])
	}

	// The mail is on the server, with the warmup header and the usual ones.
	c2 := login(t, srv.Addr(), "ada@example.com", devfleet.DevPassword)
	for _, folder := range []string{devfleet.FolderInbox, devfleet.FolderJunk} {
		sel, err := c2.Select(folder, &imap.SelectOptions{ReadOnly: true}).Wait()
		if err != nil {
			t.Fatal(err)
		}
		prefilled := map[string]uint32{devfleet.FolderInbox: 3, devfleet.FolderJunk: 1}[folder]
		if want := prefilled + uint32(perFolder["ada@example.com"][folder]); sel.NumMessages != want {
			t.Fatalf("ada's %s holds %d, want %d", folder, sel.NumMessages, want)
		}
		if sel.NumMessages == prefilled {
			continue
		}
		var seq imap.SeqSet
		seq.AddRange(prefilled+1, sel.NumMessages)
		msgs, err := c2.Fetch(seq, &imap.FetchOptions{BodySection: []*imap.FetchItemBodySection{{Peek: true}}}).Collect()
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range msgs {
			pm, err := mail.ReadMessage(bytes.NewReader(msg.BodySection[0].Bytes))
			if err != nil {
				t.Fatal(err)
			}
			h := warmupHeaderRE.FindStringSubmatch(pm.Header.Get(devfleet.WarmupHeader))
			if h == nil || !tokens[h[2]] || byID[h[1]].Address == "" {
				t.Fatalf("%s header %q", devfleet.WarmupHeader, pm.Header.Get(devfleet.WarmupHeader))
			}
			from, err := mail.ParseAddress(pm.Header.Get("From"))
			if err != nil || from.Address != byID[h[1]].Address {
				t.Fatalf("From %q for sender %s (%v)", pm.Header.Get("From"), h[1], err)
			}
			if _, err := pm.Header.Date(); err != nil || pm.Header.Get("Message-ID") == "" || pm.Header.Get("Subject") == "" ||
				pm.Header.Get("To") == "" {
				t.Fatalf("headers %v", pm.Header)
			}
		}
	}
}

// TestSimulatorRun runs the whole cadence on a broker: setup, heartbeats
// and warmup rounds, until its context ends.
func TestSimulatorRun(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	srv := startServer(t)
	sim := newSim(t, kcfg, srv, devfleet.WithHeartbeatInterval(50*time.Millisecond),
		devfleet.WithWarmupInterval(20*time.Millisecond), devfleet.WithWarmupPerTick(2), devfleet.WithSeed(9))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Run(ctx) }()

	inbox := func() (uint32, error) {
		c, err := imapclient.DialInsecure(srv.Addr(), nil)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		if err := c.Login("grace@example.com", devfleet.DevPassword).Wait(); err != nil {
			return 0, err
		}
		st, err := c.Status("INBOX", &imap.StatusOptions{NumMessages: true}).Wait()
		if err != nil {
			return 0, err
		}
		return *st.NumMessages, nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := inbox()
		if err != nil {
			t.Fatal(err)
		}
		beats := countRecords(t, kcfg, topics.WorkerEvents)
		added := countRecords(t, kcfg, topics.MailboxEvents)
		if n > 3+2 && beats >= 3*len(devfleet.Workers()) && added == len(devfleet.Mailboxes()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: grace's INBOX %d, %d heartbeats, %d mailbox events", n, beats, added)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func countRecords(t *testing.T, kcfg kafka.Config, topic string) int {
	t.Helper()
	topic = kcfg.Topic(topic)
	kc, err := kafka.NewClient(kcfg, kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(kc).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
	return n
}

func TestFixedEventID(t *testing.T) {
	t.Parallel()
	a, b := devfleet.FixedEventID("x"), devfleet.FixedEventID("y")
	if !domain.IsUUIDv7(a) || !domain.IsUUIDv7(b) || a == b || a != devfleet.FixedEventID("x") {
		t.Fatalf("ids %s %s", a, b)
	}
	if fmt.Sprint(devfleet.Mailboxes()[0].ID) != devfleet.AdaMailboxID {
		t.Fatal("ada is not the first sample mailbox")
	}
}

func TestSimulatorWarmupHeaderName(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	sim := newSim(t, kafka.Config{Brokers: []string{"127.0.0.1:1"}}, srv, devfleet.WithWarmupHeader("X-Dev-Warm"), devfleet.WithWarmupPerTick(6))
	ds, err := sim.Warmup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := login(t, srv.Addr(), ds[0].To, devfleet.DevPassword)
	sel, err := c.Select(ds[0].Folder, &imap.SelectOptions{ReadOnly: true}).Wait()
	if err != nil {
		t.Fatal(err)
	}
	var last imap.SeqSet
	last.AddNum(sel.NumMessages)
	msgs, err := c.Fetch(last, &imap.FetchOptions{BodySection: []*imap.FetchItemBodySection{{Peek: true}}}).Collect()
	if err != nil {
		t.Fatal(err)
	}
	pm, err := mail.ReadMessage(bytes.NewReader(msgs[0].BodySection[0].Bytes))
	if err != nil {
		t.Fatal(err)
	}
	if pm.Header.Get("X-Dev-Warm") == "" || pm.Header.Get(devfleet.WarmupHeader) != "" {
		t.Fatalf("headers %v", pm.Header)
	}
	if _, err := devfleet.New(kafka.Config{Brokers: []string{"127.0.0.1:1"}}, keyring(t), srv, devfleet.WithWarmupHeader("Bad Header:")); err == nil {
		t.Fatal("a malformed header name was accepted")
	}
}
