package domain

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// A fast path for lenient DecodeData, which runs on every record a consumer
// reads. It decodes only the plain form producers write (exactly named
// members, each at most once; strings without escapes; integers without
// fraction or exponent; no nulls; no unknown members; no plain-text
// credentials) and gives up on anything else, leaving that to encoding/json.
// Whatever it accepts, encoding/json decodes to the very same value
// (TestFastDecodeAgrees and FuzzFastDecode hold it to that), so
// DecodeData's behaviour does not depend on which path ran.

// decodeFast decodes raw into the zero value d. false: use encoding/json
// (d then holds anything). Each type's decodeFast fills its zero receiver,
// or reports false. (A type switch, not an interface, keeps the scanner on
// the stack.)
func decodeFast(d Data, raw []byte) bool {
	return decodeWhole(d, raw, false)
}

// decodeFastStrict is decodeFast for strict (ingest) decoding: on top of
// the plain form it takes plain credentials (mailbox.added from
// producers), and it gives up on what strictShape would refuse or rewrite
// (a timestamp outside RFC 3339's own grammar, a float that rounds onto an
// integer it is not), leaving those to the strict path proper. Whatever it
// accepts, the strict path decodes to the same value with no problem
// (TestStrictFastAgrees, FuzzStrictFastDecode).
func decodeFastStrict(d Data, raw []byte) bool {
	return decodeWhole(d, raw, true)
}

// decodeWhole decodes all of raw, nothing after the value but whitespace.
func decodeWhole(d Data, raw []byte, strict bool) bool {
	s := scanner{b: raw, strict: strict}
	if !s.data(d) {
		return false
	}
	s.ws()
	return s.i == len(s.b)
}

// data decodes one value at the scanner's position into the zero value d.
func (s *scanner) data(d Data) bool {
	var ok bool
	switch d := d.(type) {
	case *MailboxAdded:
		ok = d.decodeFast(s)
	case *MailboxRemoved:
		ok = d.decodeFast(s)
	case *MailboxHealthScored:
		ok = d.decodeFast(s)
	case *MailboxDisabled:
		ok = d.decodeFast(s)
	case *CredentialsRotated:
		ok = d.decodeFast(s)
	case *WarmupObserved:
		ok = d.decodeFast(s)
	case *OrgPlanChanged:
		ok = d.decodeFast(s)
	case *MailboxOwnerTransferred:
		ok = d.decodeFast(s)
	case *OrgOwnerTransferred:
		ok = d.decodeFast(s)
	case *UserActive:
		ok = d.decodeFast(s)
	case *WorkerHeartbeat:
		ok = d.decodeFast(s)
	case *WorkerHealthSampled:
		ok = d.decodeFast(s)
	}
	return ok
}

// scanner reads the plain JSON form; every method reports false on
// anything outside it. strict: decoding at ingest (decodeFastStrict).
type scanner struct {
	b      []byte
	i      int
	strict bool
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips whitespace and consumes c if it comes next.
func (s *scanner) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// rawString returns the bytes of a string without escapes, in valid UTF-8.
func (s *scanner) rawString() ([]byte, bool) {
	if !s.next('"') {
		return nil, false
	}
	start, ascii := s.i, true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			if !ascii && !utf8.Valid(v) {
				return nil, false
			}
			return v, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
		s.i++
	}
	return nil, false
}

func (s *scanner) str(v *string) bool {
	b, ok := s.rawString()
	if ok {
		// A string of its own, as encoding/json makes: one sharing the
		// record's value would keep all of it alive for as long as a
		// consumer keeps the field (say as a map key).
		*v = string(b)
	}
	return ok
}

func (s *scanner) boolean(v *bool) bool {
	s.ws()
	rest := s.b[s.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		*v, s.i = true, s.i+4
	case len(rest) >= 5 && string(rest[:5]) == "false":
		*v, s.i = false, s.i+5
	default:
		return false
	}
	return true
}

