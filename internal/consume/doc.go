// Package consume is the one runtime every Kafka consumer of mailplane runs
// on (in the spirit of watermill's router, on franz-go). A consumer is a
// declaration and a handler, nothing else:
//
//	c, err := consume.New(kcfg, "name", source, handler, options...)
//	...
//	err = c.Run(ctx) // until ctx is done or the handler fails
//
// The runtime owns what every hand-written poll loop used to repeat: the
// poll (with a wait the consumer may shorten, and Wake to end it early),
// the allow-rebalance gate of a group that blocks rebalances while a batch
// is handled, the partition callbacks, pause and resume, fetch errors, and
// the shutdown (leaving the group within a bound, kafka.CloseWithin). The
// policies are options installed as middleware around the handler: the
// consumer's lag meter (Metered at the fetch's positions, or
// MeteredByEffect at those its effect reports with Consumer.Position;
// internal/sla), the skip of records
// redriven from the dead-letter topic for another consumer (SkipRedriven),
// retry with internal/backoff (Retry), and any Middleware of the consumer's
// own (Use). The effect (an in-memory state, a Postgres transaction with
// positions, a Kafka transaction with the input offsets) stays in the
// handler, with the code that owns it; so does poison → DLQ.
//
// # Sources
//
// A consumer reads from one of four sources:
//
//   - Group: a consumer group (kafka.ConsumerOptions: cooperative-sticky,
//     read_committed, manual commits) with kgo.BlockRebalanceOnPoll: no
//     rebalance callback runs while a batch is handled; the runtime allows
//     rebalances after each handler call. Hooks: OnAssigned, OnRevoked,
//     OnLost (the meter forgets revoked and lost partitions itself). The
//     sync worker (internal/mailsync) and the projectors run so.
//   - TransactGroup: a kgo.GroupTransactSession, for an effect that is a
//     Kafka transaction carrying the input offsets. The handler calls
//     Batch.Transact (Begin, the handler's produces, End with a commit that
//     includes the offsets polled): when the transaction aborts (the
//     handler's error, a rebalance meanwhile, a failed commit), the session
//     rewinds to the last committed offsets and the records are polled
//     again. Session() gives the session (for ProducerID when fencing in
//     OnAssigned, as the placement engine does). Do not combine it with
//     Retry: a failed transaction is retried by polling again.
//   - Partitions: partitions assigned directly, at offsets the consumer
//     chose (a checkpoint read from Postgres), without a group (the
//     placement projection: one partition, a Postgres advisory lock picks
//     the one leader).
//   - Topics: every partition of some topics, without a group, from a
//     reset offset (a timestamp: the sync worker's reader of user events).
//
// A consumer whose start position lives in Postgres (the projectors) adds
// kgo.AdjustFetchOffsetsFn through WithKgoOptions; any other franz-go
// option goes there too (client settings only: the partition callbacks are
// the runtime's, declared with OnAssigned, OnRevoked and OnLost).
//
// # The handler
//
// The Handler is called after every poll, also one that returned no
// records (the wait ran out, or Wake ended it): ticks and housekeeping run
// there. A Batch holds the records polled in fetch order (less those a
// policy skipped), the fetches (Batch.End: a partition's end as fetched,
// its last stable offset when reading committed) and the poll's time on
// the consumer's clock (WithClock). A handler's error ends Run, which
// leaves the group and returns it (a consumer that should rejoin loops
// around New and Run, waiting with internal/backoff); with Retry, the
// handler is retried with backoff first.
//
// # Declaring each kind of consumer
//
//   - In-memory effect from a timestamp (sync worker's user events):
//     Topics(kgo.NewOffset().AfterMilli(since), topic), Metered, SkipRedriven.
//   - Group with an in-memory effect (the sync worker): Group, OnAssigned /
//     OnRevoked / OnLost, WithPollWait (housekeeping runs at least that
//     often), WithMaxRecords, BeforeLeave (stop runners before leaving),
//     LeaveWithin, MeteredByEffect (the live set reports its position);
//     housekeeping calls Wake.
//   - Postgres projection in a group (internal/projections): Group,
//     OnAssigned / OnRevoked / OnLost, WithKgoOptions(AdjustFetchOffsetsFn,
//     OnPartitionsCallbackBlocked), WithWait (zero while records wait to be
//     applied), WithMaxRecordsFunc (the batch adapts), Pause / Resume for
//     backpressure, MeteredByEffect (positions from Postgres); lanes take
//     what is buffered with PollBuffered within a handler call.
//   - Postgres projection of one partition (placement projection):
//     Partitions at the checkpoint, OnFetchError returning the error (a
//     fetch error ends the leadership), MeteredByEffect (the checkpoint),
//     Retry (a batch that fails is retried in the leadership; a moved
//     checkpoint is backoff.Permanent and ends it).
//   - Kafka-transactional group (placement engine, mailbox.state
//     processor): TransactGroup, OnAssigned (fence: Session().Client()
//     ProducerID), OnRevoked / OnLost (stand down), WithWait (until the
//     next tick), Metered, SkipRedriven, and a handler that calls
//     Batch.Transact, or Batch.TransactTry when it asks for the abort
//     itself (a produce failed) and counts that apart from a failed end.
//
// The runtime is the only code that polls: a conventions test keeps
// PollFetches and PollRecords to this package (and the one-shot reads of
// internal/kafka/read.go and the test helpers of internal/kafkatest).
package consume
