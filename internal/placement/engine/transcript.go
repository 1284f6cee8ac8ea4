package engine

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/topics"
)

// Transcript records the transactions engines commit, so that their
// decision log can be decided again (Verify). The log records transitions,
// not every input: a heartbeat that changes nothing is heard, not recorded
// (docs/architecture.md §6), so the log alone cannot be decided again.
// The decider is fed what the engines committed, in the order they
// committed it: every input (those that decided nothing too), every tick
// at its time, and the liveness grace an engine granted when it restored.
// Tests and rehearsals use it; one transcript serves every engine of a
// run, one active at a time.
type Transcript struct {
	mu      sync.Mutex
	commits []Commit
}

// WithTranscript records every committed transaction in tr.
func WithTranscript(tr *Transcript) Option {
	return WithCommitted(func(c Commit) {
		tr.mu.Lock()
		tr.commits = append(tr.commits, c)
		tr.mu.Unlock()
	})
}

// Commits returns the commits recorded so far.
func (tr *Transcript) Commits() []Commit {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.commits)
}

// Decisions is the number of decisions the recorded commits wrote.
func (tr *Transcript) Decisions() int {
	n := 0
	for _, c := range tr.Commits() {
		n += c.Decisions
	}
	return n
}

// Decided reports whether every event of evs was committed as an input
// (whether it decided anything or not).
func (tr *Transcript) Decided(evs []domain.Event) bool {
	done := map[string]bool{}
	for _, c := range tr.Commits() {
		for _, in := range c.Inputs {
			done[in.EventID] = true
		}
	}
	for _, ev := range evs {
		if !done[ev.Key()] {
			return false
		}
	}
	return true
}

// LoggedDecision is one decision of the log at its offset.
type LoggedDecision struct {
	Offset   int64
	Decision topics.Decision
}

// CheckLog checks what the decision log alone shows: decisions come in
// whole groups, one per input or tick, with indexes 0..count-1 in order;
// every event cause is one of events (keyed by id; the domain events
// published to the inputs) and no input position is decided twice
// (nothing lost half-way, nothing decided twice: the transactions were
// exactly-once); every id is the one DecisionID derives from its cause
// and no id repeats; the log folds, and the fold holds the invariants. It
// returns the fold. Since heartbeats that change nothing are heard but not
// recorded, the log alone cannot be decided again: Verify does that from
// a Transcript.
func CheckLog(cfg placement.Config, events map[string]domain.Event, log []LoggedDecision) (*placement.State, error) {
	known := make(map[string]bool, len(events))
	for _, ev := range events {
		known[ev.Key()] = true
	}
	folded := placement.NewState(cfg)
	seenPos, seenID := map[string]bool{}, map[string]bool{}
	lastID := ""
	for i := 0; i < len(log); {
		c := log[i].Decision.Cause
		switch {
		case c.Index != 0:
			return nil, fmt.Errorf("offset %d: a group starts at index %d (cause %+v)", log[i].Offset, c.Index, c)
		case c.Count < 1 || i+c.Count > len(log):
			return nil, fmt.Errorf("offset %d: the group of %d decisions of cause %+v is cut short", log[i].Offset, c.Count, c)
		case !c.IsTick() && seenPos[c.Position()]:
			return nil, fmt.Errorf("offset %d: input %s decided twice", log[i].Offset, c.Position())
		case !c.IsTick() && !known[c.ID]:
			return nil, fmt.Errorf("offset %d: cause %s is not a published event", log[i].Offset, c.ID)
		}
		seenPos[c.Position()] = true
		key := CauseKey(c, log[i].Decision.Time().Round(0).UTC(), lastID)
		for j := range c.Count {
			got := log[i+j]
			gc := got.Decision.Cause
			if gc.Index != j || gc.Count != c.Count || gc.ID != c.ID || gc.Position() != c.Position() {
				return nil, fmt.Errorf("offset %d: decision %d of cause %+v has cause %+v", got.Offset, j, c, gc)
			}
			if id := DecisionID(got.Decision.Data.Meta().At, key, j); got.Decision.ID != id {
				return nil, fmt.Errorf("offset %d: id %s, derived %s (cause key %s)", got.Offset, got.Decision.ID, id, key)
			}
			if seenID[got.Decision.ID] {
				return nil, fmt.Errorf("offset %d: duplicate decision id %s", got.Offset, got.Decision.ID)
			}
			seenID[got.Decision.ID] = true
			if err := folded.ApplyDecision(got.Decision.Data); err != nil {
				return nil, fmt.Errorf("offset %d: folding: %v", got.Offset, err)
			}
			lastID = got.Decision.ID
		}
		i += c.Count
	}
	if err := placement.Invariants(folded); err != nil {
		return nil, fmt.Errorf("invariants of the fold of the log: %v", err)
	}
	return folded, nil
}

