// Package poll waits in tests for what happens in the background: a sync
// run, a server that resumes, a failover. It polls instead of sleeping a
// fixed time, so tests are quick on a fast machine and still pass on a
// loaded one.
package poll

import (
	"testing"
	"time"
)

// Interval is how often Until checks its condition.
const Interval = 20 * time.Millisecond

// Until checks cond until it holds, and fails the test if it still does
// not after timeout; what names the awaited state in the failure.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(Interval)
	}
}
