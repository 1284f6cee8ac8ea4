package billing

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// Environment variables read by ConfigFromEnv.
const (
	// EnvSecrets holds the webhook endpoint secrets, comma-separated
	// ("whsec_new,whsec_old" during a rotation). Required.
	EnvSecrets = "MAILPLANE_STRIPE_WEBHOOK_SECRETS"
	// EnvPrices maps Stripe prices to plans (see ParsePrices). Required.
	EnvPrices = "MAILPLANE_STRIPE_PRICES"
	// EnvOrgMetadataKey names the subscription metadata key holding the
	// org id (default DefaultOrgMetadataKey).
	EnvOrgMetadataKey = "MAILPLANE_STRIPE_ORG_METADATA_KEY"
	// EnvTolerance is the signature timestamp tolerance, a Go duration
	// (default DefaultTolerance).
	EnvTolerance = "MAILPLANE_STRIPE_TOLERANCE"
)

// Defaults.
const (
	DefaultOrgMetadataKey = "org_id"
	// DefaultTolerance is Stripe's own default.
	DefaultTolerance = 5 * time.Minute
)

// PlanSpec is what a Stripe price (or plan, or product) buys.
type PlanSpec struct {
	Plan             domain.Plan
	DedicatedWorkers int // > 0 for dedicated, 0 otherwise
}

func (p PlanSpec) String() string {
	if p.Plan == domain.PlanDedicated {
		return fmt.Sprintf("%s:%d", p.Plan, p.DedicatedWorkers)
	}
	return string(p.Plan)
}

// Config configures the billing webhook.
type Config struct {
	// Secrets are the endpoint's signing secrets (whsec_...). A signature
	// under any of them is accepted, so a rotation adds the new secret,
	// waits for Stripe to sign with it, and then drops the old one.
	Secrets []string
	// Prices maps a subscription item's price id, its legacy plan id or its
	// product id (looked up in that order) to a plan.
	Prices map[string]PlanSpec
	// OrgMetadataKey is the subscription metadata key holding the org id
	// (default DefaultOrgMetadataKey).
	OrgMetadataKey string
	// Tolerance bounds the distance between the signature's timestamp and
	// the server clock, either way (default DefaultTolerance).
	Tolerance time.Duration
}

func (c Config) withDefaults() Config {
	if c.OrgMetadataKey == "" {
		c.OrgMetadataKey = DefaultOrgMetadataKey
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultTolerance
	}
	return c
}

// Validate reports what is wrong with c (after defaults).
func (c Config) Validate() error {
	var errs []error
	if len(c.Secrets) == 0 {
		errs = append(errs, errors.New("at least one webhook secret is required"))
	}
	for i, s := range c.Secrets {
		if err := checkSecret(s); err != nil {
			errs = append(errs, fmt.Errorf("secret %d: %w", i+1, err))
		}
	}
	if len(c.Prices) == 0 {
		errs = append(errs, errors.New("at least one price mapping is required"))
	}
	for _, id := range slices.Sorted(maps.Keys(c.Prices)) {
		if err := checkPriceID(id); err != nil {
			errs = append(errs, err)
		}
		if err := c.Prices[id].validate(); err != nil {
			errs = append(errs, fmt.Errorf("price %s: %w", id, err))
		}
	}
	if c.OrgMetadataKey == "" || len(c.OrgMetadataKey) > 40 {
		// Stripe metadata keys are at most 40 characters.
		errs = append(errs, errors.New("the org metadata key must be 1-40 characters"))
	}
	if c.Tolerance <= 0 {
		errs = append(errs, errors.New("the signature tolerance must be positive"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("billing: %w", err)
	}
	return nil
}

func (p PlanSpec) validate() error {
	switch p.Plan {
	case domain.PlanFree, domain.PlanPremium:
		if p.DedicatedWorkers != 0 {
			return fmt.Errorf("only the dedicated plan has dedicated workers")
		}
	case domain.PlanDedicated:
		if p.DedicatedWorkers < 1 || p.DedicatedWorkers > domain.MaxDedicatedWorkers {
			return fmt.Errorf("dedicated workers must be between 1 and %d", domain.MaxDedicatedWorkers)
		}
	default:
		return fmt.Errorf("unknown plan %q (free, premium or dedicated[:N])", p.Plan)
	}
	return nil
}

func checkSecret(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == ',' || r == 0x7f }):
		return errors.New("contains white space, a comma or a control character")
	}
	return nil
}

