package imapsync

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/promreg"
)

type metrics struct {
	open     *prometheus.GaugeVec
	connects *prometheus.CounterVec
	failures *prometheus.CounterVec
	idles    prometheus.Counter
	messages *prometheus.CounterVec
	resets   prometheus.Counter

	lag            *prometheus.HistogramVec
	expunged       prometheus.Counter
	warmupObserved *prometheus.CounterVec
	warmupRejected *prometheus.CounterVec
	rotations      prometheus.Counter
	// heldThroughStore counts syncs retried on their connection after a
	// database failure (syncHeld).
	heldThroughStore prometheus.Counter
	// specialChecks counts a hot session's checks of a special-use
	// folder, by outcome (unchanged: a STATUS sufficed; synced).
	specialChecks *prometheus.CounterVec
	// settingUp and setupWaiting: mailboxes holding, and waiting for, one
	// of the runner's setup slots (Config.MaxSettingUp).
	settingUp, setupWaiting prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mailplane_imap_connections_open",
			Help: "IMAP connections open (logged in), by tier."}, []string{"tier"}),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mailplane_imap_connects_total",
			Help: "TCP connections opened to IMAP servers, by tier."}, []string{"tier"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mailplane_imap_failures_total",
			Help: "Failed sync attempts, by category (auth_failed, credentials, credentials_unbound, policy_refused, dns, connect, tls, timeout, protocol, server_oversized, server_slow, store)."}, []string{"kind"}),
		idles: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_imap_idle_starts_total",
			Help: "IDLE commands issued (starts and restarts)."}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mailplane_imap_messages_synced_total",
			Help: "Message rows written, by folder role."}, []string{"role"}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_imap_uidvalidity_resets_total",
			Help: "Folders resynced after a UIDVALIDITY change."}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mailplane_imap_sync_lag_seconds",
			Help:    "From a new message's arrival (INTERNALDATE, whole seconds) to its row being stored, by tier; incremental syncs only.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200}}, []string{"tier"}),
		expunged: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_imap_messages_expunged_total",
			Help: "Message rows deleted because the server no longer has the message (expunged or moved away)."}),
		warmupObserved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mailplane_imap_warmup_observed_total",
			Help: "Warmup messages found for the first time and reported, by folder role (inbox, junk)."}, []string{"role"}),
		warmupRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mailplane_imap_warmup_rejected_total",
			Help: "Warmup headers ignored, by reason (malformed; with a warmup key: unsigned, forged)."}, []string{"reason"}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_imap_oauth_rotations_total",
			Help: "Refresh tokens an OAuth provider rotated on use, sealed and recorded (credentials_rotated)."}),
		heldThroughStore: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_imap_store_retries_held_total",
			Help: "Folder syncs retried on the same IMAP connection after a database failure, instead of reconnecting."}),
		specialChecks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mailplane_imap_hot_special_checks_total",
			Help: "Special-use folder checks of hot mailboxes between IDLE rounds, by outcome (unchanged: STATUS matched the last sync; synced: selected and synced)."}, []string{"outcome"}),
		settingUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mailplane_imap_setting_up_mailboxes",
			Help: "Mailboxes logged in and setting up (syncing until the first IDLE; a warm or cold poll until its end), at most the runner's bound."}),
		setupWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mailplane_imap_setup_waiting_mailboxes",
			Help: "Logged-in mailboxes waiting for a setup slot (the runner's bound on setups in flight)."}),
	}
	if reg != nil {
		m.open = promreg.MustRegister(reg, m.open)
		m.connects = promreg.MustRegister(reg, m.connects)
		m.failures = promreg.MustRegister(reg, m.failures)
		m.idles = promreg.MustRegister(reg, m.idles)
		m.messages = promreg.MustRegister(reg, m.messages)
		m.resets = promreg.MustRegister(reg, m.resets)
		m.lag = promreg.MustRegister(reg, m.lag)
		m.expunged = promreg.MustRegister(reg, m.expunged)
		m.warmupObserved = promreg.MustRegister(reg, m.warmupObserved)
		m.warmupRejected = promreg.MustRegister(reg, m.warmupRejected)
		m.rotations = promreg.MustRegister(reg, m.rotations)
		m.heldThroughStore = promreg.MustRegister(reg, m.heldThroughStore)
		m.specialChecks = promreg.MustRegister(reg, m.specialChecks)
		m.settingUp = promreg.MustRegister(reg, m.settingUp)
		m.setupWaiting = promreg.MustRegister(reg, m.setupWaiting)
	}
	return m
}
