// Package outbox publishes Kafka records that were written to Postgres in
// the same transaction as the state they describe (the transactional outbox
// pattern). Add queues records inside a caller's transaction; a Relay
// produces committed records in order, then deletes them.
//
// Delivery is at least once: a relay that dies between producing a batch and
// deleting it, or loses its connection while producing, leaves the batch to
// the next relay, which produces it again. Records carry their ce_id, and
// every consumer of mailplane records recognises an event id it has applied,
// so a repeat changes nothing. Only one relay of a database publishes at a
// time (a session advisory lock); the others stand by.
//
// Rows hold the catalog's topic names (topics.MailboxEvents, ...), never a
// namespaced one: the relay publishes them into the namespace of its Kafka
// configuration, so whoever writes to the outbox needs no broker settings.
package outbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/topics"
)

// Channel is the Postgres notification channel Add signals on commit.
const Channel = "mailplane_outbox"

const addSQL = `INSERT INTO event_outbox (topic, key, value, headers)
SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bytea[])`

// Add queues recs in tx. They are published after tx commits, in the order
// given, and never if it rolls back. Only Topic, Key, Value (nil: a
// tombstone) and Headers are kept.
func Add(ctx context.Context, tx pgx.Tx, recs ...*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	n := len(recs)
	names, keys, values, headers := make([]string, n), make([][]byte, n), make([][]byte, n), make([][]byte, n)
	for i, r := range recs {
		if r.Topic == "" {
			return errors.New("outbox: a record without a topic")
		}
		if !topics.IsCatalogName(r.Topic) {
			// A namespaced name would be namespaced again by the relay.
			return fmt.Errorf("outbox: topic %q is not a catalog name", r.Topic)
		}
		names[i], keys[i], values[i] = r.Topic, r.Key, r.Value
		headers[i] = encodeHeaders(r.Headers)
	}
	if _, err := tx.Exec(ctx, addSQL, names, keys, values, headers); err != nil {
		return fmt.Errorf("outbox: add: %w", err)
	}
	// Delivered at commit only, once per transaction however often called.
	if _, err := tx.Exec(ctx, `SELECT pg_notify('`+Channel+`', '')`); err != nil {
		return fmt.Errorf("outbox: notify: %w", err)
	}
	return nil
}

// encodeHeaders is uvarint(count) then, per header, uvarint(len) key
// uvarint(len) value.
func encodeHeaders(hs []kgo.RecordHeader) []byte {
	size := binary.MaxVarintLen64
	for _, h := range hs {
		size += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	b := make([]byte, 0, size)
	b = binary.AppendUvarint(b, uint64(len(hs)))
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

var errHeaders = errors.New("outbox: malformed headers")

func decodeHeaders(b []byte) ([]kgo.RecordHeader, error) {
	if len(b) == 0 {
		return nil, nil
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errHeaders
	}
	b = b[k:]
	hs := make([]kgo.RecordHeader, 0, n)
	next := func() ([]byte, error) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, errHeaders
		}
		v := b[k : k+int(l)]
		b = b[k+int(l):]
		return v, nil
	}
	for range n {
		key, err := next()
		if err != nil {
			return nil, err
		}
		val, err := next()
		if err != nil {
			return nil, err
		}
		hs = append(hs, kgo.RecordHeader{Key: string(key), Value: val})
	}
	if len(b) != 0 {
		return nil, errHeaders
	}
	return hs, nil
}

// Querier is what Pending reads with (a pool, a connection, a transaction).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Pending returns up to limit records waiting in the outbox, oldest first
// (for operators and tests; the relay reads on its own connection), with
// their catalog topic names.
func Pending(ctx context.Context, q Querier, limit int) ([]*kgo.Record, error) {
	rows, err := q.Query(ctx, `SELECT topic, key, value, headers FROM event_outbox ORDER BY seq LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: pending: %w", err)
	}
	var (
		out             []*kgo.Record
		topic           string
		key, value, hdr []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&topic, &key, &value, &hdr}, func() error {
		hs, err := decodeHeaders(hdr)
		if err != nil {
			return err
		}
		out = append(out, &kgo.Record{Topic: topic, Key: clone(key), Value: clone(value), Headers: hs})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: pending: %w", err)
	}
	return out, nil
}
