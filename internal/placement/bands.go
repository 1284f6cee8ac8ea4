package placement

import (
	"time"

	"github.com/mailplane/mailplane/domain"
)

// This file is risk and hysteresis: a mailbox's band from its health
// scores, worse at once, better only after BandDwell (see the package
// comment, Risk and Hysteresis), and the move a band change causes.

// BandFromHealth maps a mailbox health state to its band.
func BandFromHealth(h domain.HealthState) domain.RiskPool {
	switch h {
	case domain.HealthWatch, domain.HealthThrottled:
		return domain.RiskRisky
	case domain.HealthQuarantined, domain.HealthBlocked:
		return domain.RiskQuarantine
	default:
		return domain.RiskClean
	}
}

func placementPoolIndex(p domain.RiskPool) int {
	switch p {
	case domain.RiskRisky:
		return 1
	case domain.RiskQuarantine:
		return 2
	default:
		return 0
	}
}

func placementWorse(a, b domain.RiskPool) domain.RiskPool {
	if placementPoolIndex(a) >= placementPoolIndex(b) {
		return a
	}
	return b
}

func (s *State) healthScored(e *domain.MailboxHealthScored, at time.Time) {
	m := s.mailboxes[e.MailboxID]
	if m == nil {
		return
	}
	mapped := BandFromHealth(e.State)
	cur := placementPoolIndex(m.band)
	switch idx := placementPoolIndex(mapped); {
	case idx > cur:
		s.changeBand(m, mapped, e, domain.ReasonBandWorsened, at)
	case idx == cur:
		if m.candidate != "" {
			s.emit(&domain.PlacementBandHeld{
				PlacementMeta: placementMeta(at, domain.ReasonBandRecoveryCancelled),
				MailboxID:     m.id, Band: m.band, Health: e.State,
			})
		}
	default:
		switch {
		case m.candidate == "":
			s.emit(&domain.PlacementBandHeld{
				PlacementMeta: placementMeta(at, domain.ReasonBandRecoveryStarted),
				MailboxID:     m.id, Band: m.band, Candidate: mapped, Since: at, Health: e.State,
			})
		case at.Sub(m.candidateSince) >= s.cfg.BandDwell:
			s.changeBand(m, placementWorse(m.candidate, mapped), e, domain.ReasonBandImproved, at)
		case placementWorse(m.candidate, mapped) != m.candidate:
			s.emit(&domain.PlacementBandHeld{
				PlacementMeta: placementMeta(at, domain.ReasonBandRecoveryUpdated),
				MailboxID:     m.id, Band: m.band, Candidate: mapped, Since: m.candidateSince, Health: e.State,
			})
		}
	}
}

func (s *State) changeBand(m *placementMailbox, to domain.RiskPool, e *domain.MailboxHealthScored, reason domain.PlacementReason, at time.Time) {
	from := m.band
	s.emit(&domain.PlacementBandChanged{
		PlacementMeta: placementMeta(at, reason),
		MailboxID:     m.id, OrgID: m.org.id, FromBand: from, ToBand: to, Health: e.State, Score: e.Score,
		Evidence: e.Evidence,
	})
	switch w := m.worker; {
	case w == nil:
		s.ensureDedicated(m.org, at)
		s.place(m.id, m.org, m.weight, m.band, domain.ReasonRetry, false, at)
	case !s.fits(m, w):
		s.relocateWith(m, moveMust, from, domain.ReasonBandChanged, e.Evidence, at)
	}
}
