package ratelimit

import "github.com/prometheus/client_golang/prometheus"

// outcome is what the handler decided for a request. requests_total
// counts requests by it, in its outcome label.
type outcome uint8

const (
	allowed             outcome = iota // the limits admitted it at once
	delayed                            // the limits admitted it after it waited (max_delay)
	rejected                           // a limit rejected it
	dryRunRejected                     // a limit would have rejected it, and dry_run let it through
	banned                             // its key is banned (ban)
	concurrencyRejected                // the limits admitted it, max_concurrent did not
	clientGone                         // its client went away while it waited: not counted
	invalidLimit                       // its placeholders gave no limit (tiers.go): 500
	storeUnreachable                   // on_store_failure deny rejected it while the store was away
	numOutcomes
)

// admitted says whether the limits let the request through, which takes
// it a place under max_concurrent. A request dry_run lets through past a
// limit takes none.
func (o outcome) admitted() bool { return o == allowed || o == delayed }

// outcomeLabels are the values of requests_total's outcome label (its
// Help lists them); an outcome with none is not counted.
var outcomeLabels = [numOutcomes]string{
	allowed:             "allowed",
	delayed:             "delayed",
	rejected:            "rejected",
	dryRunRejected:      "dry_run",
	banned:              "banned",
	concurrencyRejected: "concurrency_rejected",
	invalidLimit:        "invalid_limit",
	storeUnreachable:    "store_unreachable",
}

// outcomeCounters are a namespace's counters of each outcome, looked up
// once at provision rather than per request.
type outcomeCounters [numOutcomes]prometheus.Counter

// newOutcomeCounters looks up the counters of a namespace; metrics must be
// registered.
func newOutcomeCounters(namespace string) outcomeCounters {
	var c outcomeCounters
	for o, label := range outcomeLabels {
		if label != "" {
			c[o] = metrics.requests.WithLabelValues(namespace, label)
		}
	}
	return c
}

// record counts a request's outcome.
func (c *outcomeCounters) record(o outcome) {
	if m := c[o]; m != nil {
		m.Inc()
	}
}
