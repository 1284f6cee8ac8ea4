package projections

import "github.com/mailplane/mailplane/internal/applyonce"

// The projector's own statements, for the benchmark's replay of them
// (bench_test.go), so that it replays what the projector sends.
const (
	AsyncCommitSQL   = applyonce.AsyncCommitSQL
	RecordAppliedSQL = applyonce.RecordAppliedSQL
)
