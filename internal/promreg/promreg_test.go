package promreg_test

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/promreg"
)

func TestSecondRegistrationSharesTheSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "mailplane_test_total", Help: "test"}
	a := promreg.MustRegister(reg, prometheus.NewCounter(opts))
	b := promreg.MustRegister(reg, prometheus.NewCounter(opts))
	b.Inc()
	if a != b {
		t.Fatal("the second registration got its own collector")
	}
	// Another kind of collector under the same name is an error.
	if _, err := promreg.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "mailplane_test_total", Help: "other"})); err == nil {
		t.Fatal("a gauge under a counter's name was accepted")
	}
}

func ExampleMustRegister() {
	reg := prometheus.NewRegistry()
	newCounter := func() prometheus.Counter {
		return promreg.MustRegister(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "mailplane_example_total", Help: "example"}))
	}
	first, second := newCounter(), newCounter()
	first.Inc()
	second.Inc()
	mfs, _ := reg.Gather()
	fmt.Println(len(mfs), mfs[0].GetMetric()[0].GetCounter().GetValue())
	// Output: 1 2
}

func TestLenientSkipsWhatIsRegistered(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "mailplane_lenient_total", Help: "test"}
	l := promreg.Lenient(reg)
	l.MustRegister(prometheus.NewCounter(opts))
	l.MustRegister(prometheus.NewCounter(opts)) // no panic
	defer func() {
		if recover() == nil {
			t.Fatal("a gauge under a counter's name did not panic")
		}
	}()
	l.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "mailplane_lenient_total", Help: "other"}))
}
