package outbox

// WithBeforeProduce runs f between reading a batch and producing it.
func WithBeforeProduce(f func()) Option { return func(r *Relay) { r.beforeProduce = f } }
