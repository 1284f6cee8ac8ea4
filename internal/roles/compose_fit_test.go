package roles_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/mailplane/mailplane/internal/roles"
	"github.com/mailplane/mailplane/topics"
)

// Redpanda reserves topic_memory_per_partition (4 MiB) of --memory for every
// partition replica and refuses to create partitions past memory ÷ that.
// Besides the catalog it keeps its own: __consumer_offsets
// (group_topic_partitions, 16), the transaction coordinator
// (transaction_coordinator_partitions, 50), the id allocator (1) and the
// schema registry's _schemas (1).
const (
	redpandaMemoryPerPartition = 4 << 20
	redpandaOwnPartitions      = 16 + 50 + 1 + 1
)

type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Deploy      struct {
			Replicas *int `yaml:"replicas"`
		} `yaml:"deploy"`
	} `yaml:"services"`
}

// TestComposeFitsTheBroker: the topic catalog compose creates fits the
// memory compose gives Redpanda, and every mailplane service (the topics job
// included) sees the same brokers and state partitions, so the roles read
// the topics the job created.
func TestComposeFitsTheBroker(t *testing.T) {
	t.Parallel()
	cf := resolvedCompose(t)

	memory := int64(0)
	for _, arg := range cf.Services["redpanda"].Command {
		if v, ok := strings.CutPrefix(arg, "--memory="); ok {
			memory = parseSize(t, v)
		}
	}
	if memory == 0 {
		t.Fatal("redpanda runs without --memory")
	}

	topicsEnv := cf.Services["topics"].Environment
	n, err := strconv.Atoi(topicsEnv["MAILPLANE_STATE_PARTITIONS"])
	if err != nil {
		t.Fatalf("the topics job's MAILPLANE_STATE_PARTITIONS %q: %v", topicsEnv["MAILPLANE_STATE_PARTITIONS"], err)
	}
	for name, s := range cf.Services {
		if s.Image != cf.Services["topics"].Image {
			continue
		}
		for _, k := range []string{"MAILPLANE_STATE_PARTITIONS", "MAILPLANE_BROKERS"} {
			if s.Environment[k] != topicsEnv[k] {
				t.Errorf("service %s has %s=%q, the topics job %q", name, k, s.Environment[k], topicsEnv[k])
			}
		}
	}

	partitions := redpandaOwnPartitions
	for _, spec := range topics.Catalog(topics.Config{StatePartitions: int32(n)}) {
		partitions += int(spec.Partitions)
	}
	limit := memory / redpandaMemoryPerPartition
	t.Logf("%d partitions (state partitions %d) of the %d that --memory=%d MiB allows", partitions, n, limit, memory>>20)
	if int64(partitions) > limit {
		t.Errorf("the catalog needs %d partitions, Redpanda with %d MiB takes %d: raise --memory or lower MAILPLANE_STATE_PARTITIONS", partitions, memory>>20, limit)
	}
}

// TestComposeFitsPostgres: the connections every mailplane process may
// open (its pools, sized by the role it runs and compose's environment,
// times its replicas) fit compose's Postgres max_connections, with room
// for the superuser's reserve and an operator's commands.
func TestComposeFitsPostgres(t *testing.T) {
	t.Parallel()
	cf := resolvedCompose(t)
	var err error
	maxConns := 100 // Postgres's default
	for i, arg := range cf.Services["postgres"].Command {
		if v, ok := strings.CutPrefix(arg, "max_connections="); ok && i > 0 && cf.Services["postgres"].Command[i-1] == "-c" {
			if maxConns, err = strconv.Atoi(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	const reserved, operator = 3, 10 // superuser_reserved_connections; psql, rebuild, the CLI
	total := 0
	for name, s := range cf.Services {
		// The one-shot jobs (topics, schemas) open no Postgres pool.
		if s.Image != cf.Services["topics"].Image || len(s.Command) == 0 || name == "topics" || name == "schemas" {
			continue
		}
		sz, err := roles.PoolSizesFor(s.Command[0], s.Environment)
		if err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		replicas := 1
		if s.Deploy.Replicas != nil {
			replicas = *s.Deploy.Replicas
		}
		total += replicas * int(sz.Serve+sz.Runners+sz.Work)
	}
	t.Logf("mailplane may open %d Postgres connections; max_connections %d", total, maxConns)
	if total+reserved+operator > maxConns {
		t.Errorf("mailplane may open %d connections, +%d reserved +%d for an operator: over compose's max_connections %d (raise it, or lower MAILPLANE_PG_*_CONNS)",
			total, reserved, operator, maxConns)
	}
}

// resolvedCompose is docker-compose.yml as `docker-compose config`
// resolves it, with every required secret set.
func resolvedCompose(t *testing.T) composeFile {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(tokens, []byte("# callers\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := composeConfig(t, map[string]string{
		"POSTGRES_PASSWORD": "p", "MAILPLANE_SEAL_KEYS": "k1:eA==", "MAILPLANE_API_TOKENS_FILE": tokens,
		"MAILPLANE_WORKER_FLEET_SECRET": "f", "MAILPLANE_WARMUP_KEY": "w",
	})
	if err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
	var cf composeFile
	if err := yaml.Unmarshal([]byte(out), &cf); err != nil {
		t.Fatalf("docker-compose config printed no compose file: %v\n%s", err, out)
	}
	return cf
}

// parseSize reads Redpanda's --memory value: a number with a K, M or G
// suffix (binary multiples).
func parseSize(t *testing.T, v string) int64 {
	t.Helper()
	mult := int64(1)
	switch {
	case strings.HasSuffix(v, "G"):
		mult, v = 1<<30, strings.TrimSuffix(v, "G")
	case strings.HasSuffix(v, "M"):
		mult, v = 1<<20, strings.TrimSuffix(v, "M")
	case strings.HasSuffix(v, "K"):
		mult, v = 1<<10, strings.TrimSuffix(v, "K")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("--memory=%s: %v", v, err)
	}
	return n * mult
}
