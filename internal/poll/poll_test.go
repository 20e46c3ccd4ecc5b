package poll

import (
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	Until(t, time.Minute, "the third call", func() bool {
		calls++
		return calls == 3
	})
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3", calls)
	}
}

// recorder is a testing.TB that records a Fatalf instead of ending the
// test, so that a failing Until can be observed.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	panic(r)
}

func TestUntilFailsAfterTheTimeout(t *testing.T) {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != any(r) {
				panic(p)
			}
		}()
		Until(r, 50*time.Millisecond, "never", func() bool { return false })
	}()
	if r.failed == "" {
		t.Fatal("Until returned although the condition never held")
	}
}
