// Package placement is the placement decider: the rules that put each
// mailbox on a sending worker (tiers, dedicated workers, risk pools,
// capacity, hysteresis, liveness, retention), the state they decide on, and
// the one fold of the decision log (State.ApplyDecision). The engine
// (placement/engine) runs it live, the projection (placement/postgres)
// folds the log through it into Postgres, internal/rebuild rebuilds
// that projection. A placement rule lives here and nowhere else; see
// docs/architecture.md §6.
//
// The decider is the placement rules as one
// deterministic function of (state, input).
//
// # Model
//
// A State is the engine's whole memory: sending workers, mailboxes,
// orgs. Apply takes one input (a domain event with the time the log
// appended it, or a tick), decides, and returns the decisions. Every decision is folded into
// the state through ApplyDecision, which is the only place the state
// changes; Apply is "decide, fold each decision as it is made, return them".
// Because the decisions also record the accepted facts the engine relies on
// (a worker registered, changed or died, a plan recorded, a band changed or
// held), folding the decision log alone into a fresh state restores the
// engine exactly: the decision log is the engine's changelog.
//
// Decisions are a pure function of (state, input): no wall clock (the clock
// is the input's time), no randomness, no map-order dependence (every
// enumeration is sorted, every tie broken by id).
//
// Invariants 3 and 4 of docs/architecture.md §8 hold between inputs (at the boundaries of
// Apply, which the engine writes as one transaction). Inside one Apply a fact
// may be recorded first and its consequences right after it (a plan change
// is recorded, then every mailbox of the org moves), so a prefix of one
// input's decisions can show a mailbox that is about to move.
//
// # Rules and the choices made where the design leaves room
//
// Tiers. An org's class is free when its plan is free, when no plan was ever
// recorded, or when it is not paid (subscription ended); dedicated when its
// plan is dedicated with at least one worker; premium otherwise. Free orgs'
// mailboxes sit only on shared_free workers; premium and dedicated orgs' only
// on shared_premium workers or on dedicated workers bound to that org. A
// heartbeat asking for tier dedicated is ignored (validation refuses it with
// tier_not_allowed before it reaches the log); a blank tier is shared premium.
//
// Dedicated. An org of class dedicated with N workers gets N bound workers:
// first one of its own released workers that is still draining (re-bound,
// cancelling the release), else an idle released worker of another org (when
// a released worker becomes idle it is handed to the longest-waiting org
// short of dedicated workers before it would revert), else an idle, live,
// healthy-or-watch shared premium clean worker, promoted. When none is
// available the org is short: its mailboxes are placed on shared premium
// (degraded, a pending entry with reason no_dedicated_capacity) and moved to
// dedicated workers when capacity appears (a new, revived, resumed or
// recovered worker, a revert, or a tick). A dedicated worker serves exactly
// one org (one org field per worker, bound only when unbound or released).
// A worker is released when its org no longer needs it (plan reduced or
// changed, the least loaded first), when it stops, dies, or changes its own
// tier; a released worker takes no new mailboxes, its mailboxes move away
// (they may stay, still sending, while nowhere else fits), and once idle it
// reverts to its heartbeat tier. Dedicated workers carry no risk-pool
// semantics (one customer per worker, no cross-tenant contamination): a
// dedicated org's mailbox of any band may sit on the org's own dedicated
// workers; band and pool segregation apply on shared workers only,
// including a dedicated org's degraded mailboxes on shared premium.
//
// Risk. band(healthy) = clean, band(watch, throttled) = risky,
// band(quarantined, blocked) = quarantine. A mailbox sits on a shared worker
// only when the worker's pool equals its band, both ways. When a band's pool
// has no eligible worker with headroom, an idle eligible clean worker of the
// same tier is promoted into the pool; with nothing idle the placement is
// refused and the mailbox waits in pending (retried on capacity or tick). A
// pool worker that becomes idle reverts to clean in the same input.
//
// Hysteresis. A worse band is adopted at once (a risky mailbox must leave the
// clean pool now). A better band is adopted only after every score for at
// least BandDwell (default 1 h, and so at least two consecutive scores) has
// mapped to a better band than the current one; the band adopted is the
// worst of those scores' bands. A score mapping to the current band (or
// worse) cancels a pending recovery. A score hovering on a threshold
// therefore moves a mailbox at most once (to the worse band) and back only
// once it has stayed good for the dwell time. The recovery in progress is
// state, recorded by band_held decisions. The scored event's until field does
// not affect placement.
//
// Weight (thousandths): an OAuth provider (gmail, outlook) weighs 0.05 even
// with warmup, since it never uses the worker's SMTP egress whatever its
// volume; otherwise warmup weighs 0.4; otherwise 1.0. Weights and loads are
// int64 thousandths, so a worker's load is exactly the sum of its mailboxes'
// weights at all times.
//
// Capacity. effective capacity = max(1, floor(base × health × age)) with base
// 16 (cold_smtp), 400 (oauth_api), 25 (warmup_only); health multiplier
// healthy 1, watch 0.75, throttled 0.5, quarantined 0.25, blocked 0; age
// multiplier 0.25 on the first day rising linearly by whole days to 1 after
// 14 days (0.25 + 0.75 × min(days, 14) / 14), days counted from the worker's
// first recorded heartbeat to the input's time. Capacity is recomputed on the
// worker's heartbeats and health samples and recorded in the decision.
//
// Worker health, from each worker.health_sampled: no sends in the window is
// healthy (multiplier 1); fewer than HealthMinSends sends leaves the state as
// it was (too little evidence); otherwise the worst state whose complaint
// rate or hard-bounce rate threshold is reached (defaults: complaints 0.1 %,
// 0.3 %, 0.5 %, 1 %; hard bounces 2 %, 5 %, 8 %, 10 % for watch, throttled,
// quarantined, blocked). Only healthy and watch workers take new mailboxes;
// worker health alone does not move mailboxes already placed.
//
// Placement. Among eligible workers (live, not stopping, not released,
// healthy or watch) of the right tier and pool with headroom
// (capacity − load ≥ weight), the lowest utilisation load/capacity wins
// (exact rational comparison), ties broken by the lower worker id. Shared
// workers are indexed per (tier, pool, weight class) in heaps ordered by
// utilisation, so a placement costs O(log workers).
//
// Liveness. A worker is live while its last heartbeat is no older than
// LivenessWindow (default 3 × HeartbeatInterval) at the tick's time. The
// log records transitions, not time passing: a worker's registration,
// every heartbeat that changes something (tier, egress, address, stopping,
// capacity), a revival and its death. A heartbeat that changes nothing is
// heard, not recorded: it moves the worker's heard time, which only the
// live state holds (not the fold of the log, not Snapshot). The death
// records the last heartbeat heard (last_seen; the start of the grace
// below when that is later), so the fold learns it then.
// A state restored from the log has heard only what the log recorded, so
// the engine that restores it calls GrantLiveness with its clock: no worker
// dies before a whole window has passed on the new engine, time for every
// live worker to be heard again (a grace period after failover, as Kafka's
// controller and Temporal's membership grant). What is decided stays a
// function of the inputs and the time granted; the fold of the log never
// needs the heard times. A dead worker's mailboxes
// are re-placed under the same rules (refused into pending when nothing
// fits). A stopping heartbeat drains the worker: it takes no new mailboxes
// and its mailboxes move where they fit (the rest stay and are retried).
// A heartbeat changing a shared worker's tier moves its mailboxes off at
// once (refusing those that fit nowhere); older heartbeats are ignored.
// A live worker's tier changes at most once per TierDwell (default 5
// minutes): the decision that changes it records until when
// (tier_held_until), and a heartbeat asking for another tier before then
// is heard, not recorded (its other changes are), so a worker flipping its
// tier on every heartbeat moves its mailboxes at most once per dwell.
//
// Liveness hold. When a worker's window runs out while at least
// LivenessHoldPermille (default 550) of at least LivenessHoldMinWorkers
// (default 3) live workers have not been heard for half a window, the
// engine is more likely blind (the API, Postgres or the network between
// them down) than the fleet dead: it records liveness_held and declares
// no death for silence until heartbeats flow again, the silent share
// (workers not heard since the hold began, or since the engine took over)
// below the threshold, or until the hold has lasted LivenessHoldMax
// (default 10 minutes); liveness_resumed ends it. Its fold grants every
// live worker a whole window from then; the workers silent through the
// hold then die without holding again. The threshold is above half so
// that losing exactly one of two equal halves (zones, racks) fails over
// at once, and the minimum keeps one- and two-worker fleets failing over.
// Explicit events still act while holding (a stopping heartbeat drains,
// a removal removes). Fewer silent workers die at the end of their
// window, as always. The decisions record the counts and the threshold;
// the fold reads no heard time and no configuration, and an engine that
// takes over mid-hold keeps holding (it counts as heard only what it
// heard itself).
//
// Retention. A dead worker (holding nothing, as every dead worker does)
// last seen (as its death recorded) longer ago than WorkerRetention (default
// 7 days) at a tick's time is forgotten by a worker_forgotten decision:
// the fold deletes it from the state and every index, so the state is
// bounded by the workers heard from within the retention, whatever ids
// were ever sent. The decision carries the fact (worker, last seen, the
// retention applied); the fold does not read the configuration, so
// replaying the log is deterministic whatever the configuration is then.
// A forgotten worker that heartbeats again registers as a new worker (age
// ramp from the start). Ticks find expiring and forgettable workers in
// heaps ordered by last heartbeat, so a tick costs what it decides, not
// the size of the fleet; one tick forgets at most MaxForgetPerTick
// workers (the longest silent first), so a burst is spread over ticks.
//
// Migrations. A band change moves the mailbox when its worker's pool no
// longer matches. A plan change records the plan, releases surplus dedicated
// workers, binds missing ones, then walks every mailbox of the org in id
// order: mailboxes that no longer fit move (or are refused into pending),
// mailboxes that fit but are not where the plan wants them (on a released
// or stopping worker, or a dedicated org's mailbox on shared premium while
// its own worker has room) move when a better place exists.
package placement
