// Package placement is the placement decider: the rules that put each
// mailbox on a sending worker (tiers, dedicated workers, risk pools,
// capacity, hysteresis, liveness, retention), the state they decide on, and
// the one fold of the decision log (State.ApplyDecision). The engine
// (placement/engine) runs it live, the projection (placement/postgres)
// folds the log through it into Postgres, internal/rebuild rebuilds
// that projection. A placement rule lives here and nowhere else; see
// docs/architecture.md §6.
package placement
