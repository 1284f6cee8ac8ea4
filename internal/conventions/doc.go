// Package conventions has no code: its tests hold the codebase to the
// shape docs/architecture.md describes: short functions, one Kafka kit,
// one consumer runtime (only internal/consume polls and meters), one
// writer of positions (internal/applyonce), one backoff, metrics through
// promreg, packages named for what they do, and documents that match the
// code (the package table, links, cited sections).
package conventions
