package syncapp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
)

// syncRuns returns how many sync runs the namespaces named name have made
// in this process, failed or not: the count of their
// sync_duration_seconds, which every run adds to when it ends.
func syncRuns(t *testing.T, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	return max(0, gathered(t, reg, `caddy_rate_limit_sync_duration_seconds_count{namespace="`+name+`"}`))
}

// awaitRuns waits until the namespaces named name have made n more sync
// runs than when it was called: with n of 2 or more, at least one of them
// ran from start to end after the call.
func awaitRuns(t *testing.T, name string, n int) {
	t.Helper()
	before := syncRuns(t, name)
	poll.Until(t, 30*time.Second, fmt.Sprintf("%d more sync runs of namespace %s", n, name), func() bool {
		return syncRuns(t, name) >= before+float64(n)
	})
}

// failedRuns returns the sync runs of ns that failed in a row since its
// store last answered.
func failedRuns(ns *Namespace) int {
	ns.health.mu.Lock()
	defer ns.health.mu.Unlock()
	return ns.health.runFailures
}

// awaitFailedRuns waits until each node has had n sync runs fail in a row,
// calling during at every check meanwhile (a test's hits going on): by
// then each node has found its store gone and gone on without it.
func awaitFailedRuns(t *testing.T, n int, during func(), nodes ...*Namespace) {
	t.Helper()
	poll.Until(t, 30*time.Second, fmt.Sprintf("%d failed sync runs of each node", n), func() bool {
		during()
		for _, ns := range nodes {
			if failedRuns(ns) < n {
				return false
			}
		}
		return true
	})
}

// moreRuns has each node run two more syncs, by the loops that run them
// every sync interval and by the test itself: for a test that checks that
// more runs push nothing twice.
func moreRuns(t *testing.T, nodes ...*Namespace) {
	t.Helper()
	for range 2 {
		for _, ns := range nodes {
			if err := ns.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	awaitRuns(t, nodes[0].name, 2*len(nodes))
}
