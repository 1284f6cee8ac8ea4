// Package conventions has no code: its tests hold the codebase to the
// shape docs/architecture.md describes (short functions, one Kafka kit,
// packages named for what they do).
package conventions
