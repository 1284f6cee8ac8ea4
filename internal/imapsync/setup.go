package imapsync

import "context"

// setupSlot is a run's hold on one of the runner's setup slots
// (Config.MaxSettingUp) and on its host's share of them
// (Config.SetupSharePerHost): taken once logged in, given back at the
// first IDLE (hot) or at the end of the poll (warm, cold), so that a
// worker taking over thousands of mailboxes ramps through the bound. The
// run's goroutine only.
type setupSlot struct {
	r       *Runner
	host    string // the IMAP host whose share it takes
	held    bool
	release func() // gives back the host's share of the slot held
}

// take waits for a slot, first one of the host's share, then one of the
// runner's (ctx done: its error). Holding one already, it returns at once.
func (s *setupSlot) take(ctx context.Context) error {
	if s.held {
		return nil
	}
	s.r.metrics.setupWaiting.Inc()
	release, err := s.r.hostSetups.Acquire(ctx, s.host)
	if err == nil {
		select {
		case s.r.setup <- struct{}{}:
		case <-ctx.Done():
			release()
			err = ctx.Err()
		}
	}
	s.r.metrics.setupWaiting.Dec()
	if err != nil {
		return err
	}
	s.held, s.release = true, release
	s.r.metrics.settingUp.Inc()
	return nil
}

// give gives the slot back, if held.
func (s *setupSlot) give() {
	if !s.held {
		return
	}
	s.held = false
	<-s.r.setup
	s.release()
	s.release = nil
	s.r.metrics.settingUp.Dec()
}
