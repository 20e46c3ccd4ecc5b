package ratelimit

import "testing"

// TestOutcomeLabels checks that every outcome but clientGone has a label
// of requests_total of its own.
func TestOutcomeLabels(t *testing.T) {
	seen := map[string]outcome{}
	for o := range numOutcomes {
		label := outcomeLabels[o]
		if (label == "") != (o == clientGone) {
			t.Errorf("outcome %d: label %q", o, label)
		}
		if other, ok := seen[label]; ok && label != "" {
			t.Errorf("outcomes %d and %d share the label %q", other, o, label)
		}
		seen[label] = o
	}
}