func checkPriceID(id string) error {
	if id == "" || len(id) > 255 || strings.ContainsFunc(id, func(r rune) bool {
		return r <= ' ' || r == ',' || r == '=' || r == 0x7f
	}) {
		return fmt.Errorf("price id %q is empty, too long, or contains white space, ',' or '='", id)
	}
	return nil
}

// ParseSecrets parses a comma-separated list of webhook secrets
// (EnvSecrets). White space around each is dropped; empty elements are
// errors.
func ParseSecrets(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("billing: no webhook secrets")
	}
	var out []string
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if err := checkSecret(part); err != nil {
			return nil, fmt.Errorf("billing: webhook secret %d: %w", i+1, err)
		}
		out = append(out, part)
	}
	return out, nil
}

// ParsePrices parses the compact price map of EnvPrices: comma-separated
// ID=PLAN elements, where ID is a Stripe price id (price_...), a legacy
// plan id, or a product id (prod_...), and PLAN is free, premium,
// dedicated (one dedicated worker) or dedicated:N (N dedicated workers,
// 1 to domain.MaxDedicatedWorkers). White space around elements, ids and
// plans is dropped. Example:
//
//	price_1Pr3m=premium, price_1D3d=dedicated:2, prod_Enterprise=dedicated:5
func ParsePrices(s string) (map[string]PlanSpec, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("billing: no price mappings")
	}
	out := map[string]PlanSpec{}
	for i, part := range strings.Split(s, ",") {
		id, plan, ok := strings.Cut(strings.TrimSpace(part), "=")
		id, plan = strings.TrimSpace(id), strings.TrimSpace(plan)
		if !ok {
			return nil, fmt.Errorf("billing: price mapping %d: want ID=PLAN, got %q", i+1, strings.TrimSpace(part))
		}
		if err := checkPriceID(id); err != nil {
			return nil, fmt.Errorf("billing: price mapping %d: %w", i+1, err)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("billing: price %s is mapped twice", id)
		}
		spec, err := parsePlan(plan)
		if err != nil {
			return nil, fmt.Errorf("billing: price %s: %w", id, err)
		}
		out[id] = spec
	}
	return out, nil
}

func parsePlan(s string) (PlanSpec, error) {
	name, count, hasCount := strings.Cut(s, ":")
	spec := PlanSpec{Plan: domain.Plan(name)}
	switch {
	case spec.Plan == domain.PlanDedicated && !hasCount:
		spec.DedicatedWorkers = 1
	case hasCount:
		n, err := strconv.Atoi(count)
		if err != nil || count == "" || count[0] == '+' || count[0] == '-' {
			return PlanSpec{}, fmt.Errorf("dedicated worker count %q is not a positive integer", count)
		}
		spec.DedicatedWorkers = n
	}
	return spec, spec.validate()
}

// ConfigFromEnv reads the configuration from the environment through
// getenv (os.Getenv): EnvSecrets and EnvPrices (required),
// EnvOrgMetadataKey and EnvTolerance (optional).
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	var err error
	if c.Secrets, err = ParseSecrets(getenv(EnvSecrets)); err != nil {
		return Config{}, fmt.Errorf("%s: %w", EnvSecrets, err)
	}
	if c.Prices, err = ParsePrices(getenv(EnvPrices)); err != nil {
		return Config{}, fmt.Errorf("%s: %w", EnvPrices, err)
	}
	c.OrgMetadataKey = strings.TrimSpace(getenv(EnvOrgMetadataKey))
	if v := strings.TrimSpace(getenv(EnvTolerance)); v != "" {
		if c.Tolerance, err = time.ParseDuration(v); err != nil || c.Tolerance <= 0 {
			return Config{}, fmt.Errorf("%s: %q is not a positive duration", EnvTolerance, v)
		}
	}
	c = c.withDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}
