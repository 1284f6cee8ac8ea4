// Package applyonce applies the records of a log to a Postgres projection
// exactly once, and is the one writer of projector positions: the
// projector_offsets rows, the applied_events ids that refuse a copy of an
// event applied before, and the window after which those ids are
// forgotten (Prune, Seek).
//
// Every projector and every rebuild goes through it: the generic projector
// (internal/projections) and a rebuild of its projections
// (internal/rebuild) commit each batch with Run, the placement projection
// (internal/placement/postgres) moves its position with QueueSet, and a
// rebuild's swap exchanges the bookkeeping rows with ExchangeRows. So a
// rebuild replays through exactly the transaction the live projector runs,
// and a conventions test (internal/conventions) keeps every write of
// projector_offsets in this package.
//
// Poison handling is here too (poison.go): which errors say the records
// are at fault (IsPermanent, Refuse), and Isolate, which takes a refused
// batch apart to the record at fault and counts its refusals (Tries). The
// projector and a rebuild call it alike; only their effect for a poison
// record differs (the DLQ, before the transaction that passes it; a
// count).
//
// Two layers keep an event from being applied twice (see the window rule
// in prune.go): the position, moved in the same transaction as the rows
// the records produced, and the event id, recorded in the same
// transaction too.
package applyonce
