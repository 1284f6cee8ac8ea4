package placement

import (
	"reflect"
	"testing"

	"github.com/mailplane/mailplane/domain"
)

// The default policy is today's decider settings, exactly.
func TestConfigFromDefaultPolicyIsDefaultConfig(t *testing.T) {
	got, want := ConfigFromPolicy(domain.DefaultPolicy()), DefaultConfig()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ConfigFromPolicy(DefaultPolicy()) = %+v, want DefaultConfig() %+v", got, want)
	}
	if want.LivenessWindow != domain.DefaultLivenessWindow {
		t.Fatalf("default liveness window %s, policy's %s", want.LivenessWindow, domain.DefaultLivenessWindow)
	}
}

// Every rule of a policy reaches the settings (none is dropped or left to
// its default).
func TestConfigFromPolicyCarriesEveryRule(t *testing.T) {
	p := domain.DefaultPolicy()
	r := &p.PlacementRules
	r.BandDwell *= 2
	r.LivenessWindow *= 2
	r.WorkerHealthMinSends++
	r.WorkerRetention *= 2
	r.MaxForgetPerTick++
	r.ComplaintPPM[3]++
	r.HardBouncePPM[0]++
	r.LivenessHoldPermille++
	r.LivenessHoldMinWorkers++
	r.LivenessHoldMax *= 2
	r.TierDwell *= 2
	c, d := ConfigFromPolicy(p), DefaultConfig()
	cv, dv := reflect.ValueOf(c), reflect.ValueOf(d)
	for i := range cv.NumField() {
		name := cv.Type().Field(i).Name
		same := reflect.DeepEqual(cv.Field(i).Interface(), dv.Field(i).Interface())
		if name == "HeartbeatInterval" {
			if !same {
				t.Errorf("HeartbeatInterval %v: not a rule, must keep its default", cv.Field(i))
			}
			continue
		}
		if same {
			t.Errorf("Config.%s: the policy's change did not reach it", name)
		}
	}
}

// A zero hold bound or tier dwell in a policy is none, not the default.
func TestConfigFromPolicyZeroIsNone(t *testing.T) {
	p := domain.DefaultPolicy()
	p.PlacementRules.LivenessHoldMax, p.PlacementRules.TierDwell = 0, 0
	if c := ConfigFromPolicy(p); c.LivenessHoldMax >= 0 || c.TierDwell >= 0 {
		t.Fatalf("hold max %s, tier dwell %s: want none (negative)", c.LivenessHoldMax, c.TierDwell)
	}
}
