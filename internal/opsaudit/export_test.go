package opsaudit

import "time"

// SetTimeout shortens a recorder's write timeout for a test.
func SetTimeout(r *Recorder, d time.Duration) { r.timeout = d }
