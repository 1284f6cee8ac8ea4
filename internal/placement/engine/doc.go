// Package engine is the placement engine: the single writer of the
// decision log (docs/architecture.md §6). It consumes the four domain topics,
// keeps the placement.State in memory, decides with the pure decider
// (placement.State.Apply), and writes every decision to
// topics.PlacementDecisions in a Kafka transaction together with the input
// offsets it consumed.
//
// # Leadership
//
// Every engine joins one consumer group (DefaultGroup) on the domain topics
// with SingleOwnerBalancer, a cooperative balancer on the classic protocol
// (Redpanda lacks KIP-848) that gives every input partition to one member
// and keeps it there while that member lives. The member holding the
// partitions is the active engine; the others are standbys with nothing
// assigned, which neither read nor write. Standbys joining or leaving
// never move the partitions, so they never disturb the active engine's
// transaction.
//
// When the active engine dies, the coordinator drops it after the session
// timeout, the group rebalances, and a standby is assigned everything.
// Failover therefore takes about the session timeout, plus up to one
// heartbeat interval, a rebalance round and the restore. Measured on kfake
// (SIGKILL to the standby's first committed decision, small log): 6.2-6.3 s
// with the defaults (6 s session, 500 ms heartbeat), 1.02-1.03 s with a
// 1 s session and 100 ms heartbeats. The restore adds about 1 s per 180,000
// decisions folded from the log (hence the projection checkpoint). A clean
// shutdown leaves the group at once: the standby takes over in tens of
// milliseconds.
//
// Group membership alone can leave a cut-off engine believing it is active
// for a while (docs/architecture.md §14). The transactional id is the fence: every
// engine uses the same one (DefaultTransactionalID), and an engine becoming
// active calls InitProducerID in its assignment callback, before its input
// offsets are fetched and before it reads the decision log. That aborts
// the previous engine's open transaction and bumps the producer epoch, so
// from then on the old engine can neither produce nor commit (its End
// fails with PRODUCER_FENCED, and its offset commit carries a stale group
// generation); it notices the lost membership and stands down. A standby
// never begins a transaction, so it never fences the active engine.
//
// # Transactions
//
// The engine is a Kafka-transactional group consumer on the consumer
// runtime (internal/consume): the runtime polls, meters the lag and skips
// records redriven for other consumers; the engine's handler restores,
// decides and ticks. The active engine polls up to WithMaxBatch input
// records, decides each in
// order (folding each decision into the state as the decider makes it),
// encodes the decisions, and writes them in one transaction whose offset
// commit covers every record polled (franz-go's GroupTransactSession:
// consume-transform-produce, read_committed, KIP-447 stable offsets). An
// input's decisions are therefore always in the same transaction as its
// offset, and many inputs share one transaction. If the transaction does
// not commit (a rebalance, a produce error), the state — which already
// holds the uncommitted decisions — is dropped and restored from the log,
// and the group rewinds to the committed offsets. Inputs that decide
// nothing (user.active, heartbeats that change nothing: the decider hears
// them without recording them) need no transaction of their own: their
// offsets ride with the next one, or are committed alone after a second. An input that is not a valid event goes to the DLQ in the
// transaction that skips it. A decider failure (a bug) stops the engine
// deciding rather than skip an input; it retries the session with backoff.
//
// # Records and ids
//
// Decisions are CloudEvents in binary mode (see topics.EncodeDecision):
// key and ce_subject the decision's aggregate id, value its JSON, ce_time
// and the record timestamp the decision's time (the input's record
// timestamp, bounded by the engine's clock, or the tick's time), and ce_cause* headers naming the input (event id and
// type, topic/partition/offset, index and count of its decisions). The
// ce_id is derived (DecisionID): a UUIDv7 whose timestamp is the decision's
// time and whose random bits hash the input's position and event id and
// the decision's index. Decisions are a pure function of the state and the
// input, so an input re-decided after a failover, from the same state,
// yields byte-identical records, and projections can dedupe by id.
//
// # Time
//
// An input is decided at its record timestamp, which mailplane's producer
// stamps with its own clock at ingest, never at the producer's ce_time (a
// claim, kept on the event for audit): two scores claimed two hours apart
// in one batch do not satisfy the band dwell. A record stamped ahead of
// the engine's clock (written straight to a topic, or a skewed host) is
// decided at the clock's reading for the batch (domain.TrustedTime), so a
// heartbeat dated 2099 cannot pin a worker's state. The decisions record
// the time they were made at, so restore and replay read no clock; only
// such a future-stamped input, re-decided after an aborted transaction,
// can get another time than the first attempt's (which nobody saw).
//
// # Ticks
//
// Timers (liveness expiry, retries of pending placements, drains, dedicated
// shortfalls) enter the decider as explicit ticks, scheduled every
// WithTickInterval of real time and timed by the injectable clock
// (WithClock). A tick is not an input record: only its decisions are
// written (cause "tick", time = the tick's time), in a transaction of
// their own or with the inputs polled before it. Since the decision log
// is the engine's changelog, a tick that decided nothing leaves no trace
// and needs none. Ticks wait while the inputs are known to be behind
// (a fetched partition below its high watermark), so a tick never expires
// workers whose heartbeats are still waiting to be read. A tick also
// forgets the dead workers last seen longer ago than the retention
// (placement.Config.WorkerRetention, `mailplane engine
// --placement-worker-retention`), so the state, the projection and the
// tick's work stay bounded by the workers heard from within it, however
// many worker ids were ever sent. Every engine of a deployment must share
// the placement configuration and clock discipline; the log stays
// replayable under any configuration, since a worker_forgotten decision
// carries its fact and its fold reads no configuration.
//
// # Restore
//
// On becoming active the engine loads a Checkpoint from its Snapshotter (the
// placement projection, at the decision-log offset it recorded; until that
// exists, LogSnapshotter: the empty state at offset 0), reads the decision
// log read_committed from there to its last stable offset, folding each
// decision with ApplyDecision, and resumes its inputs from the offsets
// committed with the last transaction. The log records a worker's
// transitions, not the heartbeats that changed nothing, so the restored
// state does not know when each worker was last heard: the engine grants
// every worker one liveness window on its clock
// (placement.State.GrantLiveness) before a tick may declare it dead. Because the fence precedes both
// reads, the log's end and the committed offsets belong to the same
// transaction. An engine refuses to decide when the log holds committed
// decisions but the group has no committed offsets (the group was deleted),
// rather than decide every input a second time. A state restored in the
// middle of a liveness hold keeps holding: the hold is folded from the log
// (placement.liveness_held), and the new engine counts as heard only the
// heartbeats it heard itself.
//
// # Metrics
//
// mailplane_placement_decisions_total{kind,reason},
// mailplane_placement_pending, mailplane_placement_promotions_total,
// mailplane_placement_migrations_total,
// mailplane_placement_workers{tier,pool,health},
// mailplane_placement_engine_active,
// mailplane_placement_liveness_holding (1 while the active engine holds
// liveness; alert MailplanePlacementLivenessHeld),
// mailplane_placement_liveness_holds_total, plus transactions, aborts{reason},
// dead letters{code}, restore seconds and restore size. As the
// placement-engine consumer (internal/sla) it reports lag per input
// partition (the runtime's meter, consume.Metered) and
// mailplane_consumer_latency_seconds (input record append
// to the commit of the transaction holding its decisions).
// No mailbox, worker or org id is ever a label.
package engine
