package mailplanetest

import (
	"bytes"
	"sync"
)

// Output collects what a child process or a logger writes while a test
// reads it: exec's copier goroutine writes, the test reads, so both take
// the lock.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}