// number returns a JSON number literal; integer says it has neither
// fraction nor exponent.
func (s *scanner) number() (lit []byte, integer, ok bool) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case s.i < len(s.b) && '1' <= s.b[s.i] && s.b[s.i] <= '9':
		s.digits()
	default:
		return nil, false, false
	}
	integer = true
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if s.digits() == 0 {
			return nil, false, false
		}
		integer = false
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if s.digits() == 0 {
			return nil, false, false
		}
		integer = false
	}
	return s.b[start:s.i], integer, true
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

// int64 reads an integer as encoding/json does into an int64 (or an int,
// which is 64 bits wide wherever mailplane runs).
func (s *scanner) int64(v *int64) bool {
	lit, integer, ok := s.number()
	if !ok || !integer {
		return false
	}
	n, err := strconv.ParseInt(string(lit), 10, 64)
	if err != nil {
		return false
	}
	*v = n
	return true
}

func (s *scanner) int(v *int) bool {
	if strconv.IntSize != 64 {
		return false
	}
	var n int64
	if !s.int64(&n) {
		return false
	}
	*v = int(n)
	return true
}

func (s *scanner) float64(v *float64) bool {
	lit, _, ok := s.number()
	if !ok {
		return false
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil {
		return false
	}
	if s.strict {
		// strictShape would rewrite it (see unroundedFloat).
		if _, rewrite := unroundedFloat(string(lit), 64); rewrite {
			return false
		}
	}
	*v = f
	return true
}

// time reads a string as time.Time.UnmarshalJSON does.
func (s *scanner) time(v *time.Time) bool {
	s.ws()
	start := s.i
	str, ok := s.rawString()
	if !ok {
		return false
	}
	if s.strict && !rfc3339Pattern.Match(str) {
		return false // strictShape refuses it, with its own message
	}
	return v.UnmarshalJSON(s.b[start:s.i]) == nil
}

// object reads an object whose members member reads; member reports false
// for a name it does not know (or any other trouble). Each name may come
// once: member keeps a bit per name it knows (see once).
func (s *scanner) object(member func(name []byte) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	for {
		name, ok := s.rawString()
		if !ok || !s.next(':') {
			return false
		}
		if !member(name) {
			return false
		}
		if s.next(',') {
			continue
		}
		return s.next('}')
	}
}

// skipObject returns the bytes of the object at the scanner's position,
// found by its braces and strings alone: whether they are well-formed is
// for whoever decodes them (which must then consume all of them).
func (s *scanner) skipObject() ([]byte, bool) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return nil, false
	}
	start, depth := s.i, 0
	for ; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '"':
			for s.i++; s.i < len(s.b) && s.b[s.i] != '"'; s.i++ {
				if s.b[s.i] == '\\' {
					s.i++
				}
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				s.i++
				return s.b[start:s.i], true
			}
		}
	}
	return nil, false
}

// once marks bit as seen, reporting false if it was already.
func once(seen *uint32, bit uint32) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

func (m *MailboxAdded) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "mailbox_id":
			return once(&seen, 1<<0) && s.str(&m.MailboxID)
		case "org_id":
			return once(&seen, 1<<1) && s.str(&m.OrgID)
		case "user_id":
			return once(&seen, 1<<2) && s.str(&m.UserID)
		case "address":
			return once(&seen, 1<<3) && s.str(&m.Address)
		case "provider":
			return once(&seen, 1<<4) && s.str((*string)(&m.Provider))
		case "warmup_enabled":
			return once(&seen, 1<<5) && s.boolean(&m.WarmupEnabled)
		case "imap":
			return once(&seen, 1<<6) && m.IMAP.decodeFast(s)
		case "sealed_credentials":
			if !once(&seen, 1<<7) {
				return false
			}
			m.SealedCredentials = new(SealedSecret)
			return m.SealedCredentials.decodeFast(s)
		case "credentials":
			// Plain credentials come from producers only, at ingest
			// (strict); on the log they are a fault that encoding/json
			// decodes and Validate reports.
			if !s.strict || !once(&seen, 1<<8) {
				return false
			}
			m.Credentials = new(Credentials)
			return m.Credentials.decodeFast(s)
		}
		return false
	})
}

