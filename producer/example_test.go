package producer_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// exampleBroker starts an in-process Kafka broker (kfake) with mailplane's
// topics, and a client of it as a program that publishes would build one:
// franz-go's defaults are idempotent writes acknowledged by every in-sync
// replica (acks=all). A deployment's brokers are its
// MAILPLANE_KAFKA_BROKERS; its topics are created by `mailplane topics apply`.
func exampleBroker() (kc *kgo.Client, stop func()) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		panic(err)
	}
	kc, err = kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topics.Apply(ctx, kc, topics.Catalog(topics.Config{StatePartitions: 1})); err != nil {
		panic(err)
	}
	return kc, func() { kc.Close(); cluster.Close() }
}

// Publishing one event: the typed function validates it before anything
// is produced and returns where it landed once every in-sync replica has
// it. An invalid event is refused with a stable code, and nothing is
// produced.
func ExampleClient_PublishUserActive() {
	kc, stop := exampleBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c := producer.New(kc, producer.WithSource("/product/login"))
	r, err := c.PublishUserActive(ctx, domain.UserActive{
		UserID: "0190a5b2-4c5e-7b1a-9c3d-00000000b001", Source: domain.ActivityLogin,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Type, "landed on", r.Topic, "at offset", r.Offset)

	// Dedicated capacity is the control plane's to allocate, never a
	// worker's to claim.
	_, err = c.PublishWorkerHeartbeat(ctx, domain.WorkerHeartbeat{
		WorkerID: "0190a5b2-4c5e-7b1a-9c3d-00000000c001", Tier: domain.TierDedicated,
		Egress: domain.EgressColdSMTP, Address: "10.0.0.7:2525",
	})
	fmt.Println("refused:", domain.ErrorCode(err))
	// Output:
	// mailplane.user.active.v1 landed on mailplane.user.events.v1 at offset 0
	// refused: tier_not_allowed
}

// Publishing a batch: every event is validated first and, only if all are
// valid, all are produced; receipts come in the order of the events. One
// invalid event refuses the whole batch with a *producer.BatchError
// listing every problem of every event, and nothing is produced.
func ExampleClient_Publish() {
	kc, stop := exampleBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c := producer.New(kc, producer.WithSource("/deliverability"))
	mailbox := "0190a5b2-4c5e-7b1a-9c3d-00000000a001"
	receipts, err := c.Publish(ctx,
		c.NewEvent(&domain.MailboxHealthScored{MailboxID: mailbox, State: domain.HealthWatch, Score: 55.5, Reason: "bounce rate"}),
		c.NewEvent(&domain.UserActive{UserID: "0190a5b2-4c5e-7b1a-9c3d-00000000b001", Source: domain.ActivityLogin}),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range receipts {
		fmt.Println(r.Type, r.Topic, r.Offset)
	}

	_, err = c.Publish(ctx,
		c.NewEvent(&domain.MailboxRemoved{MailboxID: mailbox, Reason: "the user deleted it"}),
		c.NewEvent(&domain.MailboxHealthScored{MailboxID: "ada", State: "sunny", Score: 55.5}),
	)
	var be *producer.BatchError
	if errors.As(err, &be) {
		for _, ev := range be.Events {
			for _, p := range ev.Problems {
				fmt.Printf("event %d: %s: %s\n", ev.Index, p.Field, p.Code)
			}
		}
	}
	// Output:
	// mailplane.mailbox.health_scored.v1 mailplane.mailbox.events.v1 0
	// mailplane.user.active.v1 mailplane.user.events.v1 0
	// event 1: data.mailbox_id: invalid
	// event 1: data.state: invalid
	// event 1: data.reason: required
}

// Importing a file of CloudEvents (JSON lines, as `mailplane import` and
// the ingest API read them): each line is checked by domain.ParseChecked,
// its plain credentials sealed as it is checked; PrepareChecked encodes
// the checked events without validating them again, and ProduceRecords
// produces them. A refused line is reported by its number and problems;
// the rest are produced. No password reaches the log: the records carry
// the sealed credentials only.
func ExampleClient_PrepareChecked() {
	kc, stop := exampleBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The deployment's sealing keys are MAILPLANE_SEALING_KEYS.
	keyring, err := sealing.ParseKeys("k1:"+base64.StdEncoding.EncodeToString(make([]byte, sealing.KeySize)), "")
	if err != nil {
		fmt.Println(err)
		return
	}
	c := producer.New(kc, producer.WithSealer(keyring))

	file := `{"specversion":"1.0","id":"crm-1","type":"mailplane.mailbox.added.v1","source":"/crm/import","data":{"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000a001","org_id":"0190a5b2-4c5e-7b1a-9c3d-00000000d001","user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","address":"ada@example.com","provider":"smtp_imap","warmup_enabled":true,"imap":{"host":"imap.example.com","port":993,"tls":"implicit","username":"ada@example.com"},"credentials":{"password":"correct horse battery staple"}}}
{"specversion":"1.0","id":"crm-2","type":"mailplane.mailbox.added.v1","source":"/crm/import","data":{"mailbox_id":"0190a5b2-4c5e-7b1a-9c3d-00000000a002","org_id":"0190a5b2-4c5e-7b1a-9c3d-00000000d001","user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","address":"bob@example.com","provider":"smtp_imap","imap":{"host":"imap.example.com","port":993,"tls":"implicit","username":"bob@example.com"}}}
`
	var checked []domain.Checked
	sc := bufio.NewScanner(strings.NewReader(file))
	for line := 1; sc.Scan(); line++ {
		chk, ps := domain.ParseChecked(sc.Bytes(), time.Now(), keyring.Seal)
		if len(ps) > 0 {
			fmt.Printf("line %d refused: %s\n", line, ps)
			continue
		}
		checked = append(checked, chk)
	}
	recs, err := c.PrepareChecked(checked)
	if err != nil {
		fmt.Println(err)
		return
	}
	events := make([]domain.Event, len(checked))
	for i, chk := range checked {
		events[i] = chk.Event()
	}
	receipts, err := c.ProduceRecords(ctx, events, recs)
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, r := range receipts {
		fmt.Println(r.ID, r.Topic, "password in the record:", strings.Contains(string(recs[i].Value), "correct horse"))
	}
	// Output:
	// line 2 refused: data.credentials: credentials_required: a mailbox.added needs its credentials (password or oauth_refresh_token) for the endpoint it names
	// crm-1 mailplane.mailbox.events.v1 password in the record: false
}
