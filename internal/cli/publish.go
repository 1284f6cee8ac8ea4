package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
)

const publishUsage = `usage: mailplane publish TYPE [--data JSON] [flags]

TYPE is a full or short event type (mailbox.added, mailplane.mailbox.added.v1).
The event's data is --data, or read from stdin when --data is absent. The same
validation as the ingest API runs first; nothing invalid is produced.
Plain-text mailbox credentials are sealed before they are produced.

Types: `

// Publish is `mailplane publish TYPE`: one event, validated as the ingest
// API validates it, produced to the brokers or sent through --api.
func Publish(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("publish", flag.ExitOnError)
	data := fs.String("data", "", "event data as JSON (default: read stdin)")
	id := fs.String("id", "", "event id (UUIDv7); a new one when empty (reuse one to retry safely)")
	brokers := config.RegisterBrokerFlags(fs)
	source := config.Source.String(fs)
	sealKeys := config.SealKeys.String(fs)
	sealKeyID := config.SealKeyID.String(fs)
	dataDir := config.DataDir.String(fs)
	apiURL := config.APIURL.String(fs)
	tokens := config.APITokens.String(fs)
	fs.Usage = func() {
		short := []string{}
		for _, t := range domain.EventTypes() {
			short = append(short, domain.ShortType(t))
		}
		fmt.Fprintln(fs.Output(), publishUsage+strings.Join(short, ", ")+"\n\nFlags:")
		fs.PrintDefaults()
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs.Usage()
		return errors.New("an event type is required")
	}
	typ, ok := domain.ResolveType(args[0])
	if !ok {
		return domain.Errorf(domain.CodeUnknownType, "unknown event type %q", args[0])
	}
	fs.Parse(args[1:])
	raw := []byte(*data)
	if *data == "" {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20+1))
		if err != nil {
			return err
		}
		raw = b
	}
	if *id == "" {
		*id = domain.NewEventID()
	}
	attrs := domain.Attributes{SpecVersion: domain.SpecVersion, ID: *id, Type: typ, Source: *source}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	if *apiURL != "" {
		return publishHTTPTo(ctx, os.Stdout, *apiURL, firstToken(*tokens), attrs, raw)
	}
	if typ == domain.TypeMailboxOwnerTransferred || typ == domain.TypeOrgOwnerTransferred {
		// Straight to the brokers it would be on the log but not in the
		// claims the API checks (internal/ownership).
		return usageError("an ownership transfer goes through the API: give --api (or use mailplane ownership transfer)")
	}

	keyring, err := sealing.Load(*sealKeys, *sealKeyID, *dataDir, false)
	if err != nil {
		return err
	}
	var seal domain.SealFunc
	if keyring != nil {
		seal = keyring.Seal
	}
	ev, ps := domain.FromAttributes(attrs, raw, time.Now(), seal, nil)
	if len(ps) > 0 {
		printProblems(ps)
		return ps.Err()
	}
	kcfg := brokers.Config("mailplane-publish")
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		return err
	}
	defer kc.Close()
	// FromAttributes sealed (and refused producer-sealed credentials)
	// already: the client only validates and produces.
	rs, err := producer.New(kc, producer.WithSchema(eventschema.Default()), producer.WithNamespace(kcfg.Namespace)).Publish(ctx, ev)
	if err != nil {
		var be *producer.BatchError
		if errors.As(err, &be) {
			printProblems(be.Events[0].Problems)
		}
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(rs[0])
}

func firstToken(s string) string {
	t, _, _ := strings.Cut(s, ",")
	return strings.TrimSpace(t)
}

func printProblems(ps domain.Problems) {
	for _, p := range ps {
		fmt.Fprintf(os.Stderr, "  %s\n", p)
	}
}

// publishHTTPTo sends the event to the ingest API in binary mode and
// writes the API's answer to out.
func publishHTTPTo(ctx context.Context, out io.Writer, base, token string, a domain.Attributes, data []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/v1/events", bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("ce-specversion", a.SpecVersion)
	req.Header.Set("ce-id", a.ID)
	req.Header.Set("ce-type", a.Type)
	req.Header.Set("ce-source", a.Source)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_, _ = out.Write(body)
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("API answered %s", resp.Status)
	}
	return nil
}
