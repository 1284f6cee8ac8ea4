package mailplanetest

import (
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// CPUTime reads the process's CPU time (user and system). On a shared
// machine, CPU per event is the figure contention disturbs least: the
// client, the server and an in-process broker all count.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RunClients runs b.N calls of call, each carrying events events, from
// clients goroutines at once, and reports events/s and CPU per event
// (CPUTime). The first error fails the benchmark.
func RunClients(b *testing.B, clients, events int, call func() error) {
	b.Helper()
	var next atomic.Int64
	errs := make(chan error, clients)
	b.ResetTimer()
	cpu := CPUTime()
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := call(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed, used := time.Since(start), CPUTime()-cpu
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N*events)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(used.Microseconds())/float64(b.N*events), "cpu-us/event")
}
