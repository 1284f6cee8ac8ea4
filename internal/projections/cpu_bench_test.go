package projections_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter reads the CPU time of this process and of the Postgres server
// (the postmaster, every process it runs, and those it reaped: backends,
// WAL writer, autovacuum), so a benchmark can set what one phase cost on
// each side against another phase's. Postgres must run on this machine
// (it does for pg-private.sh); ok is false when its /proc entries cannot
// be read.
type cpuMeter struct {
	postmaster int
	tick       float64
}

func newCPUMeter(tb testing.TB, pool *pgxpool.Pool) (*cpuMeter, bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var backend int
	must(tb, pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend))
	f, err := procStat(backend)
	if err != nil {
		tb.Logf("Postgres CPU not measured: %v", err)
		return nil, false
	}
	ppid, _ := strconv.Atoi(f[1])
	// getconf CLK_TCK is 100 on every Linux this runs on.
	return &cpuMeter{postmaster: ppid, tick: 100}, true
}

// procStat returns the fields of /proc/pid/stat after the command name.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

// postgres returns the Postgres server's CPU time so far.
func (m *cpuMeter) postgres(tb testing.TB) time.Duration {
	tb.Helper()
	ents, err := os.ReadDir("/proc")
	must(tb, err)
	var ticks int64
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(pid)
		if err != nil || len(f) < 14 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != m.postmaster && ppid != m.postmaster {
			continue
		}
		// utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 here.
		for _, v := range f[11:15] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
	}
	return time.Duration(float64(ticks) / m.tick * float64(time.Second))
}

// processCPU is this process's CPU time so far (user and system).
func processCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	must(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
