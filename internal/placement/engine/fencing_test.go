package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/topics"
)

// The fencing tests run engines as child processes (this test binary,
// re-executed into TestChildEngine), so that the active one can be killed
// with SIGKILL or frozen with SIGSTOP like a real process.

const (
	envChild   = "MAILPLANE_PLACEMENT_CHILD"
	envBrokers = "MAILPLANE_PLACEMENT_CHILD_BROKERS"
	envSession = "MAILPLANE_PLACEMENT_CHILD_SESSION"
	envHB      = "MAILPLANE_PLACEMENT_CHILD_HEARTBEAT"
	envNS      = "MAILPLANE_PLACEMENT_CHILD_NAMESPACE"
	envSlow    = "MAILPLANE_PLACEMENT_CHILD_SLOW_COMMIT"
)

// childEngine is not a test: it is the child process body. It runs an
// engine until SIGTERM or until its stdin closes (the parent died), and
// reports on stdout, one event per line:
//
//	active <unix ns>
//	standby <unix ns>
//	commit <unix ns> <decisions> <inputs>
//
// TestMain runs this test binary as the child process of the fencing tests when
// the environment asks for it, instead of running tests.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		childEngine()
	}
	os.Exit(m.Run())
}

func childEngine() {
	name := os.Getenv(envChild)
	session, _ := time.ParseDuration(os.Getenv(envSession))
	hb, _ := time.ParseDuration(os.Getenv(envHB))
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
		outMu.Unlock()
	}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("MAILPLANE_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("child", name)
	}
	e, err := New(kafka.Config{Brokers: strings.Split(os.Getenv(envBrokers), ","), ClientID: "child-" + name, Namespace: topics.Namespace(os.Getenv(envNS))},
		WithSessionTimeout(session), WithHeartbeatInterval(hb), WithLogger(logger),
		WithClock(func() time.Time { return t0 }), // the test's events are at t0: ticks never expire them
		WithTickInterval(50*time.Millisecond),
		WithCommitted(func(c Commit) { say("commit %d %d %d", c.At.UnixNano(), c.Decisions, len(c.Inputs)) }),
	)
	if err != nil {
		log.Fatal(err)
	}
	if slow, err := time.ParseDuration(os.Getenv(envSlow)); err == nil {
		// Hold every transaction open (its records written) for a while,
		// so a SIGSTOP lands inside one.
		e.cfg.beforeEnd = func() { time.Sleep(slow) }
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	go func() {
		was := false
		for ctx.Err() == nil {
			if a := e.Active(); a != was {
				was = a
				if a {
					say("active %d", time.Now().UnixNano())
				} else {
					say("standby %d", time.Now().UnixNano())
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	if err := e.Run(ctx); err != nil {
		log.Fatal(err)
	}
	os.Exit(0)
}

// child is an engine process.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu      sync.Mutex
	active  []time.Time // when it became active
	standby []time.Time
	commits []childCommit
	done    chan struct{}
}

type childCommit struct {
	at        time.Time
	decisions int
	inputs    int
}

func spawn(t *testing.T, b testBroker, name string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.count=1")
	cmd.Env = append(append(os.Environ(), env...),
		envChild+"="+name, envBrokers+"="+strings.Join(b.brokers, ","),
		envSession+"="+b.session.String(), envHB+"="+b.hb.String(), envNS+"="+string(b.ns))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				continue
			}
			at := time.Unix(0, ns)
			c.mu.Lock()
			switch f[0] {
			case "active":
				c.active = append(c.active, at)
			case "standby":
				c.standby = append(c.standby, at)
			case "commit":
				if len(f) == 4 {
					d, _ := strconv.Atoi(f[2])
					n, _ := strconv.Atoi(f[3])
					c.commits = append(c.commits, childCommit{at, d, n})
				}
			}
			c.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		_ = c.stdin.Close()
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

func (c *child) isActive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.active) > len(c.standby)
}

// activeSince returns the first time it became active after t.
func (c *child) activeSince(t time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.active {
		if !a.Before(t) {
			return a, true
		}
	}
	return time.Time{}, false
}

// commitsSince returns its commits at or after t.
func (c *child) commitsSince(t time.Time) []childCommit {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []childCommit
	for _, cm := range c.commits {
		if !cm.at.Before(t) {
			out = append(out, cm)
		}
	}
	return out
}

func (c *child) decisions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, cm := range c.commits {
		n += cm.decisions
	}
	return n
}

// waitMembers waits until the engine group is stable with n members.
func waitMembers(t *testing.T, b testBroker, n int) {
	t.Helper()
	kc, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	adm := kadm.NewClient(kc)
	waitFor(t, 30*time.Second, fmt.Sprintf("a stable group of %d", n), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gs, err := adm.DescribeGroups(ctx, b.ns.Group(DefaultGroup))
		if err != nil {
			return false
		}
		g, ok := gs[b.ns.Group(DefaultGroup)]
		return ok && g.Err == nil && g.State == "Stable" && len(g.Members) == n
	})
}

