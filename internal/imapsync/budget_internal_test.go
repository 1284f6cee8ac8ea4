package imapsync

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestDeadlineConnTimeBudget: an operation's budget counts the time armed
// (waiting on the server), not the time held (waiting on our database),
// and once spent, arming gives no time at all, however often it is done.
func TestDeadlineConnTimeBudget(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer server.Close()
	c := &deadlineConn{Conn: client}
	defer c.Close()
	c.startOp(300 * time.Millisecond)
	c.arm(time.Hour)
	time.Sleep(100 * time.Millisecond)
	c.hold() // ~200 ms left
	time.Sleep(400 * time.Millisecond)
	if c.outOfTime() {
		t.Fatalf("held time was charged: %s left", c.left)
	}
	start := time.Now()
	c.arm(time.Hour) // cut to what is left
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read: %v, want a timeout", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("the read waited %s: the per-command deadline, not the operation's", waited)
	}
	if !c.outOfTime() {
		t.Fatalf("budget not spent after the timeout: %s left", c.left)
	}
	c.arm(time.Hour) // re-arming does not re-open the budget
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read after the budget: %v, want a timeout", err)
	}
	// A new operation (the next poll or hot round) has its own budget;
	// an IDLE (endOp) has none.
	c.startOp(time.Minute)
	if c.outOfTime() {
		t.Fatal("a new operation starts out of time")
	}
	c.endOp()
	if c.outOfTime() {
		t.Fatal("outside an operation, no time budget applies")
	}
}

// TestDeadlineConnByteBudgets: past the window (reset by each arm) or the
// operation's bytes, the read fails and the connection is closed; within
// them, any number of windows pass.
func TestDeadlineConnByteBudgets(t *testing.T) {
	t.Parallel()
	feed := func(c net.Conn, n int) {
		go func() { _, _ = c.Write(make([]byte, n)) }()
	}
	read := func(c *deadlineConn, n int) error {
		_, err := io.ReadFull(c, make([]byte, n))
		return err
	}

	client, server := net.Pipe()
	c := &deadlineConn{Conn: client, maxWindow: 100, maxOp: 250}
	c.startOp(time.Minute)
	for range 2 {
		c.arm(time.Minute)
		feed(server, 100)
		if err := read(c, 100); err != nil {
			t.Fatalf("within the window: %v", err)
		}
	}
	c.arm(time.Minute)
	feed(server, 60)
	if err := read(c, 60); !errors.Is(err, errOversized) || !c.over.Load() {
		t.Fatalf("past the operation's 250 bytes: %v (over %v)", err, c.over.Load())
	}
	server.Close()

	// A command with a window of its own (a UID SEARCH sized to the rows
	// stored) may read past maxWindow, up to its bound; the next arm
	// restores maxWindow.
	client, server = net.Pipe()
	defer server.Close()
	c = &deadlineConn{Conn: client, maxWindow: 100, maxOp: 1000}
	c.startOp(time.Minute)
	c.armWindow(time.Minute, 300)
	feed(server, 300)
	if err := read(c, 300); err != nil {
		t.Fatalf("within the command's own window: %v", err)
	}
	c.arm(time.Minute)
	feed(server, 101)
	if err := read(c, 101); !errors.Is(err, errOversized) {
		t.Fatalf("past the window: %v", err)
	}
	if _, err := server.Write([]byte{1}); err == nil {
		t.Fatal("the connection is still open past the budget")
	}
}