func (c *Credentials) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "password":
			return once(&seen, 1<<0) && s.str(&c.Password)
		case "oauth_refresh_token":
			return once(&seen, 1<<1) && s.str(&c.OAuthRefreshToken)
		}
		return false
	})
}

func (e *IMAPEndpoint) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "host":
			return once(&seen, 1<<0) && s.str(&e.Host)
		case "port":
			return once(&seen, 1<<1) && s.int(&e.Port)
		case "tls":
			return once(&seen, 1<<2) && s.str((*string)(&e.TLS))
		case "username":
			return once(&seen, 1<<3) && s.str(&e.Username)
		}
		return false
	})
}

func (c *SealedSecret) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "key_id":
			return once(&seen, 1<<0) && s.str(&c.KeyID)
		case "alg":
			return once(&seen, 1<<1) && s.str(&c.Alg)
		case "nonce":
			return once(&seen, 1<<2) && s.str(&c.Nonce)
		case "ciphertext":
			return once(&seen, 1<<3) && s.str(&c.Ciphertext)
		}
		return false
	})
}

func (m *MailboxRemoved) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "mailbox_id":
			return once(&seen, 1<<0) && s.str(&m.MailboxID)
		case "reason":
			return once(&seen, 1<<1) && s.str(&m.Reason)
		}
		return false
	})
}

func (m *MailboxHealthScored) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "mailbox_id":
			return once(&seen, 1<<0) && s.str(&m.MailboxID)
		case "state":
			return once(&seen, 1<<1) && s.str((*string)(&m.State))
		case "score":
			return once(&seen, 1<<2) && s.float64(&m.Score)
		case "reason":
			return once(&seen, 1<<3) && s.str(&m.Reason)
		case "until":
			if !once(&seen, 1<<4) {
				return false
			}
			m.Until = new(time.Time)
			return s.time(m.Until)
		case "evidence":
			if !once(&seen, 1<<5) {
				return false
			}
			m.Evidence = new(HealthEvidence)
			return m.Evidence.decodeFast(s)
		}
		return false
	})
}

func (e *HealthEvidence) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "window_seconds":
			return once(&seen, 1<<0) && s.int64(&e.WindowSeconds)
		case "window_end":
			if !once(&seen, 1<<1) {
				return false
			}
			e.WindowEnd = new(time.Time)
			return s.time(e.WindowEnd)
		case "inbox":
			return once(&seen, 1<<2) && s.int64(&e.Inbox)
		case "junk":
			return once(&seen, 1<<3) && s.int64(&e.Junk)
		case "min_observations":
			return once(&seen, 1<<4) && s.int64(&e.MinObservations)
		case "rate":
			return once(&seen, 1<<5) && s.float64(&e.Rate)
		case "rule":
			return once(&seen, 1<<6) && s.str((*string)(&e.Rule))
		case "threshold":
			if !once(&seen, 1<<7) {
				return false
			}
			e.Threshold = new(HealthThreshold)
			return e.Threshold.decodeFast(s)
		case "penalty_seconds":
			return once(&seen, 1<<8) && s.int64(&e.PenaltySeconds)
		}
		return false
	})
}

func (t *HealthThreshold) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "rate":
			return once(&seen, 1<<0) && s.float64(&t.Rate)
		case "state":
			return once(&seen, 1<<1) && s.str((*string)(&t.State))
		}
		return false
	})
}

func (m *MailboxDisabled) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "mailbox_id":
			return once(&seen, 1<<0) && s.str(&m.MailboxID)
		case "cause":
			return once(&seen, 1<<1) && s.str((*string)(&m.Cause))
		case "reason":
			return once(&seen, 1<<2) && s.str(&m.Reason)
		case "failing_since":
			if !once(&seen, 1<<3) {
				return false
			}
			m.FailingSince = new(time.Time)
			return s.time(m.FailingSince)
		}
		return false
	})
}

