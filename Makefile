# mailplane — `make` lists the targets.
SHELL := bash
.DEFAULT_GOAL := help
GO ?= go
PKGS := ./...
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHTIME ?= 3s
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/mailplane/mailplane/internal/buildinfo.version=$(VERSION)

.PHONY: help
help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: run
run: ## run mailplane on its embedded defaults (mailplane dev)
	$(GO) run ./cmd/mailplane dev

.PHONY: build
build: ## build bin/mailplane, its version stamped (VERSION, default git describe)
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/mailplane ./cmd/mailplane

.PHONY: test
test: ## everything CI runs: vet, then every test (real Postgres, kfake, kcat, Dovecot, promtool); installs what is missing when root
	@bash scripts/deps.sh
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout 15m $(PKGS)

.PHONY: test-broker
test-broker: ## the suites against the real broker in MAILPLANE_TEST_BROKERS, in parallel, each test in a namespace of its own
	@test -n "$$MAILPLANE_TEST_BROKERS" || { echo "set MAILPLANE_TEST_BROKERS (e.g. 127.0.0.1:19092 with docker compose up redpanda)"; exit 1; }
	$(GO) test -count=1 -timeout 30m $(PKGS)

.PHONY: race
race: ## the tests under the race detector
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

.PHONY: bench
bench: ## the benchmarks recorded in BENCHMARKS.md (a few minutes; loopback only)
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./producer/ ./internal/api/
	$(GO) test -run '^$$' -bench 'Projection$$' -benchtime 100000x ./internal/projections/
	$(GO) test -run '^$$' -bench 'PublishToProjected' -benchtime 20000x ./internal/projections/
	$(GO) test -run '^$$' -bench 'Placement' -benchtime 2s ./internal/placement/
	$(GO) test -run '^$$' -bench 'EngineLatency' -benchtime 10000x ./internal/placement/engine/
	$(GO) test -run '^$$' -bench 'EngineThroughput|EngineRestore' -benchtime 100000x ./internal/placement/engine/
	$(GO) test -run '^$$' -bench 'ReplayPlacement' -benchtime 1000000x ./internal/rebuild/
	$(GO) test -run '^$$' -bench 'EventToProjectedRow' -benchtime 10000x ./internal/rebuild/
	$(GO) test -run '^$$' -bench 'IMAPHot|IMAPWarm' -benchtime 1x -timeout 30m ./internal/imapsync/

.PHONY: fuzz
fuzz: ## fuzz the record decoder, the schema/Go agreement and text hygiene, a minute each
	$(GO) test ./topics -run '^$$' -fuzz FuzzDecode -fuzztime 60s
	$(GO) test ./internal/eventschema -run '^$$' -fuzz FuzzSchemaAgreement -fuzztime 60s
	$(GO) test ./internal/placement -run '^$$' -fuzz FuzzDecisionsStorable -fuzztime 60s
	$(GO) test ./domain -run '^$$' -fuzz FuzzCleanText -fuzztime 60s

.PHONY: lint
lint: ## go vet and staticcheck
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

.PHONY: console-screenshots
console-screenshots: ## regenerate docs/console/*.png: the console's Chromium test against mailplane dev
	MAILPLANE_CONSOLE_SCREENSHOTS=1 $(GO) test ./internal/console -run TestConsoleInChromium -count=1

.PHONY: docs-config
docs-config: ## rewrite docs/configuration.md's reference table from `mailplane help config`
	{ sed '/^| flag | environment | default | meaning |$$/,$$d' docs/configuration.md; $(GO) run ./cmd/mailplane help config; } > docs/configuration.md.tmp
	mv docs/configuration.md.tmp docs/configuration.md

.PHONY: deps
deps: ## install the Debian packages the tests need (root): PostgreSQL, kcat, Dovecot, docker-compose, prometheus (promtool), chromium
	bash scripts/deps.sh

.PHONY: topics
topics: ## apply the topic catalog to MAILPLANE_BROKERS
	$(GO) run ./cmd/mailplane topics apply
