// Package promreg registers Prometheus collectors on an injected registry
// the way every mailplane component does: a second component on the same
// registry (two projectors, two sync workers, two engines in one process)
// gets the collector already registered under the same description and
// shares its series, instead of failing.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg, or returns the collector of the same
// description already registered there. Any other refusal (a different
// collector under the same name: a programming error) is returned.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, err
	}
	return c, nil
}

// MustRegister is Register for metrics defined in code, where a refusal can
// only be a programming error: it panics on one.
func MustRegister[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	c, err := Register(reg, c)
	if err != nil {
		panic(err)
	}
	return c
}

// Lenient returns reg with a MustRegister that skips collectors already
// registered, for code that registers its own collectors with MustRegister
// and cannot be handed the existing ones (franz-go's kprom, a second client
// or component of the same name in one process): the second goes
// unmeasured rather than panicking the process. Other refusals still panic.
func Lenient(reg prometheus.Registerer) prometheus.Registerer { return lenient{reg} }

type lenient struct{ prometheus.Registerer }

func (l lenient) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := l.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err)
			}
		}
	}
}
