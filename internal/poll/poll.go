// Package poll waits in tests for what happens in the background: a sync
// run, a server that resumes, a failover. It polls instead of sleeping a
// fixed time, so tests are quick on a fast machine and still pass on a
// loaded one.
package poll

import (
	"testing"
	"time"
)

// Interval is how often Until and For check their condition.
const Interval = 20 * time.Millisecond

// Until checks cond until it holds, and fails the test if it still does
// not after timeout; what names the awaited state in the failure.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !For(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// For checks cond until it holds or timeout has passed, and reports
// whether it held, for a test that says itself what it waited for.
func For(timeout time.Duration, cond func() bool) bool {
	return ForEvery(timeout, Interval, cond)
}

// ForEvery is For checking cond every interval, for a check that must not
// run often: a request that counts against a limit, say.
func ForEvery(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}