func (c *CredentialsRotated) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "mailbox_id":
			return once(&seen, 1<<0) && s.str(&c.MailboxID)
		case "cause":
			return once(&seen, 1<<1) && s.str((*string)(&c.Cause))
		case "sealed_credentials":
			if !once(&seen, 1<<2) {
				return false
			}
			c.SealedCredentials = new(SealedSecret)
			return c.SealedCredentials.decodeFast(s)
		case "added_at":
			return once(&seen, 1<<3) && s.time(&c.AddedAt)
		}
		return false
	})
}

func (w *WarmupObserved) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "mailbox_id":
			return once(&seen, 1<<0) && s.str(&w.MailboxID)
		case "warmup_id":
			return once(&seen, 1<<1) && s.str(&w.WarmupID)
		case "placement":
			return once(&seen, 1<<2) && s.str((*string)(&w.Placement))
		case "landed_at":
			return once(&seen, 1<<3) && s.time(&w.LandedAt)
		case "source":
			return once(&seen, 1<<4) && s.str((*string)(&w.Source))
		case "recipient_mailbox_id":
			return once(&seen, 1<<5) && s.str(&w.RecipientMailboxID)
		}
		return false
	})
}

func (o *OrgPlanChanged) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "org_id":
			return once(&seen, 1<<0) && s.str(&o.OrgID)
		case "plan":
			return once(&seen, 1<<1) && s.str((*string)(&o.Plan))
		case "dedicated_workers":
			return once(&seen, 1<<2) && s.int(&o.DedicatedWorkers)
		case "paid":
			return once(&seen, 1<<3) && s.boolean(&o.Paid)
		case "source":
			return once(&seen, 1<<4) && s.str(&o.Source)
		}
		return false
	})
}

func (m *MailboxOwnerTransferred) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "mailbox_id":
			return once(&seen, 1<<0) && s.str(&m.MailboxID)
		case "owner":
			return once(&seen, 1<<1) && s.str(&m.Owner)
		case "comment":
			return once(&seen, 1<<2) && s.str(&m.Comment)
		}
		return false
	})
}

func (o *OrgOwnerTransferred) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "org_id":
			return once(&seen, 1<<0) && s.str(&o.OrgID)
		case "owner":
			return once(&seen, 1<<1) && s.str(&o.Owner)
		case "comment":
			return once(&seen, 1<<2) && s.str(&o.Comment)
		}
		return false
	})
}

func (u *UserActive) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "user_id":
			return once(&seen, 1<<0) && s.str(&u.UserID)
		case "source":
			return once(&seen, 1<<1) && s.str((*string)(&u.Source))
		}
		return false
	})
}

func (w *WorkerHeartbeat) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "worker_id":
			return once(&seen, 1<<0) && s.str(&w.WorkerID)
		case "tier":
			return once(&seen, 1<<1) && s.str((*string)(&w.Tier))
		case "egress":
			return once(&seen, 1<<2) && s.str((*string)(&w.Egress))
		case "address":
			return once(&seen, 1<<3) && s.str(&w.Address)
		case "stopping":
			return once(&seen, 1<<4) && s.boolean(&w.Stopping)
		}
		return false
	})
}

func (w *WorkerHealthSampled) decodeFast(s *scanner) bool {
	var seen uint32
	return s.object(func(name []byte) bool {
		switch string(name) { // no allocation
		case "worker_id":
			return once(&seen, 1<<0) && s.str(&w.WorkerID)
		case "window_seconds":
			return once(&seen, 1<<1) && s.int64(&w.WindowSeconds)
		case "sends":
			return once(&seen, 1<<2) && s.int64(&w.Sends)
		case "hard_bounces":
			return once(&seen, 1<<3) && s.int64(&w.HardBounces)
		case "complaints":
			return once(&seen, 1<<4) && s.int64(&w.Complaints)
		}
		return false
	})
}
