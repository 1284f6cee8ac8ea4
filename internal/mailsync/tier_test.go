package mailsync

import (
	"context"
	"testing"
	"time"
)

func TestHostPacer(t *testing.T) {
	t.Parallel()
	p := newHostPacer(20, 2)
	ctx := context.Background()
	start := time.Now()
	for range 6 { // 2 from the burst, then 4 at 20/s: about 200ms
		if err := p.wait(ctx, "imap.a.example"); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Errorf("6 connections at 20/s with burst 2 took %s, want about 200ms", d)
	}
	// Another host has its own bucket: with host A's burst spent at one
	// connection per 2 s, a shared bucket would make host B wait 2 s per
	// connection; its own bucket lets both through at once.
	slow := newHostPacer(0.5, 2)
	for range 2 {
		if err := slow.wait(ctx, "imap.a.example"); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	for range 2 {
		if err := slow.wait(ctx, "IMAP.B.example"); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d >= 1500*time.Millisecond {
		t.Errorf("a second host waited %s: it shares the first host's bucket", d)
	}
	// A canceled wait returns at once with the context's error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.wait(cctx, "imap.a.example"); err == nil {
		t.Error("canceled wait returned nil")
	}
}
