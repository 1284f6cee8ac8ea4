package imapsync

import (
	"context"
	"errors"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/mailsync"
)

// This file is the warm and cold tiers: a poll of every folder on a
// short-lived connection, every PollWarm or PollCold.

// polled runs the warm or cold poller until ctx is done or the tier
// changes; a change cancels a poll under way.
func (m *mailboxRun) polled(ctx context.Context, tier domain.SyncTier, changed <-chan struct{}) error {
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-changed:
			cancel()
		case <-stop:
		}
	}()
	return m.poller(tctx, tier)
}

// poller syncs every folder every interval on a short-lived connection
// (warm, cold).
func (m *mailboxRun) poller(ctx context.Context, tier domain.SyncTier) error {
	interval := m.job.PollInterval(tier)
	m.mu.Lock()
	last := m.lastPoll
	m.mu.Unlock()
	next := last.Add(interval)
	retries := m.r.retries()
	for {
		if backoff.Sleep(ctx, time.Until(next)) != nil {
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		err := m.pollOnce(ctx)
		if errors.Is(err, mailsync.ErrFenced) {
			return err
		}
		now := time.Now()
		if err == nil {
			// Recorded even when ctx ended meanwhile: the poll's own "no
			// mail" report can change the tier (warm to cold) before its
			// LOGOUT returns, and the next tier's poller must not log in
			// again for a poll that just completed.
			m.mu.Lock()
			m.lastPoll, m.lastSpecial = now, now
			m.mu.Unlock()
			m.lastSpecialFull = now
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			next = time.Now().Add(m.failed(ctx, err, retries, interval))
			continue
		}
		retries.Reset()
		next = now.Add(interval)
	}
}

// pollOnce connects, syncs the folders and disconnects.
func (m *mailboxRun) pollOnce(ctx context.Context) error {
	release, err := m.job.PollSlot(ctx)
	if err != nil {
		return err
	}
	defer release() // after the disconnect below
	c, err := m.connect(ctx)
	if err != nil {
		return err
	}
	defer m.slot.give()
	defer m.disconnect(c)
	folders, err := m.discover(ctx, c)
	if err != nil {
		return err
	}
	for _, f := range folders {
		if err := m.syncHeld(ctx, c, f); err != nil {
			return err
		}
	}
	m.mu.Lock()
	none := m.newest.IsZero()
	m.mu.Unlock()
	if none {
		m.job.ReportNoMail()
	}
	return nil
}