// streamer publishes one mailbox.added every interval until stopped.
type streamer struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	evs  []domain.Event
	err  error
}

func stream(p *publisher, from int, every time.Duration) *streamer {
	s := &streamer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for i := from; ; i++ {
			select {
			case <-s.stop:
				return
			case <-time.After(every):
			}
			org := 2 + i%2 // paid orgs: capacity is plentiful
			ev := p.event(t0.Add(time.Hour), mailboxAdded(i, org, domain.ProviderGmail))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := p.publishAt(ctx, ev.Time, ev)
			cancel()
			s.mu.Lock()
			if err != nil {
				s.err = err
				s.mu.Unlock()
				return
			}
			s.evs = append(s.evs, ev)
			s.mu.Unlock()
			p.mu.Lock()
			p.all[ev.ID] = ev
			p.mu.Unlock()
		}
	}()
	return s
}

func (s *streamer) finish(t *testing.T) []domain.Event {
	t.Helper()
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		t.Fatalf("publishing: %v", s.err)
	}
	return s.evs
}

// activeOf waits until exactly one of cs is active and returns it.
func activeOf(t *testing.T, cs ...*child) *child {
	t.Helper()
	var a *child
	waitFor(t, 30*time.Second, "one active engine", func() bool {
		a = nil
		n := 0
		for _, c := range cs {
			if c.isActive() {
				a = c
				n++
			}
		}
		return n == 1
	})
	return a
}

// TestFailoverSIGKILL: two engine processes against one broker; only the
// active one writes; SIGKILL it mid-stream, and the standby takes over
// within about a session timeout; a new standby joins and the process
// repeats. Afterwards every input's decisions are in the log exactly once
// and the log is whole (CheckLog: whole groups, derived ids, it folds).
// Deciding it again needs a transcript of every commit, which a process
// killed between a commit and its report cannot leave. Failover time (SIGKILL to the standby's first committed
// decision) is logged.
func TestFailoverSIGKILL(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	p := newPublisher(t, b)
	cs := []*child{spawn(t, b, "a"), spawn(t, b, "b")}
	waitMembers(t, b, 2)
	active := activeOf(t, cs...)
	fleet(t, b, p, t0)
	first := addMailboxes(p, t0.Add(time.Minute), 0, 20)
	waitLog(t, b, 30*time.Second, "first mailboxes", func(l []logEntry) bool { return hasAll(l, first) })
	for _, c := range cs {
		if c != active && c.decisions() != 0 {
			t.Fatalf("standby %s wrote %d decisions", c.name, c.decisions())
		}
	}

	s := stream(p, 1000, 5*time.Millisecond)
	next := 'c'
	var failovers []time.Duration
	for round := 0; round < 2; round++ {
		time.Sleep(300 * time.Millisecond)
		var standby *child
		for _, c := range cs {
			if c != active {
				standby = c
			}
		}
		before := active.decisions()
		killed := time.Now()
		if err := active.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-active.done
		waitFor(t, 30*time.Second, "the standby's first commit", func() bool { return len(standby.commitsSince(killed)) > 0 })
		took := standby.commitsSince(killed)[0].at.Sub(killed)
		activeAt, _ := standby.activeSince(killed)
		failovers = append(failovers, took)
		t.Logf("round %d: %s killed after %d decisions; %s active after %s, first decision committed after %s",
			round, active.name, before, standby.name, activeAt.Sub(killed), took)
		if limit := b.session + 5*time.Second; took > limit {
			t.Errorf("failover took %s, more than the session timeout + 5s (%s)", took, limit)
		}
		// A new standby for the next round.
		nc := spawn(t, b, string(next))
		next++
		cs = []*child{standby, nc}
		active = standby
		waitMembers(t, b, 2)
		if nc.decisions() != 0 {
			t.Fatalf("the new standby wrote decisions")
		}
	}
	time.Sleep(200 * time.Millisecond)
	streamed := s.finish(t)
	l := waitLog(t, b, 30*time.Second, "every streamed mailbox", func(l []logEntry) bool { return hasAll(l, streamed) })
	checkLog(t, l, p.events(), placement.Config{})
	compareAborted(t, b, l)
	t.Logf("failover (SIGKILL to first committed decision by the standby, session %s, heartbeat %s): %v; %d inputs streamed, %d decisions in the log",
		b.session, b.hb, failovers, len(streamed), len(l))
}