// Verify checks log (the whole decision log, written by engines that
// recorded in tr) as CheckLog does, and decides it again: the decider,
// fed the recorded commits in order (every input at the time it was
// decided at, every tick, every grace granted), makes exactly the logged
// decisions (type and JSON, input by input and tick by tick), as many as
// each commit said, and every logged decision is accounted for; its state
// equals the fold of the log. The commit hook runs after a commit
// returns: the caller waits until Decisions accounts for the log it read.
// It returns the decider's state.
func (tr *Transcript) Verify(cfg placement.Config, events map[string]domain.Event, log []LoggedDecision) (*placement.State, error) {
	folded, err := CheckLog(cfg, events, log)
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]domain.Event, len(events))
	for _, ev := range events {
		byKey[ev.Key()] = ev
	}
	decider := placement.NewState(cfg)
	var granted time.Time
	i := 0
	same := func(what string, want []domain.PlacementDecision, cause topics.Cause) error {
		if i+len(want) > len(log) {
			return fmt.Errorf("%s: the decider makes %d decisions, the log holds %d more:%s", what, len(want), len(log)-i, transcriptDecisions(want))
		}
		for j := range want {
			got := log[i+j]
			if c := got.Decision.Cause; c.IsTick() != cause.IsTick() || c.Position() != cause.Position() {
				return fmt.Errorf("offset %d: %s: the log holds a decision of cause %+v", got.Offset, what, c)
			}
			if got.Decision.Data.EventType() != want[j].EventType() || transcriptJSON(got.Decision.Data) != transcriptJSON(want[j]) {
				return fmt.Errorf("offset %d: %s: decision %d differs from the decider's:\nlog:     %s %s\ndecider: %s %s",
					got.Offset, what, j, got.Decision.Data.EventType(), transcriptJSON(got.Decision.Data), want[j].EventType(), transcriptJSON(want[j]))
			}
		}
		i += len(want)
		return nil
	}
	for _, cm := range tr.Commits() {
		if !cm.Granted.Equal(granted) {
			decider.GrantLiveness(cm.Granted)
			granted = cm.Granted
		}
		made := 0
		for _, in := range cm.Inputs {
			cause := topics.Cause{ID: in.EventID, Topic: in.Topic, Partition: in.Partition, Offset: in.Offset}
			ev, ok := byKey[in.EventID]
			if !ok {
				return nil, fmt.Errorf("input %s: %s is not a published event", cause.Position(), in.EventID)
			}
			want := decider.Apply(placement.Input{At: in.At, Event: ev.Data})
			if len(want) != in.Decisions {
				return nil, fmt.Errorf("input %s (%s at %s): the engine decided %d, the decider makes %d:%s", cause.Position(), domain.ShortType(ev.Type), in.At, in.Decisions, len(want), transcriptDecisions(want))
			}
			if err := same("input "+cause.Position(), want, cause); err != nil {
				return nil, err
			}
			made += len(want)
		}
		if cm.Tick {
			want := decider.Apply(placement.Tick(cm.TickAt))
			if n := cm.Decisions - made; len(want) != n {
				return nil, fmt.Errorf("tick at %s (grace from %s): the engine decided %d, the decider makes %d:%s", cm.TickAt, granted, n, len(want), transcriptDecisions(want))
			}
			if err := same("tick at "+cm.TickAt.String(), want, topics.Cause{ID: topics.CauseTick, Type: topics.CauseTick}); err != nil {
				return nil, err
			}
		}
	}
	if i != len(log) {
		return nil, fmt.Errorf("offset %d: %d logged decisions that no committed input or tick accounts for (cause %+v)", log[i].Offset, len(log)-i, log[i].Decision.Cause)
	}
	if a, b := decider.Snapshot(), folded.Snapshot(); !reflect.DeepEqual(a, b) {
		return nil, fmt.Errorf("the fold of the log differs from the decider's state:\ndecider %s\nfold    %s", transcriptJSON(a), transcriptJSON(b))
	}
	if err := placement.Invariants(decider); err != nil {
		return nil, fmt.Errorf("invariants of the decider's state: %v", err)
	}
	return decider, nil
}

func transcriptJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func transcriptDecisions(ds []domain.PlacementDecision) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "\n  %s %s", domain.ShortType(d.EventType()), transcriptJSON(d))
	}
	return b.String()
}
