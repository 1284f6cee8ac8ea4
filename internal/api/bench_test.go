package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/topics"
)

const benchBatch = 500

// benchEvents returns benchBatch structured events cycling through every
// type (mailbox.added with plain credentials, so sealing is measured).
func benchEvents() []map[string]any {
	evs := make([]map[string]any, benchBatch)
	for i := range evs {
		all := allTypes()
		evs[i] = all[i%len(all)]
	}
	return evs
}

// BenchmarkIngestBatch posts batches of 500 events over loopback HTTP to a
// real server backed by an in-process kfake broker (acks=all, idempotent).
func BenchmarkIngestBatch(b *testing.B) {
	for _, par := range []int{1, 4} {
		b.Run(map[int]string{1: "serial", 4: "concurrent4"}[par], func(b *testing.B) {
			e := newEnv(b, envOpts{opts: []Option{WithLogger(slog.New(slog.DiscardHandler))}})
			body := mailplanetest.MustJSON(b, benchEvents())
			url := e.Base + "/v1/events"
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: time.Minute}
			post := func() {
				hr, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				hr.Header.Set("Content-Type", ContentTypeBatch)
				hr.Header.Set("Authorization", "Bearer "+tokenA)
				resp, err := client.Do(hr)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					b.Errorf("status %d", resp.StatusCode)
				}
			}
			post() // warm up connections and metadata
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			n := 0
			if par == 1 {
				for b.Loop() {
					post()
					n++
				}
			} else {
				n = b.N
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						post()
					}
				})
			}
			b.ReportMetric(float64(n*benchBatch)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkRawProduce is the baseline: the same 500 records (sealed and
// encoded once, up front) produced directly with kgo and the same producer
// options, no HTTP, parsing, validation or sealing.
func BenchmarkRawProduce(b *testing.B) {
	for _, par := range []int{1, 4} {
		b.Run(map[int]string{1: "serial", 4: "concurrent4"}[par], func(b *testing.B) {
			kcfg := kafkatest.Config(b, 4)
			kcfg.ClientID = "bench-raw"
			kc, err := kafka.NewProducer(kcfg)
			if err != nil {
				b.Fatal(err)
			}
			defer kc.Close()
			k := newKeyring(b)
			var recs []*kgo.Record
			size := 0
			for _, ev := range benchEvents() {
				parsed, ps := domain.ParseStructured(mailplanetest.MustJSON(b, ev), time.Now(), k.Seal)
				if len(ps) > 0 {
					b.Fatal(ps)
				}
				r, err := topics.Encode(parsed)
				if err != nil {
					b.Fatal(err)
				}
				recs = append(recs, kafkatest.InNamespace(kcfg, r)...)
				size += len(mailplanetest.MustJSON(b, ev))
			}
			produce := func() {
				batch := make([]*kgo.Record, len(recs))
				for i, r := range recs {
					c := *r
					batch[i] = &c
				}
				if err := kc.ProduceSync(context.Background(), batch...).FirstErr(); err != nil {
					b.Error(err)
				}
			}
			produce()
			b.SetBytes(int64(size))
			b.ResetTimer()
			n := 0
			if par == 1 {
				for b.Loop() {
					produce()
					n++
				}
			} else {
				n = b.N
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						produce()
					}
				})
			}
			b.ReportMetric(float64(n*benchBatch)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkIngestType posts batches of 1,000 events of one type over
// loopback HTTP (serial), so the per-type cost shows: mailbox.added (plain
// credentials sealed at ingest) beside user.active on the same path; then
// both again with the schema validator the api role runs
// (internal/roles/wiring.go); then two limits measured in the same run:
// the same mailbox.added body posted to a handler that only reads it
// (HTTP), and the same 1,000 records, sealed and encoded once, produced
// straight with kgo (the broker).
//
//	go test ./internal/api/ -run '^$' -bench IngestType -benchtime 50x
func BenchmarkIngestType(b *testing.B) { benchIngestType(b, 1) }

// BenchmarkIngestTypeConcurrent is BenchmarkIngestType with four clients
// posting at once (and four goroutines producing, for the raw-produce
// limit): one batch at a time leaves a core idle while the other waits on
// the broker's acknowledgement.
//
//	go test ./internal/api/ -run '^$' -bench IngestTypeConcurrent -benchtime 60x
func BenchmarkIngestTypeConcurrent(b *testing.B) { benchIngestType(b, 4) }

func benchIngestType(b *testing.B, clients int) {
	for _, tc := range []struct {
		name   string
		ev     func() map[string]any
		schema bool
	}{
		{"mailbox.added", mailboxAdded, false}, {"user.active", userActive, false},
		{"mailbox.added+schema", mailboxAdded, true}, {"user.active+schema", userActive, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			opts := []Option{WithLogger(slog.New(slog.DiscardHandler)), WithMaxBatch(1000)}
			if tc.schema {
				opts = append(opts, WithSchemaValidator(eventschema.Default()))
			}
			e := newEnv(b, envOpts{opts: opts})
			body := typeBatch(b, tc.ev)
			benchPosts(b, e.Base+"/v1/events", body, len(body.evs), clients)
		})
	}
	b.Run("limit/http-read-only", func(b *testing.B) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusAccepted)
		}))
		defer srv.Close()
		body := typeBatch(b, mailboxAdded)
		benchPosts(b, srv.URL, body, len(body.evs), clients)
	})
	b.Run("limit/raw-produce", func(b *testing.B) {
		e := newEnv(b, envOpts{opts: []Option{WithLogger(slog.New(slog.DiscardHandler))}})
		var recs []*kgo.Record
		for _, ev := range typeBatch(b, mailboxAdded).evs {
			parsed, ps := domain.ParseStructured(mailplanetest.MustJSON(b, ev), time.Now(), e.keyring.Seal)
			if len(ps) > 0 {
				b.Fatal(ps)
			}
			r, err := topics.Encode(parsed)
			if err != nil {
				b.Fatal(err)
			}
			r.Topic = e.ns.Topic(r.Topic)
			recs = append(recs, r)
		}
		produce := func() error {
			batch := make([]*kgo.Record, len(recs))
			for i, r := range recs {
				c := *r
				batch[i] = &c
			}
			return e.kc.ProduceSync(context.Background(), batch...).FirstErr()
		}
		if err := produce(); err != nil {
			b.Fatal(err)
		}
		mailplanetest.RunClients(b, clients, len(recs), produce)
	})
}

type batchBody struct {
	evs []map[string]any
	raw []byte
}

// typeBatch is 1,000 events of one type, each with its own id.
func typeBatch(b *testing.B, ev func() map[string]any) batchBody {
	evs := make([]map[string]any, 1000)
	for i := range evs {
		evs[i] = with(ev(), "id", domain.NewEventID())
	}
	return batchBody{evs: evs, raw: mailplanetest.MustJSON(b, evs)}
}

// benchPosts posts body as a batch from clients clients at once and
// reports events/s and CPU per event.
func benchPosts(b *testing.B, url string, body batchBody, events, clients int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients + 1}, Timeout: time.Minute}
	post := func() error {
		hr, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body.raw))
		hr.Header.Set("Content-Type", ContentTypeBatch)
		hr.Header.Set("Authorization", "Bearer "+tokenA)
		resp, err := client.Do(hr)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	if err := post(); err != nil {
		b.Fatal(err)
	}
	mailplanetest.RunClients(b, clients, events, post)
}