// TestZombieFenced: the active engine is frozen (SIGSTOP) mid-stream, the
// standby takes over, then the frozen one resumes (SIGCONT) still
// believing it is active, with a transaction possibly open. The fence
// (the new engine's InitProducerID, and the group generation on the offset
// commit) stops it: it commits nothing after the takeover, stands down,
// and the log stays exact.
func TestZombieFenced(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	p := newPublisher(t, b)
	slow := envSlow + "=150ms"
	cs := []*child{spawn(t, b, "a", slow), spawn(t, b, "b", slow)}
	waitMembers(t, b, 2)
	zombie := activeOf(t, cs...)
	other := cs[0]
	if other == zombie {
		other = cs[1]
	}
	fleet(t, b, p, t0)
	s := stream(p, 1000, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)

	// Freeze it inside a transaction: right after a commit, the next
	// transaction (its inputs are streaming in) holds for 150ms.
	n := len(zombie.commitsSince(time.Time{}))
	waitFor(t, 10*time.Second, "a commit", func() bool { return len(zombie.commitsSince(time.Time{})) > n })
	time.Sleep(60 * time.Millisecond)
	stopped := time.Now()
	if err := zombie.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the standby's first commit", func() bool { return len(other.commitsSince(stopped)) > 0 })
	takeover, _ := other.activeSince(stopped)
	t.Logf("standby active %s after SIGSTOP", takeover.Sub(stopped))
	time.Sleep(300 * time.Millisecond)
	if err := zombie.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the zombie to stand down", func() bool { return !zombie.isActive() })
	time.Sleep(500 * time.Millisecond)
	streamed := s.finish(t)
	l := waitLog(t, b, 30*time.Second, "every streamed mailbox", func(l []logEntry) bool { return hasAll(l, streamed) })
	if late := zombie.commitsSince(takeover); len(late) > 0 {
		t.Fatalf("the fenced engine committed %d transactions after the takeover: %+v", len(late), late)
	}
	if !other.isActive() {
		t.Fatal("the new engine is not active any more")
	}
	checkLog(t, l, p.events(), placement.Config{})
	compareAborted(t, b, l)
}

// rawLog reads every record of the decision log, read_uncommitted: the
// aborted transactions' records too.
func rawLog(t *testing.T, b testBroker) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.KeepControlRecords(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{b.ns.Topic(topics.PlacementDecisions): {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, b.ns.Topic(topics.PlacementDecisions))
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(b.ns.Topic(topics.PlacementDecisions), 0)
	var out []*kgo.Record
	for last := int64(-1); last < end.Offset-1; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading the raw log: %v", ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			last = r.Offset
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
		})
	}
	return out
}

// compareAborted checks the records of aborted transactions (visible only
// read_uncommitted) against the committed log: an input decided in an
// aborted transaction and again after the failover gets the same decision
// ids; it logs how many were byte-identical (they are whenever the new
// engine re-decided the input from the same state, in the same order).
func compareAborted(t *testing.T, b testBroker, committed []logEntry) {
	t.Helper()
	type slot struct {
		pos string
		idx int
	}
	byOffset := map[int64]bool{}
	bySlot := map[slot]topics.Decision{}
	for _, e := range committed {
		byOffset[e.offset] = true
		bySlot[slot{e.d.Cause.Position(), e.d.Cause.Index}] = e.d
	}
	var aborted, sameID, sameBytes, redecided int
	for _, r := range rawLog(t, b) {
		if byOffset[r.Offset] {
			continue
		}
		aborted++
		d, err := topics.DecodeDecision(r)
		if err != nil {
			t.Fatalf("aborted record at %d: %v", r.Offset, err)
		}
		c, ok := bySlot[slot{d.Cause.Position(), d.Cause.Index}]
		if !ok || d.Cause.IsTick() {
			continue
		}
		redecided++
		if c.ID == d.ID {
			sameID++
		} else if c.Cause.Count == d.Cause.Count {
			t.Errorf("input %s decision %d: id %s in the aborted transaction, %s in the log", d.Cause.Position(), d.Cause.Index, d.ID, c.ID)
		}
		again, err := topics.EncodeDecision(c)
		if err != nil {
			t.Fatal(err)
		}
		if sameRecordBytes(r, again) {
			sameBytes++
		}
	}
	t.Logf("aborted records: %d; re-decided after the failover: %d, same id: %d, byte-identical: %d", aborted, redecided, sameID, sameBytes)
}

func sameRecordBytes(a, b *kgo.Record) bool {
	if string(a.Key) != string(b.Key) || string(a.Value) != string(b.Value) || !a.Timestamp.Equal(b.Timestamp) || len(a.Headers) != len(b.Headers) {
		return false
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || string(a.Headers[i].Value) != string(b.Headers[i].Value) {
			return false
		}
	}
	return true
}
